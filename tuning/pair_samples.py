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
from pathlib import Path
from typing import Any

PROMPTS, PROMPT_CHARS, TOKENS = 8, 600, 128


def _judge(text: str, tokens: list[int], prompt: str) -> dict[str, Any]:
    from loadtest.measurement import content

    fig = content.figures(tokens, text=text, prompt_text=prompt)
    return {"degenerate": content.is_degenerate(fig), "noise": content.is_noise(fig),
            "distinct_4": fig["distinct_4"], "known_words": fig.get("known_words")}


def samples(weights: Path, count: int = PROMPTS, tokens: int = TOKENS) -> list[dict[str, Any]]:
    """Greedy, T=1 and real continuations of `count` held-out prompts, with the content check's verdicts."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from models.embedded_pair import corpus_files
    from models.embedded_pair import held_out_code_prompts

    tok = AutoTokenizer.from_pretrained(weights / "tokenizer")
    model = LlamaForCausalLM.from_pretrained(weights / "target", torch_dtype=torch.float32).eval()
    files = [(p.name, p.read_text(encoding="utf-8", errors="replace")) for p in corpus_files("heldout")]
    out = []
    for index, prompt in enumerate(held_out_code_prompts(count, PROMPT_CHARS)):
        name, source = next(((n, t) for n, t in files if prompt in t), ("?", ""))
        ids = torch.tensor([tok(prompt).input_ids])
        row: dict[str, Any] = {"file": name, "prompt": prompt}
        for key, sample in (("greedy", False), ("sampled_t1", True)):
            torch.manual_seed(index)
            with torch.inference_mode():
                new = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=sample,
                                     temperature=1.0 if sample else None, top_k=0 if sample else None,
                                     top_p=1.0 if sample else None, pad_token_id=tok.pad_token_id)[0, ids.shape[1]:]
            row[key] = tok.decode(new, skip_special_tokens=True)
            row[f"{key}_check"] = _judge(row[key], new.tolist(), prompt)
        rest = tok(source[source.find(prompt) + len(prompt):], add_special_tokens=False).input_ids[:tokens]
        row["real"] = tok.decode(rest)
        row["real_check"] = _judge(row["real"], rest, prompt)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    from models.embedded_pair import WEIGHTS

    parser = argparse.ArgumentParser(prog="python -m tuning.pair_samples", description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", type=Path, default=WEIGHTS, help="trained weights folder (default: shipped)")
    parser.add_argument("--out", type=Path, default=None, help="write the samples as JSON here")
    opts = parser.parse_args(argv)
    rows = samples(opts.weights)
    for key in ("greedy", "sampled_t1", "real"):
        loops = sum(r[f"{key}_check"]["degenerate"] for r in rows)
        noise = sum(r[f"{key}_check"]["noise"] for r in rows)
        print(f"{key:>10}: {loops} of {len(rows)} loop, {noise} of {len(rows)} noise")
    for r in rows[:2]:
        print(f"\n--- {r['file']}: greedy\n{r['greedy']}\n--- T=1\n{r['sampled_t1']}")
    if opts.out:
        about = (f"The embedded pair's target from {opts.weights}, on the {len(rows)} held-out prompts of "
                 f"models.embedded_pair.held_out_code_prompts({len(rows)}, {PROMPT_CHARS}): {TOKENS} tokens sampled at "
                 f"T=1 (torch seed = prompt index), {TOKENS} greedy, and the real continuation ({TOKENS} tokens).")
        opts.out.write_text(json.dumps({"about": about, "outputs": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
