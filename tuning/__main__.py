"""Command line: measure a deployment's engine and decide what to deploy.

    python -m tuning costs default.yaml                     # engine step costs: plain, verify, draft
    python -m tuning costs default.yaml --pair              # `make models`: kept beside the embedded pair
    python -m tuning advise default.yaml --batches 1,8,32   # is the draft worth it, at which batch sizes
    python -m tuning tune default.yaml --batches 1,4,16,32  # K per batch size, into default-tuned.yaml
    python -m tuning paymap default.yaml --batches 1,4,16,32 --acceptance 0.62   # where speculation pays
    python -m tuning soak --requests 5000                   # every drafter's memory and latency over a long run
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from deploy import ConfigError
from deploy.config import DEFAULT_CONFIG, as_overrides
from loadtest.traffic import declared as traffic
from loadtest.arg_types import int_list, positive_int, temperature_list
from loadtest.traffic.request_settings import RequestSettings, add_prompt_args, add_traffic_args
from loadtest.traffic.workloads import load_workload
from tuning import soak

TUNE_TRAFFIC = ("workload", "api", "fixed_length")
"""The config's traffic fields tune takes (its temperatures are lists, its proof's length its own)."""
TUNE_MAX_TOKENS = 64
"""Proof requests' length unless --max-tokens says otherwise (not the config's traffic.max_tokens):
the proof runs every K beside the tuned config and the baseline, so its requests are kept short."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tuning", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    add_advise_parser(sub)
    add_tune_parser(sub)
    add_paymap_parser(sub)
    add_costs_parser(sub)
    soaked = sub.add_parser("soak", help="serve each drafter thousands of short requests at a sustained rate: "
                                         "memory and latency of the last requests against the first (hours)",
                            description=soak.__doc__.split("\n\n")[0])
    soak.add_options(soaked)
    return parser


def add_config_args(parser: Any, help: str = "config with a drafter (default: %(default)s)",
                    overrides: bool = True) -> None:
    """The config and (`overrides`) --set, as tuning's commands take them: one config, no variants."""
    parser.add_argument("config", nargs="?", default=DEFAULT_CONFIG, help=help)
    if overrides:
        parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                            help="override a config field (repeatable)")


def add_advise_parser(sub: Any) -> None:
    """`advise`: the config, the batch sizes, the traffic (the config's unless given), the load tests."""
    adv = sub.add_parser("advise", help="is this draft worth deploying, at which batch sizes: step costs, acceptance "
                                        "and speedup on your workload, measured on the engine, and a verdict")
    add_config_args(adv)
    adv.add_argument("--batches", type=int_list, default=[1, 32], metavar="B,B",
                     help="batch sizes (closed-loop users) to advise on (default: 1,32)")
    add_traffic_args(adv, temperature="the temperature your users send")
    adv.add_argument("--requests", type=int, default=None,
                     help="measured requests per batch size (default: max(32, 8 x batch))")
    adv.add_argument("--cost-repeats", type=positive_int, default=3, help="measurements per step cost (default: 3)")
    adv.add_argument("--repeat", type=positive_int, default=1,
                     help="load-test runs per batch size; the measured speedup is their mean (default: 1)")
    adv.add_argument("--vllm-bench", action="store_true", help="also run vLLM's serving benchmark after each run")
    adv.add_argument("--out", type=Path, default=None, help="folder for advice.md (default: reports/advise-<config>-<time>)")
    adv.add_argument("--dry-run", action="store_true",
                     help="print what would be measured (traffic, engines, the load test's plan) and exit; starts nothing")


def add_tune_parser(sub: Any) -> None:
    """`tune`: the config, the batch sizes, the traffic (the config's prompts and lengths unless given), the proof."""
    tun = sub.add_parser("tune", help="choose K for each batch size on the engine, write <config>-tuned.yaml with "
                                      "speculation.schedule, and prove it with load tests")
    add_config_args(tun, help="config to tune: vLLM's drafters take the schedule, the plugin drafters read it "
                              "themselves (default: %(default)s)")
    tun.add_argument("--batches", type=int_list, default=[1, 4, 16, 32], metavar="B,B",
                     help="batch sizes to choose K for (default: 1,4,16,32)")
    add_prompt_args(tun)
    tun.add_argument("--max-tokens", type=int, default=TUNE_MAX_TOKENS,
                     help="output tokens per proof request (short: the proof runs every K) (default: %(default)s)")
    traffic.add_fixed_length_flags(tun)
    # tune's --temperature is the list acceptance is averaged over, not a request's temperature.
    tun.add_argument("--temperature", type=temperature_list, default=None, metavar="T,T",
                     help="temperatures acceptance is averaged over (default: the config's speculation.temperatures)")
    tun.add_argument("--cost-repeats", type=positive_int, default=3, help="measurements per step time (default: 3)")
    tun.add_argument("--no-prove", action="store_true", help="write the tuned config without the proving load tests")
    tun.add_argument("--proof-temperature", type=temperature_list, default=[0.0, 1.0], metavar="T,T",
                     help="temperatures of the proving load tests (default: 0,1)")
    tun.add_argument("--proof-repeats", type=positive_int, default=2,
                     help="runs of each proof level, each beside a baseline run; their mean is judged (default: 2, "
                          "one in each order)")
    tun.add_argument("--requests", type=int, default=None,
                     help="measured requests per proof run (default: max(32, 8 x batch))")
    tun.add_argument("--output", type=Path, default=None, help="the tuned YAML (default: <config>-tuned.yaml beside it)")
    tun.add_argument("--out", type=Path, default=None, help="folder for tune.md (default: reports/tune-<config>-<time>)")
    tun.add_argument("--dry-run", action="store_true",
                     help="print what would be measured (traffic, engines, the proof's load tests) and exit; starts nothing")


def add_paymap_parser(sub: Any) -> None:
    pay = sub.add_parser("paymap", help="where speculation pays: speedup over batch size and acceptance, measured on "
                                        "the engine with synthetic acceptance, the break-even acceptance per batch size")
    add_config_args(pay)
    pay.add_argument("--batches", type=int_list, default=[1, 4, 16, 32], metavar="B,B",
                     help="batch sizes (closed-loop running requests) of the map (default: 1,4,16,32)")
    pay.add_argument("--grid", type=acceptance_grid, default=None, metavar="A,A",
                     help="per-token acceptance levels of the map, draft position i accepted at A^i "
                          "(default: 0.3,0.45,0.6,0.75,0.9)")
    pay.add_argument("--k", type=int_list, default=None, metavar="K,K",
                     help="K values to map; several give the best K per cell and a schedule (default: the config's K)")
    pay.add_argument("--acceptance", type=deployment_acceptance, default=None, metavar="A | P1,P2,..",
                     help="the deployment's own acceptance: per-token (0.62) or per position as vLLM counts it "
                          "(0.8,0.6,0.45,0.3)")
    pay.add_argument("--url", default=None, help="a running deployment whose /metrics give its per-position acceptance")
    pay.add_argument("--dummy-weights", action="store_true",
                     help="every engine loads dummy weights (load_format: dummy): same step costs, no weight download")
    pay.add_argument("--repeats", type=positive_int, default=3, help="generations per cell (default: 3)")
    pay.add_argument("--max-tokens", type=positive_int, default=128, help="output tokens a request (default: 128)")
    pay.add_argument("--temperature", type=float, default=0.0, help="temperature of the generations (default: 0)")
    pay.add_argument("--output", type=Path, default=None,
                     help="the schedule suggestion's YAML (default: <report>/<config>-paymap.yaml)")
    pay.add_argument("--out", type=Path, default=None, help="report folder (default: reports/paymap-<config>-<time>)")
    pay.add_argument("--dry-run", action="store_true",
                     help="print the plan (engines, cells, estimated time) and the exact engine arguments; "
                          "start nothing")


def add_costs_parser(sub: Any) -> None:
    costs = sub.add_parser("costs", help="measure engine step costs: plain decode, verification of K tokens, "
                                          "the config's drafter, at each batch size")
    add_config_args(costs, overrides=False)
    costs.add_argument("--k", type=int, default=None, help="K (default: the config's num_speculative_tokens)")
    costs.add_argument("--batches", type=int_list, default=[1, 32], metavar="B,B", help="batch sizes (default: 1,32)")
    costs.add_argument("--repeat", type=positive_int, default=5, help="measurements per point; the median is kept")
    costs.add_argument("--out", type=Path, default=None, help="also write the figures to this JSON file")
    costs.add_argument("--pair", action="store_true",
                       help="keep the figures beside the embedded pair and check its goals (make models); "
                            "measured once per pair unless --force")
    costs.add_argument("--force", action="store_true", help="with --pair: measure again")


def cmd_advise(opts: argparse.Namespace) -> int:
    from tuning.advise import AdviceSettings, advise, describe, dry_run

    try:
        overrides = as_overrides(opts.overrides)  # --set's texts parsed once, here
        declared, source = traffic.declared(opts.config, overrides)
    except (ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    request = RequestSettings.from_cli_args(opts, **traffic.chosen(opts, declared))
    settings = AdviceSettings(opts.config, overrides, sorted(set(opts.batches)), request,
                              opts.requests, opts.cost_repeats, opts.repeat, opts.vllm_bench, opts.out,
                              traffic_source=traffic.origin(source, traffic.given_options(opts)))
    if opts.dry_run:
        return dry_run(settings)
    print("\n".join(traffic.describe(request, settings.traffic_source)), file=sys.stderr, flush=True)
    try:
        advice = advise(settings)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(describe(advice))
    print(f"advice: {Path(advice.out) / 'advice.md'}")
    # 0: measured and advised; 1: the draft is unsuitable or the measurement failed; 2: not measured here.
    return {"advised": 0, "unsuitable": 1, "failed": 1, "cannot_measure": 2}[advice.status]


def cmd_tune(opts: argparse.Namespace) -> int:
    from tuning.tune import TuneSettings, describe, dry_run, tune

    try:
        overrides = as_overrides(opts.overrides)  # --set's texts parsed once, here
        declared, source = traffic.declared(opts.config, overrides)
    except (ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    values = traffic.chosen(opts, declared, TUNE_TRAFFIC)
    settings = TuneSettings(opts.config, overrides, sorted(set(opts.batches)),
                            RequestSettings(max_tokens=opts.max_tokens, **values),
                            opts.temperature, opts.cost_repeats, not opts.no_prove, opts.proof_temperature,
                            opts.requests, opts.output, opts.out, proof_repeats=opts.proof_repeats,
                            traffic_source=traffic.origin(source, traffic.given_options(opts, TUNE_TRAFFIC)))
    if opts.dry_run:
        return dry_run(settings)
    print("\n".join(traffic.describe(settings.request, settings.traffic_source)), file=sys.stderr, flush=True)
    try:
        result = tune(settings)
    except (ConfigError, ValueError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if not isinstance(exc, RuntimeError) else 1
    print(describe(result))
    print(f"tuning: {Path(result.out) / 'tune.md'}")
    # 0: tuned (and proven where asked); 1: the proof failed or the measurement did; 2: not measured here.
    return {"tuned": 0, "proven": 0, "not_proven": 1, "failed": 1, "cannot_measure": 2}[result.status]


def acceptance_grid(text: str) -> list[float]:
    """The map's acceptance levels: at least two, each strictly between 0 and 1."""
    try:
        values = sorted(set(float(x) for x in text.replace(" ", "").split(",") if x))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of acceptance levels") from None
    if len(values) < 2 or any(not 0 < v < 1 for v in values):
        raise argparse.ArgumentTypeError("give at least two acceptance levels between 0 and 1, e.g. 0.3,0.5,0.7,0.9")
    return values


def deployment_acceptance(text: str) -> list[float]:
    from tuning.paymap import parse_acceptance

    try:
        return parse_acceptance(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_paymap(opts: argparse.Namespace) -> int:
    from tuning.paymap import PaymapSettings, describe, describe_plan, make_plan, paymap

    if opts.acceptance and opts.url:
        print("error: give the deployment's acceptance either as --acceptance or by --url, not both", file=sys.stderr)
        return 2
    if opts.temperature < 0:
        print("error: --temperature must be >= 0", file=sys.stderr)
        return 2
    if opts.k and max(opts.k) > 32:
        raise SystemExit("error: --k: K is at most 32")
    settings = PaymapSettings(opts.config, opts.overrides, sorted(set(opts.batches)), ks=opts.k,
                              repeats=opts.repeats, max_tokens=opts.max_tokens, temperature=opts.temperature,
                              dummy_weights=opts.dummy_weights, deployment_acceptance=opts.acceptance,
                              url=opts.url, output=opts.output, out=opts.out)
    if opts.grid:
        settings.acceptance = opts.grid
    try:
        if opts.dry_run:
            print(describe_plan(make_plan(settings)))
            return 0
        result = paymap(settings)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(describe(result))
    print(f"paymap: {Path(result.out) / 'paymap.md'}")
    return 0 if result.status == "mapped" else 2


def cmd_costs(opts: argparse.Namespace) -> int:
    from models.embedded_pair import (COSTS_FILE, FREE_RUNNING_TEMPERATURE, engine_costs, ensure_pair, goal_lines,
                                      held_out_code_prompts)
    from tuning import step_costs

    # The pair's free-running goal: held-out prompts at vLLM's default temperature (models.embedded_pair.GOALS).
    # Greedy too, on the same prompts and on the code workload's: how often the pair loops.
    free_running = {"prompts": held_out_code_prompts(8, 600), "temperatures": [FREE_RUNNING_TEMPERATURE, 0.0],
                    "max_tokens": 128, "embedded": True,
                    "greedy_sets": {"code": [i.prompt for i in load_workload("code").items if i.prompt]}}

    pair = ensure_pair() if opts.pair else None
    cached = engine_costs(pair) if pair and not opts.force else None
    result = step_costs.StepCosts.from_json(cached) if cached else None
    if result is not None and "greedy_code" not in (result.acceptance or {}):
        result = None  # measured before the pair had its free-running and greedy content goals
    if result is None:
        result = step_costs.measure_costs(opts.config, opts.k, tuple(opts.batches), opts.repeat,
                                          free_running=free_running if pair else None)
        if pair:
            result.save(pair.root / COSTS_FILE)
    else:
        print(f"cached engine costs of the embedded pair ({pair.root / COSTS_FILE}; --force measures again)")
    if opts.out:
        result.save(opts.out)
    print(step_costs.describe(result))
    if pair:
        print("\n".join(["embedded pair goals:", *goal_lines(pair, result.to_json())]))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    opts = parser.parse_args(argv)
    if opts.command == "soak":
        soak.validate(parser, opts)
    # soak shows its progress in bars and their figures at the end: warnings only.
    logging.basicConfig(level=logging.WARNING if opts.command == "soak" else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    return {"costs": cmd_costs, "advise": cmd_advise, "tune": cmd_tune, "paymap": cmd_paymap,
            "soak": soak.soak}[opts.command](opts)


if __name__ == "__main__":
    sys.exit(main())
