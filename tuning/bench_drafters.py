"""Compare drafters on the embedded default: `make bench-drafters` (a benchmark, not a test).

Serves the embedded pair once per drafter per round (no speculation, the small model on vLLM's
native path and as specdeploy's plugin, the bigram drafter, vLLM's ngram), sends the same
code-completion prompts one at a time (at `--temperature`, default 1 as vLLM's; fixed max_tokens),
and reports per drafter:

- acceptance rate: accepted / proposed draft tokens;
- mean acceptance length: tokens produced per target step, 1 + accepted / drafts (vLLM's
  definition: the bonus token counts), from the `/metrics` counters before and after;
- output tokens/s and the ratio to no speculation measured in the same round;
- the content check of the outputs (`loadtest.measurement.content`): how many loop, against the held-out code,
  and acceptance over the content-valid requests alone (a loop is predicted, not text);
- where an engine step's time goes (`plugins.step_profile`: schedule, target forward,
  verification, bookkeeping, drafting), in ms per step.

Every round runs every drafter, the baseline included, in a rotated order, so a ratio is
never one server's luck on a shared machine: the report gives the median over rounds and the
min-max spread. Also the bigram drafter's proposal cost (256 running requests, K = 8).
Figures go to `reports/bench-drafters/results.json` and `results.md`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import requests
from tqdm import tqdm

from deploy import Override, free_port, plan_from_config, start_server
from loadtest.measurement import content
from loadtest.arg_types import positive_int
from loadtest.files import write_result
from loadtest.reports.markdown import table as markdown_table
from plugins import step_profile

OUT_DIR = Path("reports/bench-drafters")
CONFIG = "default"
# name -> overrides of configs/default.yaml (the embedded pair, K = 4)
DRAFTERS: dict[str, list[str]] = {
    "none": ["speculation.drafter=none"],
    "small_model (native)": [],
    # The plugins sample their drafts for sampled requests, as the native path does (draft_sampling:
    # probabilistic, from default.yaml).
    "small_model (plugin)": ["speculation.implementation=plugin"],
    "bigram": ["speculation.drafter=bigram", "speculation.model="],
    # The same table drafting its argmax only, as the plugins did before they sampled: what sampling gains.
    "bigram (greedy drafts)": ["speculation.drafter=bigram", "speculation.model=", "speculation.draft_sampling=greedy"],
    "ngram": ["speculation.drafter=ngram", "speculation.model=", "speculation.draft_sampling=greedy"],
}
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
REFERENCE = "ngram"
"""vLLM's own drafter that, like the plugins, drafts on the CPU between steps: a plugin's per-step
cost is held against it (issue 12's goal: within 5% at equal tokens per step)."""


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
    """tokens_per_s over that of `none` in the same round."""
    startup_s: float = 0.0
    round: int = 0
    step_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    """Per engine step: milliseconds in each phase (plugins.step_profile.per_step_ms)."""
    content: dict | None = None
    """`loadtest.measurement.content.summarize` of the outputs."""

    @property
    def step_total_ms(self) -> float | None:
        """What one target step costs the engine: the step plus handing its drafts to the scheduler."""
        step = self.step_ms.get("step")
        return step + (self.step_ms.get("post_step") or 0.0) if step else None


def code_prompts(count: int, chars: int) -> list[str]:
    """Beginnings of held-out standard-library files (the pair never trained on them), cut at a line end."""
    from models.embedded_pair import corpus_files

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


def run_drafter(name: str, overrides: list[str], prompts: list[str], max_tokens: int, logs: Path,
                round_: int = 0, temperature: float = 1.0) -> DrafterResult:
    _, plan = plan_from_config(CONFIG, [*overrides, Override("server.port", free_port())])
    slug = name.replace(" ", "-").replace("(", "").replace(")", "")
    with tempfile.TemporaryDirectory(prefix="specdeploy-steps-") as profile:
        plan = dataclasses.replace(plan, env={**plan.env, step_profile.ENV: profile})
        started = time.monotonic()
        with start_server(plan, logs / f"{slug}-round{round_}.log", progress=False) as server:
            startup = time.monotonic() - started

            outputs: list[dict] = []

            def send(prompt: str, tokens: int, seed: int) -> int:
                # A seed per prompt: every drafter and round samples the same request the same way.
                body = {"model": plan.served_name, "prompt": prompt, "max_tokens": tokens, "temperature": temperature,
                        "seed": seed, "ignore_eos": True, "return_token_ids": True}
                response = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=600)
                response.raise_for_status()
                outputs.append({**response.json(), "prompt": prompt})
                return int(outputs[-1]["usage"]["completion_tokens"])

            send(prompts[0], 32, 0)  # warm-up: first-request costs are not the drafter's
            outputs.clear()
            steps_before = settled_profile(profile)
            before = counters(server.base_url)
            began = time.perf_counter()
            tokens = sum(send(p, max_tokens, i) for i, p in enumerate(prompts))
            seconds = time.perf_counter() - began
            after = counters(server.base_url)
            steps_after = settled_profile(profile)
    delta = {k: after[k] - before[k] for k in COUNTERS}
    drafted = delta["num_draft_tokens"] > 0
    return DrafterResult(
        name, tokens, seconds, tokens / seconds, delta["num_drafts"], delta["num_draft_tokens"],
        delta["num_accepted_tokens"],
        delta["num_accepted_tokens"] / delta["num_draft_tokens"] if drafted else None,
        1 + delta["num_accepted_tokens"] / delta["num_drafts"] if delta["num_drafts"] else None,
        startup_s=startup, round=round_, step_ms=step_profile.per_step_ms(steps_before, steps_after),
        content=check_content(outputs))


def check_content(outputs: list[dict]) -> dict:
    """The content check over one drafter's responses (held against the pair's held-out code)."""
    figs = [content.figures(o["choices"][0].get("token_ids") or [], text=o["choices"][0].get("text") or "",
                            prompt_text=o.get("prompt")) for o in outputs]
    spec = [(o.get("metrics") or {}).get("speculative_decoding") for o in outputs]
    return content.summarize(figs, content.reference_for(figs, embedded=True), spec)


def settled_profile(folder: str) -> dict[str, dict[str, float]]:
    """The engine's step timers once it is idle: the profile file is rewritten every 0.5 s, so
    wait until two reads a write apart agree (the engine has finished its last step)."""
    previous = None
    for _ in range(20):
        current = step_profile.read_profile(folder)
        if current and current == previous:
            return current
        previous = current
        time.sleep(step_profile.WRITE_EVERY_S * 1.5)
    return previous or {}


def bigram_cost() -> dict[str, float]:
    from models.bigram_tables import embedded_table
    from plugins.bigram import benchmark_propose
    from plugins.bigram_table import load_table

    cost = benchmark_propose(load_table(embedded_table(progress=False)), batch=256, k=8)
    return {**cost, "load_average": os.getloadavg()[0]}  # a busy shared CPU inflates the figure


PHASE_COLUMNS = [("schedule", "schedule"), ("forward", "target forward"), ("sample", "sample + verify"),
                 ("bookkeeping", "bookkeeping"), ("propose", "propose"), ("sample_tokens_other", "runner glue"),
                 ("update", "update"), ("other", "other"), ("post_step", "post-step")]


def summarize(results: list[DrafterResult], names: list[str]) -> list[dict]:
    """Per drafter over its rounds: medians, and min-max of tokens/s and of the speedup; and its
    speed against `REFERENCE` at equal tokens per step: the reference's step time over the
    drafter's in the same round (tokens/s = tokens per step / step time, so with the tokens per
    step equal only the step times differ)."""
    rows = []
    reference = {r.round: r.step_total_ms for r in results if r.drafter == REFERENCE}
    for name in names:
        mine = [r for r in results if r.drafter == name]
        if not mine:
            continue

        def med(values: list[float | None]) -> float | None:
            values = [v for v in values if v is not None]
            return statistics.median(values) if values else None

        speedups = [r.speedup for r in mine if r.speedup is not None]
        at_equal = [reference[r.round] / r.step_total_ms for r in mine  # drafters only: `none` makes 1 a step
                    if r.mean_acceptance_length and r.step_total_ms and reference.get(r.round)]
        phases = [p for p, _ in PHASE_COLUMNS] + ["step"]
        rows.append({
            "drafter": name, "rounds": len(mine),
            "acceptance_rate": med([r.acceptance_rate for r in mine]),
            "mean_acceptance_length": med([r.mean_acceptance_length for r in mine]),
            "tokens_per_s": med([r.tokens_per_s for r in mine]),
            "tokens_per_s_range": [min(r.tokens_per_s for r in mine), max(r.tokens_per_s for r in mine)],
            "speedup": med(speedups), "speedup_range": [min(speedups), max(speedups)] if speedups else None,
            "step_ms": {p: med([r.step_ms.get(p) for r in mine]) for p in phases},
            "vs_reference_at_equal_tokens": med(at_equal),
            "vs_reference_at_equal_tokens_range": [min(at_equal), max(at_equal)] if at_equal else None,
            "content": content.merge([r.content for r in mine]),
        })
    return rows


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _equal_tokens(s: dict) -> str:
    spread = s["vs_reference_at_equal_tokens_range"]
    return "n/a" if spread is None else (f"{s['vs_reference_at_equal_tokens']:.3f}x "
                                         f"[{spread[0]:.3f}-{spread[1]:.3f}]")


def _degenerate(s: dict) -> str:
    c = s.get("content")
    return "n/a" if not c else f"{c['degenerate']}/{c['checked']}"


def _drafter_row(s: dict) -> list[str]:
    """A drafter's row of the first table: acceptance, speed, content."""
    lo, hi = s["tokens_per_s_range"]
    spread = (f" [{s['speedup_range'][0]:.2f}-{s['speedup_range'][1]:.2f}]" if s["speedup_range"] else "")
    c = s.get("content") or {}
    return [s["drafter"], _fmt(s["acceptance_rate"], ".1%"), _fmt(s["mean_acceptance_length"], ".2f"),
            f"{s['tokens_per_s']:.1f} [{lo:.1f}-{hi:.1f}]", f"{_fmt(s['speedup'], '.2f')}x{spread}", _degenerate(s),
            f"{_fmt(c.get('distinct_4'), '.2f')} ({_fmt((c.get('reference') or {}).get('distinct_4'), '.2f')})",
            _fmt(c.get("acceptance_valid"), ".1%")]


def _step_row(s: dict) -> list[str]:
    """A drafter's row of the step-time table: where a step's time goes."""
    ms = s["step_ms"]
    per_step = s["mean_acceptance_length"] or 1.0
    total = (ms.get("step") or 0) + (ms.get("post_step") or 0)
    return [s["drafter"], _fmt(ms.get("step"), ".2f"), *(_fmt(ms.get(p), ".2f") for p, _ in PHASE_COLUMNS),
            _fmt(total - (ms.get("forward") or 0) if total else None, ".2f"),
            _fmt(per_step / total if total else None, ".3f"), _equal_tokens(s)]


def markdown(summary: list[dict], cost: dict[str, float], meta: dict) -> str:
    warnings = [f"- {content.label(s.get('content'))}: {s['drafter']}'s output {w}" for s in summary
                if (w := content.warning(s.get("content")))]
    temperature = meta.get("temperature", 0)
    lines = [
        "# Drafters on the embedded default", "", *warnings, *([""] if warnings else []),
        f"{meta['prompts']} held-out code prompts, one at a time, "
        f"{'greedy' if not temperature else f'temperature {temperature:g} (a seed per prompt)'}, "
        f"{meta['max_tokens']} tokens each, "
        f"K = {meta['k']}; {meta['machine']}. {meta['rounds']} rounds, each serving every drafter and the "
        "baseline in a rotated order; medians over rounds, [min-max] beside them, speedups against the same "
        "round's baseline. Acceptance from vLLM's /metrics counters (deltas over the run); mean acceptance "
        "length = 1 + accepted / drafts (tokens per target step). Content (`loadtest/measurement/content.py`): requests "
        "whose output loops, of those measured; distinct 4-grams of the outputs against the held-out code's at "
        "the same length; acceptance over the requests that do not loop, from the server's per-request "
        "figures.", "",
        markdown_table(["drafter", "acceptance rate", "mean acceptance length", "output tok/s", "vs none", "degenerate",
                        "distinct 4-grams (held-out)", "acceptance, content-valid"], map(_drafter_row, summary),
                       align="lrrrrrrr"),
        "", "## Where a step's time goes", "",
        "Milliseconds per engine step (median over rounds), from timers around vLLM's step phases "
        "(`plugins/step_profile.py`): target forward = input preparation and the target's forward "
        "pass; sample + verify = sampling and rejection sampling; propose = the drafter; runner glue = "
        "the rest of the model runner's sampling step; other = the engine step outside the named "
        "phases; post-step = drafts handed to the scheduler. vLLM's CPU build runs every drafter with "
        "synchronous scheduling, so nothing here is hidden behind the forward pass. Besides the "
        "forward = step + post-step - target forward: the verification forward does the same work for "
        "every drafter at equal K, so a drafter's cost to the engine is this column less the baseline's; "
        f"tokens per ms = tokens per target step / (step + post-step); vs {REFERENCE} at equal tokens per step = "
        f"{REFERENCE}'s (step + post-step) over the drafter's in the same round, median [min-max]: the "
        f"drafter's speedup over {REFERENCE}'s if both made the same tokens per step.", "",
        markdown_table(["drafter", "step", *(title for _, title in PHASE_COLUMNS), "besides the forward",
                        "tokens per ms", f"vs {REFERENCE} at equal tokens per step"], map(_step_row, summary),
                       align="l" + "r" * (len(PHASE_COLUMNS) + 4)),
    ]
    lines += ["", f"Bigram proposal cost, 256 running requests, K = 8: {cost['median_us']:.0f} us per propose "
              f"(median of {cost['steps']:.0f} steps; min {cost['min_us']:.0f} us, p90 {cost['p90_us']:.0f} us; "
              f"thread CPU time median {cost['cpu_median_us']:.0f} us), measured at a 1-minute load average of "
              f"{cost['load_average']:.1f} on {os.cpu_count()} CPUs.", ""]
    return "\n".join(lines)


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options of `python -m tuning bench-drafters`."""
    parser.add_argument("--prompts", type=int, default=8, help="code prompts (%(default)s)")
    parser.add_argument("--prompt-chars", type=int, default=600, help="characters per prompt (%(default)s)")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens generated per prompt (%(default)s)")
    parser.add_argument("--drafters", nargs="*", default=list(DRAFTERS), choices=list(DRAFTERS), metavar="NAME",
                        help=f"subset of: {', '.join(DRAFTERS)}")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="sampling temperature (%(default)s: vLLM's default; 0: greedy)")
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="rounds, each serving every drafter and the baseline (%(default)s)")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="report folder (%(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (servers, starts, estimate) and exit")


def dry_run(opts: argparse.Namespace) -> int:
    """The benchmark's plan: its servers, their starts and about how long it takes; starts nothing."""
    from loadtest.sweeps.plan import ASSUMED_START, assumed_tokens_per_s, duration_text

    names = list(dict.fromkeys(opts.drafters))
    start_s = ASSUMED_START["cpu"][0]
    run_s = opts.prompts * opts.max_tokens / assumed_tokens_per_s("cpu", 1)
    lines = [f"bench-drafters plan (dry run: nothing starts): {CONFIG}.yaml (the embedded pair), {opts.prompts} code "
             f"prompts of {opts.prompt_chars} characters, {opts.max_tokens} tokens each, one at a time, temperature "
             f"{opts.temperature:g}",
             "  servers, one at a time (config overrides):",
             *[f"    {name}: {' '.join(DRAFTERS[name]) or '(the config as it is)'}" for name in names],
             f"  server starts: {opts.rounds * len(names)} ({opts.rounds} round(s), each serving every drafter once, "
             f"the order rotated), about {duration_text(start_s)} each (assumed)",
             f"  estimated duration: about {duration_text(opts.rounds * len(names) * (start_s + run_s))} (assumed "
             f"{assumed_tokens_per_s('cpu', 1):g} tok/s at batch 1 on a CPU; the pair is built first if it is not)"]
    print("\n".join(lines))
    return 0


def bench(opts: argparse.Namespace) -> int:
    """Serve and measure every drafter in `opts.drafters` for `opts.rounds` rounds; write the report."""
    if opts.dry_run:
        return dry_run(opts)
    prompts = code_prompts(opts.prompts, opts.prompt_chars)
    opts.out.mkdir(parents=True, exist_ok=True)
    names = list(dict.fromkeys(opts.drafters))
    results: list[DrafterResult] = []
    with tqdm(total=opts.rounds * len(names), desc="servers", unit="server") as bar:
        for round_ in range(opts.rounds):
            shift = round_ % len(names)  # rotated: no drafter always runs first (or right after another)
            for name in names[shift:] + names[:shift]:
                bar.set_postfix_str(f"round {round_ + 1}: {name}")
                r = run_drafter(name, DRAFTERS[name], prompts, opts.max_tokens, opts.out / "logs", round_,
                                opts.temperature)
                results.append(r)
                bar.update()
                tqdm.write(f"round {round_ + 1} {name}: {r.tokens_per_s:.1f} tok/s, acceptance "
                           f"{'n/a' if r.acceptance_rate is None else f'{r.acceptance_rate:.1%}'}, "
                           f"{r.step_ms.get('step', float('nan')):.2f} ms per step; {content.describe(r.content)}")
            base = next((r for r in results if r.drafter == "none" and r.round == round_), None)
            for r in results:
                if r.round == round_:
                    r.speedup = r.tokens_per_s / base.tokens_per_s if base else None
    tqdm.write("bigram proposal cost (256 requests, K=8)...")
    cost = bigram_cost()
    resolved, plan = plan_from_config(CONFIG)
    meta = {"prompts": len(prompts), "max_tokens": opts.max_tokens, "config": CONFIG, "rounds": opts.rounds,
            "temperature": opts.temperature,
            "k": resolved.config.speculation.num_speculative_tokens,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, device {plan.device}",
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    summary = summarize(results, names)
    report = markdown(summary, cost, meta)
    write_result(opts.out, "results", {"meta": meta, "summary": summary, "runs": [asdict(r) for r in results],
                                       "bigram_propose_cost": cost}, report)
    print(report)
    return 0
