"""`python -m loadtest capacity CONFIG --slo ...`: its options and the command (the search itself is
`loadtest.sweeps.capacity`, the report `loadtest.reports.capacity_report`)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from deploy import ConfigError
from deploy.config import DEFAULT_CONFIG
from loadtest.traffic import declared as traffic
from loadtest.interrupts import interrupt_on
from loadtest.measurement.capacity_figures import SearchRequest, headline
from loadtest.sweeps.capacity import Capacity, CapacitySettings
from loadtest.sweeps.settings import (SweepSettings, add_level_args, add_remote_args, add_servers_args,
                                      default_out_dir, slo_targets)
from loadtest.traffic.request_settings import add_timing_args, add_traffic_args, given_fields
from loadtest.traffic.endpoint import EndpointError


def add_parser(sub: Any) -> None:
    """`capacity`: the sweep's groups it shares, worded for levels a search chooses, and the search's."""
    p = sub.add_parser("capacity", help="the highest request rate each variant sustains within service targets, "
                                        "and where speculation stops paying",
                       description="Open-loop Poisson arrivals at rates chosen by a search: for speculation and "
                                   "the baseline, the highest rate at which every run meets every service target; "
                                   "the rate where speculation stops paying; vLLM's benchmark as a second opinion "
                                   "below capacity; each variant at twice its capacity (overload). Writes "
                                   "capacity.json, capacity.md and report.html (docs/load-tests.md).")
    p.add_argument("--slo", type=slo_targets, required=True, metavar="TARGETS",
                   help="service targets every run must meet, e.g. ttft_p95=500ms,tpot_p95=50ms (metrics ttft, tpot, "
                        "e2e)")
    add_servers_args(p, f"config file or preset name (default: {DEFAULT_CONFIG}; with --url: read only when given)",
                     no_spec_help="the baseline (speculation off) only: its capacity, no speedup")
    CapacitySettings.add_cli_args(p)
    level = p.add_argument_group("each level")
    level.add_argument("--requests", type=int, default=None,
                       help="measured requests per level (default: max(32, 60 s x rate))")
    level.add_argument("--duration", dest="duration_s", type=float, default=None, metavar="S",
                       help="instead: the requests arriving in S seconds at the level's rate")
    level.add_argument("--warmup", type=int, default=SweepSettings.warmup,
                       help="warm-up requests per warm-up user (default: %(default)s)")
    add_traffic_args(level)
    add_timing_args(level, arrival_gap=False)  # open loop only: no users to start apart
    add_level_args(level, vllm_bench=False)
    add_remote_args(p, url="the running server with speculation", baseline_url="a running server without speculation",
                    tokenizer="tokenizer for vLLM's benchmark", api_key_env="variable holding the servers' API key")
    p.add_argument("--out", type=Path, default=None, help="report folder (default: reports/<config>-capacity-<time>)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (traffic, servers, starts, the search's levels at most, estimated duration) "
                        "and exit; starts nothing")


def sweep_settings(opts: argparse.Namespace) -> SweepSettings:
    """The sweep that serves the variants: open loop, vLLM's benchmark off (the second opinion
    turns it on for its own levels), levels chosen by the search."""
    settings = SweepSettings.from_cli_args(opts, repeat=max(opts.repeat, 2), vllm_bench=False, loop="open")
    settings.out = settings.out or default_out_dir(settings.config or "running-servers", "-capacity")
    return settings


def cmd_capacity(opts: argparse.Namespace) -> int:
    from loadtest.sweeps.runner import Sweep

    if opts.baseline_url and not opts.url:
        print("--baseline-url needs --url (the speculative server)", file=sys.stderr)
        return 2
    if opts.url and (opts.overrides or opts.no_spec):
        print("--set and --no-spec change the servers the command starts; with --url they run already", file=sys.stderr)
        return 2
    settings = CapacitySettings(**given_fields(CapacitySettings, opts))  # --slo and the search's options
    try:
        settings.check()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    if opts.dry_run:
        return dry_run(opts, settings)

    interrupt_on(signal.SIGTERM, signal.SIGHUP)
    try:
        sweep = Sweep(sweep_settings(opts))
    except (ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return search(sweep, settings)


def search(sweep: Any, settings: CapacitySettings) -> int:
    """Serve the sweep's variants, search each one's capacity, write and print the report."""
    from loadtest.reports import capacity_report
    from loadtest.sweeps.capacity import SweepLevels
    from loadtest.sweeps.provenance import machine_info

    out = sweep.out
    request = sweep.request
    said = traffic.describe(request, sweep.settings.traffic_source)
    print("\n".join(said), file=sys.stderr, flush=True)
    context = {"config": sweep.settings.config or sweep.settings.url, "machine": machine_info(), "traffic": said,
               "request": SearchRequest(workload=request.workload, api=request.api, max_tokens=request.max_tokens,
                                        fixed_length=request.fixed_length, temperature=request.temperature)}
    run: Capacity | None = None
    code = 0
    try:
        with sweep.serving():
            run = Capacity(SweepLevels(sweep), settings, out, context=context)
            run.run()
    except KeyboardInterrupt:
        print("interrupted: servers stopped; writing the report of what was measured", file=sys.stderr)
        code = 130
    except (ConfigError, EndpointError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if run is None:
        return code or 2
    result = run.result
    files = capacity_report.write(result, out)
    print()
    print("\n".join(headline(result)))
    print(f"\nstatus: {result.status}" + (f" ({'; '.join(result.problems)})" if result.problems else ""))
    print(f"report: {files['markdown']}  {files['html']}  {out / 'capacity.json'}")
    from loadtest.reports.sweep_summary import announce

    return announce(capacity_report.exit_code(result))


LEVEL_OVERHEAD_S = 30.0
"""Per level besides its arrivals: warm-up, Locust's start, settled /metrics scrapes."""


def most_levels(settings: CapacitySettings) -> int:
    """Levels one variant's search, scan and second opinion can take at most: every rate the search
    may ask for, the boundary rates' repeats, the scan's rates and the second opinion's two."""
    return settings.max_steps + 2 * (settings.repeat - 1) + settings.scan_steps + (2 if settings.second_opinion else 0)


def dry_run(opts: argparse.Namespace, settings: CapacitySettings) -> int:
    """Print what `capacity` would do on the machine its config describes; start nothing."""
    from loadtest.sweeps.plan import duration_text
    from loadtest.sweeps.settings import OPEN_LOOP_SECONDS
    from loadtest.sweeps.runner import Sweep

    try:
        sweep = Sweep(sweep_settings(opts))
        plan = sweep.plan(dry_run=True)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    s = sweep.settings
    level_s = (s.duration_s or OPEN_LOOP_SECONDS) + LEVEL_OVERHEAD_S
    levels = most_levels(settings)
    starts = [] if s.url else plan.servers
    # Servers that cannot be up together (GPUs a server fills) take turns: a start at every switch,
    # and the search measures both variants at every rate it visits.
    switches = 1 if plan.together or len(starts) < 2 else levels + (1 if settings.overload_s else 0)
    start_s = switches * sum(plan.start_estimate(x).seconds for x in starts)
    load_s = len(plan.servers) * (levels * level_s + settings.overload_s)
    lines = [f"capacity plan (dry run: nothing starts): {s.config or s.url}",
             *[f"  {line}" for line in plan.traffic]]
    if plan.skipped:
        lines.append("  planned for the machine the config describes; checks this machine fails, skipped:")
        lines += [f"    - {p}" for p in plan.skipped]
    lines.append("  variants, each on its own server" + (" (already running)" if s.url else ", up together"
                                                          if plan.together else ", one at a time") + ":")
    width = max(len(x.name) for x in plan.servers)
    lines += [f"    {x.name:<{width}}  {x.label}; {x.url or x.models}" for x in plan.servers]
    if starts:
        lines.append(f"  server starts: {len(starts)} (each once, for the whole search)" if switches == 1 else
                     f"  server starts: up to {switches * len(starts)} (the servers cannot be up together, and the "
                     f"search measures both variants at every rate: one start at every switch; --url with two "
                     f"running servers (make serve on two machines) takes none)")
        lines += [f"    {x.name} starts in {plan.start_text(x)}" for x in starts]
    else:
        lines.append("  server starts: none (servers already running)")
    lines.append(f"  levels: open loop (Poisson arrivals) from {settings.start_rate:g} req/s, doubled until a rate "
                 f"fails the targets ({settings.slo}), halved while it fails, then bisected to within "
                 f"{settings.precision:.0%}" + (f", never above {settings.max_rate:g} req/s" if settings.max_rate else "")
                 + f"; at most {settings.max_steps} rates a variant, boundary rates {settings.repeat} times, "
                 f"{settings.scan_steps} scan rate(s) above while speculation pays"
                 + ("; vLLM's benchmark beside Locust at 50% and 80% of the smaller capacity" if settings.second_opinion
                    else "")
                 + (f"; {settings.overload_s:g} s of each variant at twice its capacity" if settings.overload_s else ""))
    lines.append(f"  each level: the requests arriving in {s.duration_s or OPEN_LOOP_SECONDS:g} s at its rate "
                 f"(at least 32), about {duration_text(level_s)} with its warm-up")
    lines.append(f"  estimated duration: at most about {duration_text(start_s + load_s)} "
                 f"({duration_text(start_s)} starting servers, {levels} levels of each variant at most); a search "
                 f"that brackets early takes less")
    lines += [f"  note: {n}" for n in plan.notes]
    print("\n".join(lines))
    return 0 if plan.servers else 2
