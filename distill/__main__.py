"""python -m distill [CONFIG] [--data prompts.jsonl]: a draft fine-tuned on the served target's own
continuations of your prompts, a config that uses it, and acceptance and speedup before and after,
measured on the engine on held-out prompts."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from deploy import ConfigError
from deploy.config import DEFAULT_CONFIG, as_overrides, load_config
from distill.run import STDLIB_TESTS, DistillSettings, distill
from distill.train import TrainSettings
from loadtest.arg_types import int_list, positive_int, temperature_list
from loadtest.interrupts import interrupt_on
from loadtest.sweeps.plan import duration_text
from loadtest.sweeps.runner import Sweep
from loadtest.sweeps.settings import SweepSettings
from loadtest.traffic.request_settings import RequestSettings


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m distill", description=__doc__)
    p.add_argument("config", nargs="?", default=DEFAULT_CONFIG,
                   help="config whose draft (speculation.drafter: small_model) is distilled (default: %(default)s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a config field (repeatable)")
    p.add_argument("--data", default=STDLIB_TESTS,
                   help="your prompts: a JSONL ({\"prompt\": ...} or {\"messages\": [...]} a line) or ShareGPT file; "
                        f"'{STDLIB_TESTS}': windows of the Python standard library's tests (default)")
    p.add_argument("--held-out", default=None, help="prompts to measure on (default: every 5th prompt of --data)")
    p.add_argument("--max-tokens", type=positive_int, default=128, help="target tokens collected per prompt (%(default)s)")
    p.add_argument("--temperatures", type=temperature_list, default=[0.0, 1.0], metavar="T,T",
                   help="one target continuation per prompt at each (default: 0,1)")
    p.add_argument("--top-logprobs", type=positive_int, default=20,
                   help="the target's top log-probabilities per position to match (1-20, %(default)s)")
    p.add_argument("--epochs", type=positive_int, default=TrainSettings.epochs, help="(%(default)s)")
    p.add_argument("--lr", type=float, default=TrainSettings.lr, help="peak learning rate (%(default)s)")
    p.add_argument("--max-minutes", type=float, default=60, help="refuse training estimated to take longer (%(default)s)")
    p.add_argument("--no-measure", action="store_true", help="distil and write the config, without the load tests")
    p.add_argument("--batches", type=int_list, default=[1, 32], metavar="B,B", help="batch sizes measured (default: 1,32)")
    p.add_argument("--measure-temperature", type=temperature_list, default=[0.0, 1.0], metavar="T,T",
                   help="temperatures measured (default: 0,1)")
    p.add_argument("--repeat", type=positive_int, default=1, help="runs of each measured level (%(default)s)")
    p.add_argument("--requests", type=positive_int, default=None, help="requests per measured run "
                                                                        "(default: max(32, 8 x batch))")
    p.add_argument("--measure-max-tokens", type=positive_int, default=64, help="output tokens per measured request (%(default)s)")
    p.add_argument("--vllm-bench", action="store_true", help="also run vLLM's serving benchmark after each run")
    p.add_argument("--draft-out", type=Path, default=None, help="the distilled draft's folder (default: <out>/draft)")
    p.add_argument("--output", type=Path, default=None, help="the config using it (default: <config>-distilled.yaml beside it)")
    p.add_argument("--out", type=Path, default=None, help="report folder (default: reports/distill-<config>-<time>)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (servers, steps, the measurement's load tests) and exit; starts nothing")
    return p


def dry_run(settings: DistillSettings) -> int:
    """Distillation's steps, its servers and the measurement's plan; starts nothing, writes nothing."""
    try:
        config = load_config(settings.config, settings.overrides)
        if config.speculation.drafter != "small_model":
            raise ValueError(f"distillation fine-tunes a draft model, and speculation.drafter is "
                             f"'{config.speculation.drafter}'; use a config with drafter: small_model")
        plan = Sweep(SweepSettings(settings.config, overrides=settings.overrides, users=settings.batches,
                                   repeat=settings.repeat, requests=settings.requests,
                                   request=RequestSettings(max_tokens=settings.measure_max_tokens),
                                   vllm_bench=settings.vllm_bench)).plan(dry_run=True)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    temps = ", ".join(f"{t:g}" for t in settings.temperatures)
    measured = ", ".join(f"{t:g}" for t in settings.measure_temperatures)
    target = next(s for s in plan.servers if s.name == "baseline")
    lines = [f"distill plan (dry run: nothing starts): {settings.config}",
             f"  1. collect: the target served without speculation (1 server start, about "
             f"{duration_text(plan.start_estimate(target).seconds)}); {settings.max_tokens} tokens of its continuation "
             f"per prompt of {settings.data} at T={temps}, with its top {settings.top_logprobs} log-probabilities",
             f"  2. train: the draft fine-tuned for {settings.train.epochs} epoch(s) on this machine; refused before "
             f"it starts when estimated above {settings.max_minutes:g} min"]
    if settings.measure:
        lines += [f"  3. measure, at T={measured} (one load test each) on the held-out prompts: the original draft, "
                  f"the distilled one (a third server like the first) and no speculation; each as planned here:",
                  *[f"  {line}" for line in plan.describe(dry_run=True).splitlines()[1 + len(plan.traffic):]
                    if "traffic:" not in line],
                  f"  estimated duration of the measurement: about "
                  f"{duration_text(1.5 * plan.total_s() * len(settings.measure_temperatures))} (two variants' plan "
                  f"x 1.5); collection and training depend on the data"]
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        overrides = as_overrides(opts.overrides)  # --set's texts parsed once, here
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    settings = DistillSettings(
        opts.config, overrides, opts.data, opts.held_out, opts.max_tokens, opts.temperatures, opts.top_logprobs,
        TrainSettings(epochs=opts.epochs, lr=opts.lr), opts.max_minutes, not opts.no_measure, sorted(set(opts.batches)),
        opts.measure_temperature, opts.repeat, opts.requests, opts.measure_max_tokens, opts.vllm_bench,
        opts.draft_out, opts.output, opts.out)
    if opts.dry_run:
        return dry_run(settings)

    interrupt_on(signal.SIGTERM)
    try:
        result = distill(settings)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: servers stopped", file=sys.stderr)
        return 130
    report = Path(result.out) / "distill.md"
    print(report.read_text())
    print(f"distillation: {report}")
    # 0: distilled (and measured); 1: not better than the deployed draft, or a measurement failed;
    # 2: refused before any work.
    return 1 if result.status in ("failed", "not_better") else 0


if __name__ == "__main__":
    sys.exit(main())
