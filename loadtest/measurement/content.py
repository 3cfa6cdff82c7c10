"""Is a measured output text, or a model stuck in a loop, or noise? The one content check every measurement uses.

A drafter predicts a repetition loop almost perfectly, so a target that degenerates into one
makes speculation look fast: more tokens per step, more tokens per second, from output nobody
wants. Every request the kit measures (Locust, vLLM's benchmark beside it, bench-drafters,
advise, tune, distill) is therefore judged from its output tokens:

  distinct_4   distinct 4-grams / 4-grams of the output (1.0: no 4-gram repeats; held-out
               Python a little below, the less the longer: docs/results.md, R20)
  loop_share   share of the output inside a verbatim cycle: a span at least `MIN_LOOP_SPAN`
               tokens long that repeats a period of 1 to `MAX_PERIOD` tokens at least twice
               (`#\\n\\n#\\n\\n#...` to the end of the output has a loop share near 1)

A request is degenerate when `loop_share >= DEGENERATE_LOOP_SHARE`, or when its distinct
4-grams fall below `DISTINCT_FLOOR` of the reference's (text of the same length: the workload's
own prompts where they are long enough, the held-out corpus for the embedded pair), or below
`ABSOLUTE_DISTINCT_FLOOR` where there is no reference.

Noise is the other way to fail: a weak model sampled at temperature 1 writes text more varied
than code (distinct 4-grams near 1.0), which the loop test passes. So, from the output's text:

  known_words  share of the word parts of its identifier-like words (`read_config` -> read,
               config; `HTTPError` -> http, error; parts of 3 letters or more) that occur in the
               prompt or in the reference vocabulary: English (the `english-words` package's web2
               list) and the identifiers of the Python standard library's training split

A request is noise when it has at least `NOISE_MIN_WORDS` such parts and `known_words <
NOISE_FLOOR`. Real held-out continuations score above the floor, the old embedded target's T=1
outputs (`tests/fixtures/embedded_pair_e987624_heldout.json`: `stectation`, `acplatimick`,
`fmlobdend`) below it (docs/results.md, R36). A level's summary gives the share of degenerate
requests and of noise, and acceptance and per-request speed over the content-valid ones (neither).
"""

from __future__ import annotations

import functools
import hashlib
import re
import statistics
from collections.abc import Sequence
from typing import Any

from loadtest.files import write_atomic
from loadtest.measurement.figures import ContentReference, ContentSummary

NGRAM = 4
MAX_PERIOD = 32
MIN_LOOP_SPAN = 12
DEGENERATE_LOOP_SHARE = 0.5
DISTINCT_FLOOR = 0.5
"""A request whose distinct 4-grams are below half the reference's is degenerate."""
ABSOLUTE_DISTINCT_FLOOR = 0.4
"""... or below this, where there is no reference text."""
REFERENCE_TOLERANCE = 0.2
"""A level's mean distinct 4-grams within 20% of the reference's counts as content like it."""
MOSTLY = 0.5
"""A verdict whose requests are degenerate this often or more rests mostly on degenerate output."""
REFERENCE_WINDOWS = 64
NOISE_FLOOR = 0.8
"""A request whose known-word share is below this is noise (the floor lies between real code and noise:
docs/results.md, R36)."""
NOISE_MIN_WORDS = 8
"""Fewer word parts than this: too little text to judge."""
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")


def distinct_ngrams(tokens: Sequence[int], n: int = NGRAM) -> float | None:
    """Distinct n-grams / n-grams (None: fewer than n tokens)."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else None


def loop_share(tokens: Sequence[int], max_period: int = MAX_PERIOD, min_span: int = MIN_LOOP_SPAN) -> float:
    """Share of `tokens` inside a span that repeats a period of <= max_period tokens at least twice
    and is at least min_span long."""
    n = len(tokens)
    if n < min_span:
        return 0.0
    inside = bytearray(n)
    for period in range(1, min(max_period, n // 2) + 1):
        run = 0  # tokens so far equal to the token `period` before them
        for i in range(period, n + 1):
            if i < n and tokens[i] == tokens[i - period]:
                run += 1
                continue
            span = run + period  # tokens [i - span, i) repeat with this period
            if run and span >= max(2 * period, min_span):
                inside[i - span:i] = b"\x01" * span
            run = 0
    return sum(inside) / n


def word_parts(text: str) -> list[str]:
    """The lower-cased parts (3 letters or more) of the identifier-like words of `text`."""
    return [part.lower() for word in _IDENTIFIER.findall(text) for part in _PART.findall(word) if len(part) >= 3]


@functools.lru_cache(maxsize=1)
def reference_vocabulary() -> frozenset[str]:
    """English words and the word parts of the standard library's training split (never its held-out files)."""
    import builtins
    import keyword

    from english_words import get_english_words_set

    words = set(get_english_words_set(["web2"], lower=True))
    words.update(w.lower() for w in (*keyword.kwlist, *dir(builtins)))
    words.update(_stdlib_word_parts())
    return frozenset(words)


def _stdlib_word_parts() -> list[str]:
    """The word parts of the standard library's training split, kept in the cache folder under a key of
    its files' names and sizes: reading every file is most of a Locust process's start, and every
    load-test run starts one or more. An unwritable cache folder only costs the reading."""
    from models.cache import cache_root
    from models.corpus import read, stdlib_split

    files = stdlib_split()["train"]
    key = hashlib.sha1("\n".join(f"{p}:{p.stat().st_size}" for p in files).encode()).hexdigest()[:16]
    kept = cache_root() / "vocabulary" / f"stdlib-word-parts-{key}.txt"
    try:
        return kept.read_text(encoding="utf-8").split()
    except OSError:
        pass
    parts = sorted({part for path in files for part in word_parts(read(path))})
    try:  # atomic: Locust's processes start together and may all get here
        write_atomic(kept, "\n".join(parts))
    except OSError:
        pass
    return parts


_SUFFIXES = (("ies", "y"), ("ied", "y"), ("ing", ""), ("ing", "e"), ("ed", ""), ("ed", "e"), ("es", ""), ("s", ""),
             ("ly", ""), ("er", ""), ("er", "e"), ("est", ""), ("ness", ""), ("ment", ""), ("ful", ""), ("al", ""))
"""Inflections and common suffixes: the word list holds `battery`, `harness` and `mind`, not
`batteries`, `harnessing` or `minds`, which real English (and a real model's answers) are full of."""


def is_known(part: str, vocabulary: frozenset[str]) -> bool:
    """Whether a word part is in the vocabulary, as it is or without an inflection (`minds`,
    `harnessing`, `batteries`, `running`)."""
    if part in vocabulary:
        return True
    for suffix, replacement in _SUFFIXES:
        if part.endswith(suffix) and len(part) - len(suffix) >= 3:
            stem = part[:-len(suffix)]
            if stem + replacement in vocabulary or (stem[-1:] == stem[-2:-1] and stem[:-1] in vocabulary):
                return True
    return False


def known_words(text: str, prompt: str = "") -> tuple[float | None, int]:
    """(share of `text`'s word parts found in `prompt` or the reference vocabulary, as they are or
    inflected, and how many parts)."""
    parts = word_parts(text)
    if not parts:
        return None, 0
    own, vocabulary = set(word_parts(prompt)), reference_vocabulary()
    return sum(1 for p in parts if p in own or is_known(p, vocabulary)) / len(parts), len(parts)


def figures(tokens: Sequence[int], prompt_tokens: Sequence[int] | None = None, text: str | None = None,
            prompt_text: str | None = None) -> dict[str, Any]:
    """One output's figures; with its prompt, the prompt's own distinct 4-grams over the output's
    length (its last tokens), a reference of the same length where the prompt is long enough;
    with its text, the share of known words (the noise test)."""
    out: dict[str, Any] = {"tokens": len(tokens), "distinct_4": _round(distinct_ngrams(tokens)),
                           "loop_share": round(loop_share(tokens), 4)}
    if prompt_tokens is not None and len(tokens) >= NGRAM and len(prompt_tokens) >= len(tokens):
        out["prompt_distinct_4"] = _round(distinct_ngrams(prompt_tokens[-len(tokens):]))
    if text is not None:
        share, parts = known_words(text, prompt_text or "")
        out.update({"known_words": _round(share), "words": parts})
    return out


def is_degenerate(fig: dict[str, Any], reference: float | None = None) -> bool:
    distinct = fig.get("distinct_4")
    floor = DISTINCT_FLOOR * reference if reference else ABSOLUTE_DISTINCT_FLOOR
    return fig.get("loop_share", 0.0) >= DEGENERATE_LOOP_SHARE or (distinct is not None and distinct < floor)


def is_noise(fig: dict[str, Any]) -> bool:
    """Too many made-up words to be text (judged only with `NOISE_MIN_WORDS` word parts or more)."""
    share = fig.get("known_words")
    return share is not None and (fig.get("words") or 0) >= NOISE_MIN_WORDS and share < NOISE_FLOOR


def reference_from_stream(stream: Sequence[int], length: int, windows: int = REFERENCE_WINDOWS) -> float | None:
    """Mean distinct 4-grams of `windows` windows of `length` tokens spread evenly over `stream`."""
    if length < NGRAM or len(stream) < length:
        return None
    last = len(stream) - length
    starts = sorted({round(last * w / max(1, windows - 1)) for w in range(windows)})
    return statistics.fmean(distinct_ngrams(stream[s:s + length]) or 0.0 for s in starts)


@functools.lru_cache(maxsize=8)
def embedded_reference(length: int) -> float | None:
    """Mean distinct 4-grams of the embedded pair's held-out code in windows of `length` tokens."""
    from models.embedded_pair import heldout_tokens

    return reference_from_stream(heldout_tokens(), length)


def reference_for(figs: Sequence[dict[str, Any]], embedded: bool = False) -> ContentReference | None:
    """The reference a level's outputs are held against: its prompts' own text when at least half
    the outputs had a prompt as long as they are, else the embedded pair's held-out corpus."""
    prompt = [f["prompt_distinct_4"] for f in figs if f.get("prompt_distinct_4") is not None]
    if figs and len(prompt) >= len(figs) / 2:
        return ContentReference(round(statistics.fmean(prompt), 4), "the workload's prompts")
    lengths = [f["tokens"] for f in figs if f.get("tokens")]
    if embedded and lengths:
        value = embedded_reference(int(statistics.median(lengths)))
        if value is not None:
            return ContentReference(round(value, 4), "the embedded pair's held-out code")
    return None


def summarize(figs: Sequence[dict[str, Any] | None], reference: ContentReference | None = None,
              spec: Sequence[dict[str, Any] | None] | None = None,
              speeds: Sequence[float | None] | None = None) -> ContentSummary:
    """A level's content: `figs` one per request (None: not checked), with the server's per-request
    speculation figures (`spec`) and each request's output tokens/s (`speeds`) in the same order,
    so acceptance and speed can be read over the content-valid requests alone."""
    ref = reference.distinct_4 if reference else None
    checked = [i for i, f in enumerate(figs) if f and f.get("tokens")]
    out = ContentSummary(checked=len(checked), reference=reference)
    if not checked:
        return out
    loops = [i for i in checked if is_degenerate(figs[i], ref)]  # type: ignore[arg-type]
    judged = [i for i in checked if figs[i].get("known_words") is not None]  # type: ignore[union-attr]
    noise = [i for i in judged if is_noise(figs[i]) and i not in loops]  # type: ignore[arg-type]
    bad = sorted(set(loops) | set(noise))
    good = sorted(set(checked) - set(bad))
    out.degenerate, out.degenerate_share = len(loops), round(len(loops) / len(checked), 4)
    out.distinct_4 = _mean([figs[i].get("distinct_4") for i in checked])  # type: ignore[union-attr]
    out.loop_share = round(statistics.fmean(figs[i]["loop_share"] for i in checked), 4)  # type: ignore[index]
    if judged:
        out.noise_checked, out.noise, out.noise_share = len(judged), len(noise), round(len(noise) / len(judged), 4)
        out.known_words = round(statistics.fmean(figs[i]["known_words"] for i in judged), 4)  # type: ignore[index]
    _against_reference(out)
    if spec is not None:
        out.acceptance_valid = acceptance([spec[i] for i in good])
        out.acceptance_degenerate = acceptance([spec[i] for i in bad])
    if speeds is not None:
        out.tokens_per_s_valid = _mean([speeds[i] or None for i in good])
        out.tokens_per_s_degenerate = _mean([speeds[i] or None for i in bad])
    return out


def merge(summaries: Sequence[ContentSummary | None]) -> ContentSummary | None:
    """Several runs' summaries (repeats of a level, or a variant's and its baseline's) as one."""
    parts = [x for x in summaries if x and x.checked]
    if not parts:
        return None
    checked = sum(x.checked for x in parts)
    degenerate = sum(x.degenerate or 0 for x in parts)
    out = ContentSummary(checked=checked, degenerate=degenerate, degenerate_share=round(degenerate / checked, 4),
                         reference=next((x.reference for x in parts if x.reference), None))
    out.distinct_4 = _weighted([(x.distinct_4, x.checked) for x in parts])
    out.loop_share = _weighted([(x.loop_share, x.checked) for x in parts])
    judged = [x for x in parts if x.noise_checked]
    if judged:
        n = sum(x.noise_checked or 0 for x in judged)
        noise = sum(x.noise or 0 for x in judged)
        out.noise_checked, out.noise, out.noise_share = n, noise, round(noise / n, 4)
        out.known_words = _weighted([(x.known_words, x.noise_checked or 0) for x in judged])
    out.acceptance_valid = _mean([x.acceptance_valid for x in parts])
    out.acceptance_degenerate = _mean([x.acceptance_degenerate for x in parts])
    _against_reference(out)
    return out


def _weighted(pairs: Sequence[tuple[float | None, int]]) -> float | None:
    known = [(v, n) for v, n in pairs if v is not None]
    return round(sum(v * n for v, n in known) / sum(n for _, n in known), 4) if known else None


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.fmean(known), 4) if known else None


def _against_reference(out: ContentSummary) -> None:
    """Add how a summary's mean distinct 4-grams compare with its reference's, where it has one."""
    ref = out.reference.distinct_4 if out.reference else None
    if ref and out.distinct_4 is not None:
        out.vs_reference = round(out.distinct_4 / ref, 4)
        out.like_reference = abs(out.vs_reference - 1) <= REFERENCE_TOLERANCE


def acceptance(spec: Sequence[dict[str, Any] | None]) -> float | None:
    """Accepted / drafted tokens over requests, from the server's per-request speculation figures."""
    drafted = sum((s or {}).get("num_draft_tokens") or 0 for s in spec)
    accepted = sum((s or {}).get("num_accepted_draft_tokens") or 0 for s in spec)
    return round(accepted / drafted, 4) if drafted else None


def describe(summary: ContentSummary | None) -> str:
    """A level's content in a phrase: 'content valid (distinct 4-grams 0.91, reference 0.88)' or
    '7 of 8 requests degenerate (loops); ...'."""
    if not summary or not summary.checked:
        return "content not checked (the outputs' tokens were not returned)"
    ref = summary.reference
    ref_text = f", {ref.source} {ref.distinct_4:.2f}" if ref else ", no reference text"
    figures_text = f"distinct 4-grams {summary.distinct_4:.2f}{ref_text}; loop share {summary.loop_share:.0%}"
    if summary.known_words is not None:
        figures_text += f"; known words {summary.known_words:.0%}"
    noise, degenerate = summary.noise or 0, summary.degenerate or 0
    if not degenerate and not noise:
        return f"content valid ({figures_text})"
    parts = ([f"{degenerate} of {summary.checked} requests degenerate"] if degenerate else []) \
        + ([f"{noise} of {summary.noise_checked} noise"] if noise else [])
    return f"{', '.join(parts)} ({figures_text})"


def label(summary: ContentSummary | None) -> str:
    """How a warning about `summary` is labelled: NOISE where outputs are noise, else CONTENT."""
    return "NOISE" if summary and summary.noise else "CONTENT"


def mostly(summary: ContentSummary | None) -> str | None:
    """"noise" or "degenerate" when a verdict resting on `summary`'s requests rests mostly on that, else None."""
    if not summary or not summary.checked:
        return None
    if (summary.noise_share or 0.0) >= MOSTLY:
        return "noise"
    return "degenerate" if (summary.degenerate_share or 0.0) >= MOSTLY else None


def warning(summary: ContentSummary | None) -> str | None:
    """What a verdict resting on `summary`'s requests must say first, or None."""
    if not summary or not summary.checked:
        return None
    share = summary.degenerate_share or 0.0
    noise = summary.noise_share or 0.0
    rests_on = mostly(summary)
    if rests_on == "noise":
        return (f"rests mostly on noise: {describe(summary)}; acceptance over the content-valid requests "
                f"{_pct(summary.acceptance_valid)}")
    if rests_on == "degenerate":
        return (f"rests mostly on degenerate output: {describe(summary)}; acceptance over the content-valid "
                f"requests {_pct(summary.acceptance_valid)}, over the degenerate ones "
                f"{_pct(summary.acceptance_degenerate)}")
    if share > 0 or noise > 0:
        what = " or noise" if share and noise else ""
        return (f"{max(share, noise):.0%} of its requests are {'degenerate' if share else 'noise'}{what} "
                f"({describe(summary)})")
    if summary.like_reference is False and summary.reference:
        return (f"its output differs from the reference text (distinct 4-grams {summary.distinct_4:.2f} against "
                f"{summary.reference.distinct_4:.2f})")
    return None


def _pct(value: float | None) -> str:
    return "not known" if value is None else f"{value:.0%}"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
