"""What a sweep's report says first: a lead line where the run is not a complete measurement, one
verdict line per batch size (or arrival rate) and variant, short badges for what to check, the
setup in a paragraph; every finding in full (`headline`, `rate_headline`: the report's findings
and the top of the terminal's table); and the exit status that matches those words (`exit_code`).

Headlines come only from what was measured: a level without its baseline gets no verdict, an
interrupted or failed sweep says so before anything else, and a sweep of one run per level says
up front that it cannot give an interval.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from loadtest.measurement import content
from loadtest.measurement import stats
from loadtest.traffic import declared as traffic
from loadtest.measurement import second_opinion
from loadtest.measurement.derive import (SPEEDUPS, VALID_SPEEDUP, content_warnings, costs, derive_rates, rate_levels,
                                         slo_lines, summarize_speedups, verdict_rule)
from loadtest.measurement.derived import RateRow, SpeedupSummary
from loadtest.measurement.figures import ContentSummary, FigureAgreement, Interval
from loadtest.measurement.records import SENT_OUTCOMES
from loadtest.measurement.results import SweepResults
from loadtest.reports.markdown import figure, interval_text
from loadtest.reports.page import Badge, Line

# ---------------------------------------------------------------------------------- exit status
OK = 0
"""Every level was measured; flags (clients disagreeing, a load generator that lagged, output that
is no text) are in the report and its badges, not in the exit status."""
USAGE = 2
"""Bad input, or nothing could be measured at all (no server started)."""
INCOMPLETE = 3
"""A measurement could not be made: a level or a variant failed (a server did not start or died, a
run broke off), so some verdict is missing."""
UNTRUSTED = 4
"""Every level ran, but a run's client token count disagrees with the server's own counter beyond
the tolerance: by the kit's rule its figures cannot be trusted."""
INTERRUPTED = 130
"""Ctrl-C (or SIGTERM/SIGHUP): servers stopped, what was measured kept and reported."""

EXIT_CODES = {OK: "every level measured (flags, if any, in the report)", USAGE: "bad input or nothing measured",
              INCOMPLETE: "a level or variant could not be measured", UNTRUSTED:
              "a run's token count disagrees with the server's counter (not to be trusted)",
              INTERRUPTED: "interrupted (partial report written)"}


def exit_code(results: SweepResults) -> int:
    """The exit status of `python -m loadtest run` for these results (see the constants above)."""
    if results.status == "interrupted":
        return INTERRUPTED
    variants = results.variants
    if not variants:
        return USAGE
    if any(v.status in ("failed", "skipped") for v in variants) or any(
            lv.status in ("failed", "skipped") for _, lv in results.levels()):
        return INCOMPLETE
    if any(lv.consistency and lv.consistency.ok is False for _, lv in results.levels()):
        return UNTRUSTED
    return OK


# ---------------------------------------------------------------------------------- the lead
def lead(results: SweepResults) -> str:
    """One sentence when the run is not a complete measurement (or cannot give intervals); empty otherwise."""
    variants = results.variants
    measured = [(v, lv) for v, lv in results.levels() if lv.ok_client]
    planned = (results.plan or {}).get("planned_runs")
    names = (results.plan or {}).get("variants") or [v.name for v in variants]
    ran = {v.name for v, _ in measured}
    missing = [n for n in names if n not in ran]
    counted = f"{len(measured)} of {planned} runs measured" if planned else f"{len(measured)} runs measured"
    parts = []
    if results.status == "interrupted":
        parts.append(f"Interrupted after {counted}")
    elif any(v.status in ("failed", "skipped") for v in variants) or any(
            lv.status in ("failed", "skipped") for _, lv in results.levels()):
        failed = sorted({v.name for v, lv in results.levels() if lv.status in ("failed", "skipped")}
                        | {v.name for v in variants if v.status == "failed"})
        parts.append(f"Incomplete: {counted}; failed: {', '.join(failed)}")
        missing = [n for n in missing if n not in failed]
    if parts:
        if missing:
            parts.append(f"not measured: {', '.join(missing)}")
        if "baseline" not in ran or not (ran - {"baseline"}):
            parts.append("no comparison")
        return "; ".join(parts) + "."
    repeat = results.settings.get("repeat", 1)
    if measured and repeat == 1:
        return ("One run per level: no 95% interval can be given, each verdict rests on a single pair of runs "
                "(--repeat 3 gives intervals).")
    return ""


# ---------------------------------------------------------------------------------- every finding

def headline(results: SweepResults) -> list[str]:
    """The report's first lines: output that is no text first (`content_warnings`), then per batch
    size, whether speculation pays and by how much."""
    entries = sorted(summarize_speedups(results), key=lambda e: (e.concurrency, e.variant))
    settings = results.settings
    lines = traffic.describe(settings) if settings.get("workload") else []  # which traffic ran, first
    lines += list(dict.fromkeys(w for e in entries for w in content_warnings(e)))
    lines += best_drafter_findings(results)
    # Grouped sweeps (one server start per variant) pair runs by repeat, not by time.
    grouped = ((results.plan or {}).get("order") == "grouped")
    paired = "each paired with the baseline's run of the same repeat" if grouped else "each beside a baseline run"
    for e in entries:
        parts = [_speedup(m, name) for m, name in zip((e.speedup, e.vllm_bench_speedup, e.measured_speedup),
                                                      SPEEDUPS.values()) if m.mean is not None]
        accept, order, valid = e.acceptance_rate.mean, e.speedup_by_order, e.valid_speedup.mean
        said = f"speculation {e.verdict}: " + "; ".join(parts) + "; " if parts else f"{e.verdict}; "
        lines.append(f"batch {e.concurrency}, {e.variant}: {said}"
                     + (f"acceptance {accept:.0%}" if accept is not None else "")
                     + (f"; {valid:.2f}x {VALID_SPEEDUP}" if valid is not None else "")
                     + f"{'; ' if accept is not None else ''}{content.describe(e.content)}"
                     + (f"; Locust {order['first']:.2f}x in runs before the baseline's, {order['second']:.2f}x "
                        "in runs after it" if order else "")
                     + f" ({_runs(e.runs)}{', ' + paired if parts else ''})")
    return lines + [second_opinion.describe_systematic(e) for e in second_opinion.systematic_by_level(results)] \
        + slo_lines(results)


def _speedup(m: Interval, what: str) -> str:
    """`1.23x <what> (95% interval 1.10-1.31)`: a mean speedup, with its interval where it has one."""
    return f"{m.mean:.2f}x {what}" + (f" (95% interval {m.low:.2f}-{m.high:.2f})" if m.low is not None else "")


def _runs(n: int) -> str:
    return f"{n} run{'s' if n != 1 else ''}"


def rate_headline(results: SweepResults) -> list[str]:
    """Per speculative variant and rate: the speedups a user sees, averaged over the repeats; and
    each run whose generator fell behind its schedule."""
    derived = derive_rates(results)
    lines = [f"rate {row.rate:g}/s, {row.variant} run {row.repeat}: the load generator fell behind (achieved "
             f"{figure(row.achieved_rate, 2)}/s): that run's offered load was lower" for row in derived if row.behind]
    for (variant, rate), rows in by_rate(r for r in derived
                                         if r.tpot_p50_speedup is not None or r.e2e_mean_speedup is not None):
        means = ((mean_of(rows, lambda r: r.tpot_p50_speedup), "per token (TPOT p50)"),
                 (mean_of(rows, lambda r: r.e2e_mean_speedup), "end to end (mean)"))
        parts = [_speedup(m, what) for m, what in means if m.mean is not None]
        lines.append(f"rate {rate:g}/s, {variant}: against the baseline at the same arrivals, " + "; ".join(parts)
                     + f"; {_served(rows)} requests served ({_runs(len(rows))})")
    return lines


def by_rate(rows: Iterable[RateRow]) -> list[tuple[tuple[str, float], list[RateRow]]]:
    """Open-loop rows grouped by (variant, rate), by rate then variant."""
    groups: dict[tuple[str, float], list[RateRow]] = {}
    for r in rows:
        groups.setdefault((r.variant, r.rate), []).append(r)
    return sorted(groups.items(), key=lambda g: (g[0][1], g[0][0]))


def mean_of(rows: list[RateRow], value: Callable[[RateRow], float | None]) -> Interval:
    """A speedup's mean over the runs that have one, and its 95% interval."""
    return stats.mean_interval([v for r in rows if (v := value(r)) is not None])


def _served(rows: list[RateRow]) -> str:
    """`served/total` requests over the runs."""
    return f"{sum(r.outcomes.get(SERVED, 0) for r in rows)}/{sum(sum(r.outcomes.values()) for r in rows)}"


# ---------------------------------------------------------------------------------- verdict lines

def _content_word(summary: ContentSummary | None) -> str:
    if not summary or not summary.checked:
        return "content not checked"
    if summary.degenerate:
        return f"content: {summary.degenerate} of {summary.checked} degenerate"
    if summary.noise:
        return f"content: {summary.noise} of {summary.noise_checked} noise"
    if summary.like_reference is False:
        return "content: unlike the reference text"
    return "content: text"


SERVED = SENT_OUTCOMES[0]  # "served": how many requests a run served

TONE = {"pays": "good", "does not pay": "bad", "breaks even": "even"}


def verdict_word(verdict: str, summary: ContentSummary | None = None) -> tuple[str, str]:
    """(short verdict, tone) of `loadtest.measurement.derive.verdict`'s text, for every first screen (load test, capacity,
    compare). On output that is mostly loops or noise (`content.mostly` of the content `summary`) the
    verdict is uncoloured and says so: a speedup measured on such output is not one for the text people
    want."""
    head = verdict.split(";")[0].split(" (")[0].strip()
    word, tone = (f"speculation {head}" if head in TONE else head), TONE.get(head, "none")
    rests_on = content.mostly(summary)
    if head in TONE and rests_on:
        return f"{word} on {'noise' if rests_on == 'noise' else 'looping output'}", "none"
    return word, tone


def best_by_batch(results: SweepResults) -> list[tuple[int, list[SpeedupSummary]]]:
    """Where a sweep measured several drafters: per batch size, its speculative variants with a
    speedup, best first (by the client's mean speedup over the baseline)."""
    entries = [e for e in summarize_speedups(results) if e.speedup.mean is not None]
    if len({e.variant for e in entries}) < 2:
        return []
    by_batch: dict[int, list[SpeedupSummary]] = {}
    for e in entries:
        by_batch.setdefault(e.concurrency, []).append(e)
    return [(c, sorted(group, key=lambda e: -(e.speedup.mean or 0))) for c, group in sorted(by_batch.items())]


def _best_line(c: int, ranked: list[SpeedupSummary]) -> Line:
    """`batch 1: best drafter: ngram` (it pays), `... ngram breaks even`, `... none pays`; the others after it."""
    best = ranked[0]
    word, tone = verdict_word(best.verdict, best.content)
    name = best.variant
    said = {"good": name, "even": f"{name} breaks even", "bad": "none pays"}.get(tone, f"{name}, {word}")
    return Line(f"batch {c}: best drafter", said,
                f"{name} {interval_text(best.speedup, '95% ')} output tok/s · then {_the_others(ranked)}", tone)


def _the_others(ranked: list[SpeedupSummary]) -> str:
    """`ngram 0.99x, spec-k1 0.85x`: the drafters after the best, with their mean speedups."""
    return ", ".join(f"{e.variant} {e.speedup.mean:.2f}x" for e in ranked[1:])


def best_drafter_findings(results: SweepResults) -> list[str]:
    """The best drafter at each batch size, in words, for the findings."""
    out = []
    for c, ranked in best_by_batch(results):
        best = ranked[0]
        word = verdict_word(best.verdict, best.content)[0]
        out.append(f"batch {c}: best drafter {best.variant}, {interval_text(best.speedup, '95% ')} client output "
                   f"tokens/s over the baseline ({word}); then {_the_others(ranked)}")
    return out


def verdict_lines(results: SweepResults) -> list[Line]:
    """Closed loop: the best drafter per batch size where there are several, then per batch size
    and speculative variant; open loop: per rate and variant."""
    entries = sorted(summarize_speedups(results), key=lambda e: (e.concurrency, e.variant))
    several = len({e.variant for e in entries}) > 1
    lines = [_best_line(c, ranked) for c, ranked in best_by_batch(results)]
    for e in entries:
        level = f"batch {e.concurrency}" + (f", {e.variant}" if several else "")
        accept = e.acceptance_rate.mean
        figures = [] if accept is None else [f"acceptance {accept:.0%}"]
        figures.append(_content_word(e.content))
        if e.speedup.mean is None:
            lines.append(Line(level, "no comparison",
                              " · ".join([f"the baseline was not measured at batch {e.concurrency}", *figures])))
            continue
        word, tone = verdict_word(e.verdict, e.content)
        lines.append(Line(level, word, " · ".join([f"{interval_text(e.speedup, '95% ')} output tok/s", *figures,
                                                   _runs(e.runs)]), tone))
    return lines + _rate_lines(results)


def _rate_lines(results: SweepResults) -> list[Line]:
    rows = [r for r in derive_rates(results) if r.variant != "baseline"]
    several = len({r.variant for r in rows}) > 1
    contents = rate_contents(results)
    lines = []
    for (variant, rate), group in by_rate(rows):
        level = f"{rate:g} req/s" + (f", {variant}" if several else "")
        accepts = [r.acceptance for r in group if r.acceptance is not None]
        figures = [f"acceptance {sum(accepts) / len(accepts):.0%}"] if accepts else []
        merged = contents.get((variant, rate))
        figures += [_content_word(merged), f"{_served(group)} served"]
        per_token = mean_of(group, lambda r: r.tpot_p50_speedup)
        if per_token.mean is None:
            lines.append(Line(level, "no comparison", " · ".join(["the baseline was not measured at this rate", *figures])))
            continue
        e2e = mean_of(group, lambda r: r.e2e_mean_speedup)
        word, tone = verdict_word(verdict_rule(per_token), merged)
        speeds = [f"{interval_text(per_token, '95% ')} per token"] + ([f"{e2e.mean:.2f}x end to end"]
                                                                      if e2e.mean else [])
        lines.append(Line(level, word, " · ".join([*speeds, *figures, _runs(len(group))]), tone))
    return lines


def rate_contents(results: SweepResults) -> dict[tuple[str, float], ContentSummary | None]:
    """Open loop: the content check of each (variant, rate), its runs merged."""
    contents: dict[tuple[str, float], list[ContentSummary | None]] = {}
    for variant, level in rate_levels(results):
        contents.setdefault((variant.name, level.at), []).append(level.client.content if level.client else None)
    return {key: content.merge(parts) for key, parts in contents.items()}


def notes(results: SweepResults) -> list[str]:
    """Findings that are not verdicts: where the service targets were met, and what a million output
    tokens cost where the config names a price per GPU-hour (`cost per million output tokens:
    spec-k5 0.42 at batch 1, ... (GPU-hours this sweep: ...)`)."""
    rows = costs(results)
    per = "; ".join(f"{r.variant} " + ", ".join(f"{v:.2f} at batch {c}" for c, v in r.cost_per_million_tokens.items())
                    for r in rows)
    hours = ", ".join(f"{r.variant} {r.gpu_hours:.2f}" for r in rows)
    priced = [f"cost per million output tokens: {per} (GPU-hours this sweep: {hours})"] if rows else []
    return slo_lines(results) + priced


# ---------------------------------------------------------------------------------- badges
def _short(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[:width - 1].rstrip() + "…"


def badges(results: SweepResults) -> list[Badge]:
    """Each warning in a few words, grouped where the same one concerns several runs."""
    out: list[Badge] = []
    grouped: dict[tuple[str, str, str], list[str]] = {}

    def add(label: str, text: str, target: str, where: str) -> None:
        grouped.setdefault((label, text, target), []).append(where)

    for variant, level in results.levels():
        where = f"{level.load.where} {variant.name} run {level.repeat}"
        if level.status in ("failed", "skipped"):
            out.append(Badge("FAILED", _short(f"{where}: " + "; ".join(level.problems or [level.status])),
                             "trust"))
        figures = level.vllm_bench_agreement.figures() if level.vllm_bench_agreement else {}
        for key, name in second_opinion.JUDGED_NAMES:
            a = figures.get(key) or FigureAgreement()
            if a.agrees is False:
                diff = a.difference_adjusted if a.difference_adjusted is not None else a.difference
                out.append(Badge("FLAG", f"{where}: vLLM bench {name} differs "
                                 + (f"{100 * diff:+.1f}%" if diff is not None else ""), "second-opinion"))
        if level.consistency and level.consistency.ok is False:
            diff = level.consistency.relative_error
            out.append(Badge("UNTRUSTED", f"{where}: client tokens vs server counter"
                             + (f" {100 * diff:.1f}% apart" if diff is not None else ""), "trust"))
        if level.open_loop and level.open_loop.behind:
            add("BEHIND", "load generator fell behind its schedule", "open-loop", where)
        for note in level.notes:
            if "load generator" in note or "event loop" in note or "send lag" in note:
                add("CLIENT LAG", "the load generator delayed requests or chunks", "lag", where)
    seen: set[str] = set()
    for entry in summarize_speedups(results):
        for line in content_warnings(entry):
            if line in seen:  # the baseline's, beside each drafter
                continue
            seen.add(line)
            label = "NOISE" if ": NOISE:" in line else "CONTENT"
            out.append(Badge(label, _short(line.replace(f": {label}:", ":")), "content"))
        if "say the opposite" in entry.verdict:
            said = entry.verdict.split("; but ", 1)[1].split(" say the opposite")[0]
            out.append(Badge("DISAGREE", _short(f"batch {entry.concurrency} {entry.variant}: Locust's verdict "
                                                f"contradicted by {said}"), "second-opinion"))
    for entry in second_opinion.systematic_by_level(results):
        runs = max(f.runs for f in entry.figures().values())
        if entry.agrees is False and runs > 1:  # over one run: the FLAG of that run says it
            out.append(Badge("DRIFT", f"batch {entry.concurrency} {entry.variant}: Locust and vLLM bench "
                             "differ over all runs", "second-opinion"))
    for (label, text, target), wheres in grouped.items():
        where = wheres[0] if len(wheres) == 1 else f"{len(wheres)} runs"
        out.append(Badge(label, f"{where}: {text}", target))
    problems = [p for p in results.problems if p != "interrupted"
                and not p.startswith("batch ")]  # a level's systematic line already has its badge
    out += [Badge("PROBLEM", _short(p), "variants") for p in problems]
    return out


# ---------------------------------------------------------------------------------- setup
def setup(results: SweepResults, method: str) -> str:
    """One paragraph: model, drafter, K, workload, temperature, machine, repeats; `method` links the method."""
    s = results.settings
    m = results.machine or {}
    spec = [v for v in results.variants if v.name != "baseline" and v.k]
    served = next((v.served_model for v in results.variants if v.served_model), None)
    drafters = []
    for v in spec:
        sc = v.speculative_config or {}
        what = sc.get("method") or v.drafter or "speculation"
        if sc.get("model"):
            what += f" `{sc['model']}`"
        drafters.append((f"{v.name}: " if len(spec) > 1 else "") + f"{what}, K={v.k}")
    load = loop_text(s)
    order = (results.plan or {}).get("order")
    length = f"{s.get('max_tokens')} output tokens" + (" (fixed)" if s.get("fixed_length") else " at most")
    target = f"`{served}`" if served else f"config `{results.config}`"
    commit = f", commit {m['commit']}" if m.get("commit") else ""
    said = traffic.describe(s) if s.get("workload") else []  # which traffic ran, as the plan said it
    return (f"**Setup.** Target {target} ({'; '.join(drafters) or 'no speculative variant'}) against the same "
            f"server without speculation. " + (" ".join(x[0].upper() + x[1:] + "." for x in said) + " "
                                              if said else "")
            + f"Workload `{s.get('workload')}`, {length}, temperature {s.get('temperature')}; {load}; {s.get('repeat', 1)} run(s) of each"
            + (f", {order} order" if order else "") + f". Machine: {m.get('cpus')} CPUs"
            + (f" ({m['platform']})" if m.get("platform") else "") + f", vLLM {m.get('vllm')}{commit}. "
            f"Status **{results.status}**. How each figure is computed: {method}.")


def announce(code: int) -> int:
    """Print what the exit status means (the words and the status must agree), return it."""
    print(f"exit {code}: {EXIT_CODES.get(code, '')}")
    return code


def loop_text(s: dict[str, Any], full: bool = False) -> str:
    """The sweep's load, from its settings: `closed loop at batch 1, 32`, `open loop at 1, 4 req/s
    (Poisson arrivals)`; `full`: the report's setup wording, with how the users start or that the
    arrivals are the same for every variant."""
    if s.get("rates"):  # the one place a report reads which loop a sweep ran
        rates = ", ".join(f"{r:g}" for r in s["rates"])
        return (f"open loop at rates {rates} requests/s (Poisson arrivals, the same for every variant of a repeat)"
                if full else f"open loop at {rates} req/s (Poisson arrivals)")
    if not full:
        return f"closed loop at batch {', '.join(str(u) for u in s.get('users') or [])}"
    return (f"closed loop at concurrency {s.get('users')}"
            + (f" (users start {1000 * s['arrival_gap_s']:.0f} ms apart)" if s.get("arrival_gap_s") else ""))
