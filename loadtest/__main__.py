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
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from deploy import ConfigError, load_config
from loadtest import capacity_cli
from loadtest.arg_types import int_list
from loadtest.interrupts import interrupt_on
from loadtest.measurement.results import SweepResults
from loadtest.reports.report import compare_table, newest_report, write_report
from loadtest.sweeps.settings import SweepSettings
from loadtest.sweeps.runner import Sweep
from loadtest.reports.sweep_summary import announce, exit_code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loadtest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_parser(sub)
    add_compare_parser(sub)
    capacity_cli.add_parser(sub)
    again = sub.add_parser("rejudge", help="judge a report's Locust-vs-benchmark agreement again with this code, "
                                            "from its kept records and benchmark results, and rewrite the report")
    again.add_argument("report", type=Path, help="report folder")
    return parser


def add_run_parser(sub: Any) -> None:
    """`run`: the sweep's options (declared by `SweepSettings`)."""
    run = sub.add_parser("run", help="start each variant's server, load it at each concurrency, write a report")
    SweepSettings.add_cli_args(run)
    run.add_argument("--dry-run", action="store_true",
                     help="print the plan (servers, starts, levels, estimated duration) and exit; starts nothing")


def add_compare_parser(sub: Any) -> None:
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


def cmd_run(opts: argparse.Namespace) -> int:
    if opts.baseline_url and not opts.url:
        print("--baseline-url needs --url (the speculative server)", file=sys.stderr)
        return 2
    if opts.url and (opts.overrides or opts.extra_k or opts.no_spec):
        print("--set, --k and --no-spec change the servers the sweep starts; with --url they run already",
              file=sys.stderr)
        return 2
    try:
        settings = SweepSettings.from_cli_args(opts)
    except (ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    temperatures = opts.temperature or [settings.request.temperature]  # not given: the config's

    if opts.dry_run:
        return dry_run(settings, temperatures)

    interrupt_on(signal.SIGTERM, signal.SIGHUP)  # a kill or a closed terminal: servers stopped, report kept
    if len(temperatures) > 1:
        return run_temperatures_cli(settings, temperatures)
    sweep = Sweep(settings)
    try:
        results = sweep.run()
    except KeyboardInterrupt:
        results = sweep.results
        print("interrupted: servers stopped; writing the partial report", file=sys.stderr)
    files = write_report(results, sweep.out)
    if not results.variants:  # nothing was measured: the reason is the whole story
        print(f"error: {'; '.join(results.problems)}", file=sys.stderr)
        return exit_code(results)  # 130 when interrupted, else 2
    print()
    print(compare_table(results))
    print(f"\nstatus: {results.status}" + (f" ({'; '.join(results.problems)})" if results.problems else ""))
    print(f"report: {files['markdown']}  {files['html']}  {files['json']}")
    if untested := untested_temperatures(settings, [settings.request.temperature]):
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

    try:
        runs, out = run_temperatures(settings, temperatures)
    except KeyboardInterrupt:
        print("interrupted: servers stopped; the temperatures measured so far are in the summary", file=sys.stderr)
        return 130
    if not any(r.results.variants for r in runs):
        print(f"error: {'; '.join(p for r in runs for p in r.results.problems)}", file=sys.stderr)
        return 2
    print()
    print(summary_table(summary_rows(runs)))
    statuses = {f"{r.temperature:g}": r.results.status for r in runs}
    print(f"\nstatus by temperature: {statuses}")
    print(f"report: {out / 'temperature.md'} (each temperature's own report beside it)")
    if untested := untested_temperatures(settings, temperatures):
        print(untested)
    codes = [exit_code(r.results) for r in runs]
    return announce(max(codes, key=lambda c: (c != 0, c)))


def cmd_rejudge(opts: argparse.Namespace) -> int:
    from loadtest.sweeps.judging import rejudge

    results = SweepResults.load(opts.report)
    results.comparisons = None  # derived again by write_report
    files = write_report(rejudge(results, opts.report), opts.report)
    print(f"status: {results.status}\nreport: {files['markdown']}")
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
        temperatures = ", ".join(format(r.temperature, "g") for r in runs)
        print(f"{report}: config {runs[0].results.config if runs else '?'}, temperatures {temperatures}")
        print(summary_table(summary_rows(runs)))
        print("each temperature's batch table: make compare REPORT=" + str(report / "temperature-<T>"))
        return 0
    try:
        results = SweepResults.load(report)
    except (OSError, ValueError) as exc:
        print(f"cannot read {report}: {exc}", file=sys.stderr)
        return 1
    print(f"{report}: config {results.config}, status {results.status}")
    print(compare_table(results, opts.users))
    if results.problems:
        print("\nproblems: " + "; ".join(results.problems))
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
