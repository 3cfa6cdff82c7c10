"""What the embedded pair's target writes on the held-out prompts: greedy and sampled at T=1, beside
the real continuation of the same file, each judged by the content check (loops and noise).

`python -m tuning.pair_samples [--weights DIR] [--out FILE]`: 8 prompts (the held-out
prompts), 128 tokens each, T=1 seeded by the prompt's index. It runs the trained target itself
(transformers, float32): the served one is the same function, widened. The JSON it writes has the
shape of `tests/fixtures/embedded_pair_e987624_heldout.json`, the outputs of the pair before it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from loadtest.measurement.serial import Serial

PROMPTS, PROMPT_CHARS, TOKENS = 8, 600, 128
KINDS = ("greedy", "sampled_t1", "real")


@dataclass
class ContentCheck(Serial):
    """The content check's verdict on one continuation (loadtest.measurement.content)."""

    degenerate: bool = False
    """It loops."""
    noise: bool = False
    """Mostly made-up words."""
    distinct_4: float | None = None
    known_words: float | None = None


@dataclass
class PairSample(Serial):
    """One held-out prompt: the target's greedy and T=1 continuations and the real one, each checked."""

    file: str = ""
    prompt: str = ""
    greedy: str = ""
    greedy_check: ContentCheck | None = None
    sampled_t1: str = ""
    sampled_t1_check: ContentCheck | None = None
    real: str = ""
    real_check: ContentCheck | None = None


def _judge(text: str, tokens: list[int], prompt: str) -> ContentCheck:
    from loadtest.measurement import content

    fig = content.figures(tokens, text=text, prompt_text=prompt)
    return ContentCheck(content.is_degenerate(fig), content.is_noise(fig), fig["distinct_4"], fig.get("known_words"))


def samples(weights: Path, count: int = PROMPTS, tokens: int = TOKENS) -> list[PairSample]:
    """Greedy, T=1 and real continuations of `count` held-out prompts, with the content check's verdicts."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from models.embedded_pair import corpus_files, held_out_code_prompts

    tok = AutoTokenizer.from_pretrained(weights / "tokenizer")
    model = LlamaForCausalLM.from_pretrained(weights / "target", torch_dtype=torch.float32).eval()
    files = [(p.name, p.read_text(encoding="utf-8", errors="replace")) for p in corpus_files("heldout")]
    out = []
    for index, prompt in enumerate(held_out_code_prompts(count, PROMPT_CHARS)):
        name, source = next(((n, t) for n, t in files if prompt in t), ("?", ""))
        ids = torch.tensor([tok(prompt).input_ids])

        def generated(sample: bool) -> tuple[str, ContentCheck]:
            torch.manual_seed(index)
            with torch.inference_mode():
                new = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=sample,
                                     temperature=1.0 if sample else None, top_k=0 if sample else None,
                                     top_p=1.0 if sample else None, pad_token_id=tok.pad_token_id)[0, ids.shape[1]:]
            text = tok.decode(new, skip_special_tokens=True)
            return text, _judge(text, new.tolist(), prompt)

        rest = tok(source[source.find(prompt) + len(prompt):], add_special_tokens=False).input_ids[:tokens]
        real = tok.decode(rest)
        out.append(PairSample(name, prompt, *generated(False), *generated(True), real, _judge(real, rest, prompt)))
    return out


def main(argv: list[str] | None = None) -> int:
    from models.embedded_pair import WEIGHTS

    parser = argparse.ArgumentParser(prog="python -m tuning.pair_samples", description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", type=Path, default=WEIGHTS, help="trained weights folder (default: shipped)")
    parser.add_argument("--out", type=Path, default=None, help="write the samples as JSON here")
    opts = parser.parse_args(argv)
    rows = samples(opts.weights)
    for key in KINDS:
        checks = [getattr(r, f"{key}_check") for r in rows]
        loops, noise = sum(c.degenerate for c in checks), sum(c.noise for c in checks)
        print(f"{key:>10}: {loops} of {len(rows)} loop, {noise} of {len(rows)} noise")
    for r in rows[:2]:
        print(f"\n--- {r.file}: greedy\n{r.greedy}\n--- T=1\n{r.sampled_t1}")
    if opts.out:
        about = (f"The embedded pair's target from {opts.weights}, on the {len(rows)} held-out prompts of "
                 f"models.embedded_pair.held_out_code_prompts({len(rows)}, {PROMPT_CHARS}): {TOKENS} tokens sampled at "
                 f"T=1 (torch seed = prompt index), {TOKENS} greedy, and the real continuation ({TOKENS} tokens).")
        opts.out.write_text(json.dumps({"about": about, "outputs": [r.to_json() for r in rows]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
