"""Command line: `python -m loadtest run CONFIG ...` and `python -m loadtest compare [REPORT ...]`.

    python -m loadtest run default.yaml --users 1,32                 # spec vs baseline, batch 1 and 32
    python -m loadtest run default.yaml --users 1,8,32 --k 2,8       # plus K=2 and K=8 variants
    python -m loadtest run default.yaml --rates 0.5,1,2,4            # open loop: Poisson arrivals at each rate
    python -m loadtest run default.yaml --workers 2 --duration 60    # Locust master + 2 workers, 60 s a level
    python -m loadtest run default.yaml --temperature 0,0.7,1        # acceptance and speedup per temperature
    python -m loadtest run llama70b-7b.yaml --dry-run                # the plan (servers, starts, time), then exit
    python -m loadtest run --url http://gpu1:8000 --baseline-url http://gpu1:8001 --slo ttft_p95=500ms
                                                                     # servers already running elsewhere
    python -m loadtest compare                                       # table of the newest report
    python -m loadtest compare reports/a reports/b                   # reports side by side (compare.html)
    python -m loadtest capacity default.yaml --slo ttft_p95=500ms,tpot_p95=50ms
                                                                     # highest request rate within the targets
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path
from types import FrameType

from deploy import ConfigError, load_config
from deploy.config import DEFAULT_CONFIG, as_overrides
from loadtest import capacity_cli
from loadtest.traffic import request_settings
from loadtest.traffic import declared as traffic
from loadtest.arg_types import int_list, positive_int, rate_list, temperature_list
from loadtest.sweeps.plan import ORDERS
from loadtest.reports.report import compare_table, load_results, newest_report, write_report
from loadtest.traffic.request_settings import RequestSettings
from loadtest.sweeps.settings import SweepSettings
from loadtest.sweeps.runner import Sweep
from loadtest.measurement.slo import parse_targets
from loadtest.reports.sweep_summary import announce, exit_code


TRAFFIC_NO_TEMPERATURE = [f for f in traffic.TRAFFIC_FIELDS if f != "temperature"]  # run's is a list


def _slo(text: str) -> str:
    try:
        parse_targets(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loadtest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="start each variant's server, load it at each concurrency, write a report")
    run.add_argument("config", nargs="?", default=None,
                     help=f"config file or preset name (default: {DEFAULT_CONFIG}; with --url: read only when given, "
                          f"for the model name, API key variable and tokenizer)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                     help="override a config field for every variant (repeatable)")
    run.add_argument("--no-spec", action="store_true", help="run the baseline (speculation off) only")
    run.add_argument("--no-baseline", action="store_true", help="skip the baseline variant")
    run.add_argument("--k", type=int_list, default=[], metavar="K,K", help="extra speculative variants with these K")
    levels = run.add_mutually_exclusive_group()
    levels.add_argument("--users", type=int_list, default=None, metavar="C,C",
                        help="concurrency levels (closed-loop users) (default: 1,32)")
    levels.add_argument("--rates", type=rate_list, default=None, metavar="R,R",
                        help="open loop instead: arrival rates in requests/s; requests arrive by a Poisson process "
                             "whether or not earlier ones finished, nothing caps those in flight (so queueing shows); "
                             "speculation and baseline get the same arrivals (docs/load-tests.md)")
    run.add_argument("--repeat", type=positive_int, default=3,
                     help="runs of every variant at every concurrency; speedups get a 95%% interval (default: 3)")
    run.add_argument("--order", choices=ORDERS, default="auto",
                     help="alternate: the variants take turns every repeat (who goes first flips); grouped: each "
                          "variant's server starts once and runs all its levels and repeats; auto: grouped where "
                          "servers cannot be up together on GPUs, else alternate (default: auto)")
    run.add_argument("--dry-run", action="store_true",
                     help="print the plan (servers, starts, levels, estimated duration) and exit; starts nothing")
    run.add_argument("--requests", type=int, default=None,
                     help="measured requests per run (default: max(32, 8 x concurrency); with --rates: "
                          "max(32, 60 s x rate))")
    run.add_argument("--duration", type=float, default=None, metavar="S",
                     help="measure each level for S seconds instead of a request count (with --rates: the "
                          "requests arriving in S seconds)")
    run.add_argument("--warmup", type=int, default=1, help="warm-up requests per user before each level (default: 1)")
    request_settings.add_options(run, skip=("temperature",), from_config=traffic.TRAFFIC_FIELDS)
    run.add_argument("--temperature", type=temperature_list, default=None, metavar="T,T",
                     help="sampling temperatures (default: the config's traffic.temperature; 0: greedy); several, e.g. 0,0.7,1 (the config's "
                          "speculation.temperatures), run one sweep each and add a summary of acceptance and "
                          "speedup against temperature (temperature.md)")
    run.add_argument("--workers", type=int, default=0, help="Locust worker processes (0: one local process)")
    run.add_argument("--no-vllm-bench", action="store_true",
                     help="skip vLLM's serving benchmark after each Locust run (the independent check)")
    run.add_argument("--level-timeout", type=float, default=1800, help="seconds before a level is abandoned")
    run.add_argument("--startup-timeout", type=float, default=None, help="seconds to wait for each server")
    run.add_argument("--tolerance", type=float, default=0.05,
                     help="allowed difference between our token counts and the server's (default: 0.05)")
    run.add_argument("--slo", type=_slo, default=None, metavar="TARGETS",
                     help="service targets, e.g. ttft_p95=500ms,tpot_p95=50ms (metrics ttft, tpot, e2e): per run the "
                          "share of requests meeting each, the goodput, and the highest concurrency meeting all")
    remote = run.add_argument_group("servers already running (instead of starting them)")
    remote.add_argument("--url", default="", help="load this running server, e.g. one started by `make serve`")
    remote.add_argument("--baseline-url", default="", help="a running server without speculation to compare with")
    remote.add_argument("--model", default="", help="served model name (default: the config's, else the server's only one)")
    remote.add_argument("--tokenizer", default="",
                        help="tokenizer for vLLM's benchmark (default: the served model's folder when it is on this machine)")
    remote.add_argument("--api-key-env", default=None, metavar="VAR",
                        help="variable holding the servers' API key (default: the config's server.api_key_env)")
    run.add_argument("--out", type=Path, default=None, help="report folder (default: reports/<config>-<time>)")

    cmp = sub.add_parser("compare", help="print the batch comparison table of a report, or put several side by side")
    cmp.add_argument("report", nargs="*", type=Path, default=[],
                     help="report folder or results.json (default: the newest under reports/); two or more: side by "
                          "side (a table, an overlaid speedup plot, compare.md and compare.html)")
    cmp.add_argument("--allow-different", action="store_true",
                     help="compare reports whose workload, temperature or output length differ (refused otherwise)")
    cmp.add_argument("--out", type=Path, default=None,
                     help="with several reports: folder for compare.md/html (default: reports/compare-<time>)")
    cmp.add_argument("--users", type=int_list, default=None,
                     help="concurrency levels to show (default: all in the report)")
    capacity_cli.add_parser(sub, _slo)
    again = sub.add_parser("rejudge", help="judge a report's Locust-vs-benchmark agreement again with this code, "
                                            "from its kept records and benchmark results, and rewrite the report")
    again.add_argument("report", type=Path, help="report folder")
    return parser


def cmd_run(opts: argparse.Namespace) -> int:
    if opts.baseline_url and not opts.url:
        print("--baseline-url needs --url (the speculative server)", file=sys.stderr)
        return 2
    if opts.url and (opts.overrides or opts.k or opts.no_spec):
        print("--set, --k and --no-spec change the servers the sweep starts; with --url they run already",
              file=sys.stderr)
        return 2
    config = opts.config or ("" if opts.url else DEFAULT_CONFIG)
    try:
        overrides = as_overrides(opts.overrides)  # --set's texts parsed once, here
        declared, source = traffic.declared(config, overrides)
    except (ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    given = traffic.given_options(opts)
    opts.temperature = opts.temperature or [declared.temperature]
    request = RequestSettings.from_options(opts, **traffic.chosen(opts, declared, TRAFFIC_NO_TEMPERATURE),
                                           temperature=opts.temperature[0])
    settings = SweepSettings(
        config=config, overrides=overrides, no_spec=opts.no_spec, baseline=not opts.no_baseline,
        extra_k=opts.k, users=sorted(dict.fromkeys(opts.users or [1, 32])),
        rates=sorted(dict.fromkeys(opts.rates or [])), repeat=opts.repeat, order=opts.order,
        requests=opts.requests,
        duration_s=opts.duration, vllm_bench=not opts.no_vllm_bench,
        warmup=opts.warmup, request=request, traffic_source=traffic.origin(source, given),
        workers=opts.workers, level_timeout_s=opts.level_timeout,
        startup_timeout_s=opts.startup_timeout, tolerance=opts.tolerance, slo=opts.slo or "", url=opts.url,
        baseline_url=opts.baseline_url, model=opts.model, tokenizer=opts.tokenizer, api_key_env=opts.api_key_env,
        out=opts.out)

    if opts.dry_run:
        return dry_run(settings, opts.temperature)

    def on_term(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt  # same clean-up path as Ctrl-C: servers and Locust stopped

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)  # a closed terminal: stop the servers, keep the report
    if len(opts.temperature) > 1:
        return run_temperatures_cli(settings, opts.temperature)
    sweep = Sweep(settings)
    try:
        results = sweep.run()
    except KeyboardInterrupt:
        results = sweep.results
        print("interrupted: servers stopped; writing the partial report", file=sys.stderr)
    files = write_report(results, sweep.out)
    if not results["variants"]:  # nothing was measured: the reason is the whole story
        print(f"error: {'; '.join(results['problems'])}", file=sys.stderr)
        return exit_code(results)  # 130 when interrupted, else 2
    print()
    print(compare_table(results))
    print(f"\nstatus: {results['status']}" + (f" ({'; '.join(results['problems'])})" if results["problems"] else ""))
    print(f"report: {files['markdown']}  {files['html']}  {files['json']}")
    untested = untested_temperatures(settings, [settings.request.temperature])
    if untested:
        print(untested)
    return announce(exit_code(results))


def dry_run(settings: SweepSettings, temperatures: list[float]) -> int:
    """Print the sweep's plan for the machine its config describes; start nothing, build nothing."""
    try:
        plan = Sweep(settings).plan(dry_run=True)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    plan.temperatures = temperatures
    print(plan.describe(dry_run=True))
    return 0 if plan.servers else 2


def untested_temperatures(settings: SweepSettings, measured: list[float]) -> str:
    """A hint when the config is tuned for temperatures this run did not measure."""
    if not settings.config:
        return ""
    try:
        wanted = load_config(settings.config, settings.overrides).speculation.temperatures
    except (ConfigError, OSError):
        return ""
    missing = [t for t in wanted if t not in measured]
    if not missing:
        return ""
    listed = ",".join(f"{t:g}" for t in sorted({*wanted, *measured}))
    return (f"note: the config is tuned for temperatures {', '.join(f'{t:g}' for t in wanted)}; this run measured "
            f"{', '.join(f'{t:g}' for t in measured)}: add --temperature {listed} (LOADTEST_ARGS with make)")


def run_temperatures_cli(settings: SweepSettings, temperatures: list[float]) -> int:
    from loadtest.reports.temperature_report import summary_rows, summary_table
    from loadtest.sweeps.temperature import run_temperatures

    runs: list[dict] = []
    try:
        runs, out = run_temperatures(settings, temperatures)
    except KeyboardInterrupt:
        print("interrupted: servers stopped; the temperatures measured so far are in the summary", file=sys.stderr)
        return 130
    if not any(r["variants"] for r in runs):
        print(f"error: {'; '.join(p for r in runs for p in r['problems'])}", file=sys.stderr)
        return 2
    print()
    print(summary_table(summary_rows(runs)))
    statuses = {f"{r['temperature']:g}": r["status"] for r in runs}
    print(f"\nstatus by temperature: {statuses}")
    print(f"report: {out / 'temperature.md'} (each temperature's own report beside it)")
    if untested := untested_temperatures(settings, temperatures):
        print(untested)
    codes = [exit_code(r) for r in runs]
    return announce(max(codes, key=lambda c: (c != 0, c)))


def cmd_rejudge(opts: argparse.Namespace) -> int:
    from loadtest.reports.report import write_report
    from loadtest.sweeps.judging import rejudge

    results = json.loads((opts.report / "results.json").read_text())
    results.pop("comparisons", None)  # derived again by write_report
    files = write_report(rejudge(results, opts.report), opts.report)
    print(f"status: {results['status']}\nreport: {files['markdown']}")
    return 0


def cmd_compare(opts: argparse.Namespace) -> int:
    if len(opts.report) > 1:
        return compare_several(opts.report, opts.out, opts.allow_different)
    report = opts.report[0] if opts.report else newest_report()
    if report is None:
        print("no report found under reports/; run `make loadtest` first or give a report folder", file=sys.stderr)
        return 1
    if report.is_dir() and (report / "temperature.json").is_file():  # a run over several temperatures
        from loadtest.reports.temperature_report import load_runs, summary_rows, summary_table

        runs = load_runs(report)
        temperatures = ", ".join(format(r["temperature"], "g") for r in runs)
        print(f"{report}: config {runs[0]['config'] if runs else '?'}, temperatures {temperatures}")
        print(summary_table(summary_rows(runs)))
        print("each temperature's batch table: make compare REPORT=" + str(report / "temperature-<T>"))
        return 0
    try:
        results = load_results(report)
    except (OSError, ValueError) as exc:
        print(f"cannot read {report}: {exc}", file=sys.stderr)
        return 1
    print(f"{report}: config {results.get('config')}, status {results.get('status')}")
    print(compare_table(results, opts.users))
    if results.get("problems"):
        print("\nproblems: " + "; ".join(results["problems"]))
    return 0


def compare_several(reports: list[Path], out: Path | None, allow_different: bool) -> int:
    """Reports side by side; 2 when one cannot be read or they measured different work."""
    from loadtest.reports import compare

    try:
        files, text = compare.compare(reports, out or compare.default_out(), allow_different)
    except compare.Incomparable as exc:
        print(f"refusing to compare: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(text)
    print(f"\nreport: {files['markdown']}  {files['html']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    opts = build_parser().parse_args(argv)
    return {"run": cmd_run, "compare": cmd_compare, "rejudge": cmd_rejudge,
            "capacity": capacity_cli.cmd_capacity}[opts.command](opts)


if __name__ == "__main__":
    sys.exit(main())
