"""Compare drafters on the embedded default: `make bench-drafters` (a benchmark, not a test).

Serves the embedded pair once per drafter (no speculation, the small model on vLLM's native path
and as specdeploy's plugin, the bigram drafter, vLLM's ngram), sends the same code-completion
prompts one at a time (greedy, fixed max_tokens), and reports per drafter:

- acceptance rate: accepted / proposed draft tokens;
- mean acceptance length: tokens produced per target step, 1 + accepted / drafts (vLLM's
  definition: the bonus token counts), from the `/metrics` counters before and after;
- output tokens/s over the whole run and the ratio to no speculation measured in the same run;

and the bigram drafter's proposal cost (256 running requests, K = 8). Figures go to
`reports/bench-drafters/results.json` and `results.md`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import requests
from tqdm import tqdm

from deploy import free_port, plan_from_config, start_server

OUT_DIR = Path("reports/bench-drafters")
CONFIG = "default"
# name -> overrides of configs/default.yaml (the embedded pair, K = 4)
DRAFTERS: dict[str, list[str]] = {
    "none": ["speculation.drafter=none"],
    "small_model (native)": [],
    "small_model (plugin)": ["speculation.implementation=plugin"],
    "bigram": ["speculation.drafter=bigram", "speculation.model="],
    "ngram": ["speculation.drafter=ngram", "speculation.model="],
}
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


@dataclass
class DrafterResult:
    drafter: str
    output_tokens: int
    seconds: float
    tokens_per_s: float
    drafts: float
    draft_tokens: float
    accepted_tokens: float
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    """1 + accepted / drafts: tokens per target forward pass."""
    speedup: float | None = None
    """tokens_per_s over that of `none` in the same run."""
    startup_s: float = 0.0


def code_prompts(count: int, chars: int) -> list[str]:
    """Beginnings of held-out standard-library files (the pair never trained on them), cut at a line end."""
    from deploy.embedded_pair import corpus_files

    prompts = []
    for path in corpus_files("heldout"):
        text = path.read_text(encoding="utf-8", errors="replace")
        body = text[text.find("\nimport ") + 1:] if "\nimport " in text else text  # skip the licence header
        cut = body[:chars].rsplit("\n", 1)[0] + "\n"
        if len(cut) > chars // 2:
            prompts.append(cut)
        if len(prompts) == count:
            break
    return prompts


def counters(base_url: str) -> dict[str, float]:
    text = requests.get(f"{base_url}/metrics", timeout=30).text
    totals = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        for name in COUNTERS:
            metric = f"vllm:spec_decode_{name}_total"
            if line.startswith(metric) and line[len(metric)] in " {":
                totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


def run_drafter(name: str, overrides: list[str], prompts: list[str], max_tokens: int, logs: Path) -> DrafterResult:
    _, plan = plan_from_config(CONFIG, [*overrides, f"server.port={free_port()}"])
    started = time.monotonic()
    slug = name.replace(" ", "-").replace("(", "").replace(")", "")
    with start_server(plan, logs / f"{slug}.log", progress=False) as server:
        startup = time.monotonic() - started

        def send(prompt: str, tokens: int) -> int:
            body = {"model": plan.served_name, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                    "ignore_eos": True}
            response = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=600)
            response.raise_for_status()
            return int(response.json()["usage"]["completion_tokens"])

        send(prompts[0], 32)  # warm-up: first-request costs are not the drafter's
        before = counters(server.base_url)
        began = time.perf_counter()
        tokens = sum(send(p, max_tokens) for p in prompts)
        seconds = time.perf_counter() - began
        after = counters(server.base_url)
    delta = {k: after[k] - before[k] for k in COUNTERS}
    drafted = delta["num_draft_tokens"] > 0
    return DrafterResult(
        name, tokens, seconds, tokens / seconds, delta["num_drafts"], delta["num_draft_tokens"],
        delta["num_accepted_tokens"],
        delta["num_accepted_tokens"] / delta["num_draft_tokens"] if drafted else None,
        1 + delta["num_accepted_tokens"] / delta["num_drafts"] if delta["num_drafts"] else None,
        startup_s=startup)


def bigram_cost() -> dict[str, float]:
    from plugins.bigram import benchmark_propose
    from plugins.bigram_table import embedded_table, load_table

    cost = benchmark_propose(load_table(embedded_table(progress=False)), batch=256, k=8)
    return {**cost, "load_average": os.getloadavg()[0]}  # a busy shared CPU inflates the figure


def markdown(results: list[DrafterResult], cost: dict[str, float], meta: dict) -> str:
    def fmt(value: float | None, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    lines = [
        "# Drafters on the embedded default", "",
        f"{meta['prompts']} held-out code prompts, one at a time, greedy, {meta['max_tokens']} tokens each, "
        f"K = {meta['k']}; {meta['machine']}. Acceptance from vLLM's /metrics counters (deltas over the run); "
        "mean acceptance length = 1 + accepted / drafts (tokens per target step).", "",
        "| drafter | acceptance rate | mean acceptance length | output tok/s | vs none |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(f"| {r.drafter} | {fmt(r.acceptance_rate, '.1%')} | {fmt(r.mean_acceptance_length, '.2f')} | "
                     f"{r.tokens_per_s:.1f} | {fmt(r.speedup, '.2f')}x |")
    lines += ["", f"Bigram proposal cost, 256 running requests, K = 8: {cost['median_us']:.0f} us per propose "
              f"(median of {cost['steps']:.0f} steps; min {cost['min_us']:.0f} us, p90 {cost['p90_us']:.0f} us; "
              f"thread CPU time median {cost['cpu_median_us']:.0f} us), measured at a 1-minute load average of "
              f"{cost['load_average']:.1f} on {os.cpu_count()} CPUs.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plugins.bench_drafters", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8, help="code prompts (%(default)s)")
    parser.add_argument("--prompt-chars", type=int, default=600, help="characters per prompt (%(default)s)")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens generated per prompt (%(default)s)")
    parser.add_argument("--drafters", nargs="*", default=list(DRAFTERS), choices=list(DRAFTERS), metavar="NAME",
                        help=f"subset of: {', '.join(DRAFTERS)}")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="report folder (%(default)s)")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    prompts = code_prompts(opts.prompts, opts.prompt_chars)
    opts.out.mkdir(parents=True, exist_ok=True)
    results: list[DrafterResult] = []
    for name in tqdm(opts.drafters, desc="drafters", unit="server"):
        tqdm.write(f"{name}: starting a server")
        results.append(run_drafter(name, DRAFTERS[name], prompts, opts.max_tokens, opts.out / "logs"))
        r = results[-1]
        tqdm.write(f"{name}: {r.tokens_per_s:.1f} tok/s, acceptance "
                   f"{'n/a' if r.acceptance_rate is None else f'{r.acceptance_rate:.1%}'}")
    base = next((r for r in results if r.drafter == "none"), None)
    for r in results:
        r.speedup = r.tokens_per_s / base.tokens_per_s if base else None
    tqdm.write("bigram proposal cost (256 requests, K=8)...")
    cost = bigram_cost()
    resolved, plan = plan_from_config(CONFIG)
    meta = {"prompts": len(prompts), "max_tokens": opts.max_tokens, "config": CONFIG,
            "k": resolved.config.speculation.num_speculative_tokens,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, device {plan.device}",
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    (opts.out / "results.json").write_text(json.dumps(
        {"meta": meta, "drafters": [asdict(r) for r in results], "bigram_propose_cost": cost}, indent=1))
    report = markdown(results, cost, meta)
    (opts.out / "results.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
