"""Soak each drafter on the embedded default: `make soak` (about 2 hours on 2 cores; a check, not a test).

For the embedded default's drafter and each of its alternatives (`configs/default.yaml`: small_model
native and plugin, bigram, ngram; those `make bench-drafters` measures), one server: warm-up requests, then `--requests` short requests (32 output
tokens) sent open loop, Poisson arrivals at a sustained rate, prompts of a built-in workload in
turn; the last `--window` arrivals repeat the first's gaps and prompts. Meanwhile the resident memory of the server's process tree (API server, engine core,
workers) is sampled every few seconds. The last `--window` requests are then held against the
first (`tuning.soak_report`): memory and latency within 10%, or the figure that DRIFTS. A drafter
whose per-request state grows without bound (caches, counts keyed by requests long finished)
shows here as rising memory and, often, latency.

The rate: `--rate` for every drafter, or per drafter `RATE_FRACTION` of the requests per second
it completed in a short closed-loop probe at `PROBE_USERS` concurrent users, so the server keeps
up and the queue stays short (an overloaded server's latency grows with its queue, which is no
drift of the drafter). Files in `--out` (default reports/soak): soak.json (after each drafter),
soak.md and soak.html, a plot per drafter, the server and Locust logs and each request's record.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path
from typing import Any, Self

import psutil
import requests
from tqdm import tqdm

from deploy import ConfigError, Override, Server, ServerStartError, free_port, load_config, plan_from_config
from deploy.config import overrides_as_text
from loadtest.measurement import prom
from loadtest.measurement import stats
from loadtest.arg_types import positive_int
from loadtest.traffic.client import auth_headers
from loadtest.traffic.locust_run import LocustJob, run_locust
from loadtest.traffic.request_settings import (MAX_TOKENS_HELP, TEMPERATURE_HELP, WORKLOAD_HELP, RequestSettings,
                                               add_timing_args)
from loadtest.progress import Progress
from loadtest.measurement.records import load_records
from loadtest.measurement.results import Closed, Load, Open
from loadtest.sampling import sampling
from loadtest.traffic.workloads import Workload, load_workload
from tuning import soak_report
from tuning.soak_report import DrafterSoak, SoakMeta, SoakReport

OUT_DIR = Path("reports/soak")
CONFIG = "default"


def drafters() -> dict[str, list[Override]]:
    """name -> overrides of the embedded default: `native`, its drafter as configured (vLLM's
    draft-model path), and each of its alternatives."""
    config = load_config(CONFIG)
    return {"native": [], **{name: [config.alternative_override(name)] for name in config.alternatives}}


DRAFTERS = drafters()
WINDOW = 500
TOLERANCE = 0.10
PROBE_USERS = 16
"""Enough users that the probe measures a loaded server (with a few, the rate it finds is low and the soak
takes far longer)."""
PROBE_REQUESTS = 64
RATE_FRACTION = 0.5
"""Of the probe's requests/s: Poisson bursts then find room, and the server's queue stays short."""


def tree_rss(pid: int) -> tuple[int, int]:
    """Resident bytes of process `pid` and all its descendants, summed, and how many processes
    they are. Raises psutil.NoSuchProcess when `pid` itself is gone; a child that exits meanwhile
    is skipped."""
    root = psutil.Process(pid)
    total, count = 0, 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
            count += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            if proc is root:
                raise
    return total, count


class _Sampler:
    """`sample()` every `every_s` seconds in a thread, from entering to leaving (once at each end
    too, `loadtest.sampling`); what it measured accumulates in `samples`."""

    def __init__(self, every_s: float, name: str):
        self.samples: list[list[float]] = []
        self._sampling = sampling(every_s, self.sample, name)

    def sample(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._sampling.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._sampling.__exit__(*exc)


class RssSampler(_Sampler):
    """Samples `tree_rss(pid)`: `samples` holds [epoch seconds, bytes, processes]."""

    def __init__(self, pid: int, every_s: float = 2.0):
        self.pid = pid
        super().__init__(every_s, "rss-sampler")

    def sample(self) -> None:
        try:
            rss, count = tree_rss(self.pid)
        except psutil.Error:
            return  # the server is gone: the run notices that itself
        self.samples.append([time.time(), rss, count])

    @property
    def latest_gib(self) -> float | None:
        return self.samples[-1][1] / soak_report.GIB if self.samples else None


class EngineSampler(_Sampler):
    """Scrapes the server's /metrics: `samples` holds `soak_report.EngineSample` rows (the speculation
    counters, the engine's per-token histogram, the requests running). They say whether a drift is
    the drafter's (its acceptance moved) or the engine's (the same acceptance, slower steps); a failed
    scrape is skipped."""

    def __init__(self, base_url: str, every_s: float = 10.0, headers: dict[str, str] | None = None):
        self.base_url = base_url
        self.headers = headers
        super().__init__(every_s, "metrics-sampler")

    def sample(self) -> None:
        try:
            snap = prom.scrape(self.base_url, timeout_s=5, headers=self.headers)
        except (requests.RequestException, ValueError):
            return  # busy or gone: the run notices a dead server itself
        per_token = snap.histogram(prom.HISTOGRAMS["per_token_latency_s"])
        self.samples.append([snap.taken_at, snap.total(prom.DRAFTS), snap.total(prom.DRAFT_TOKENS),
                             snap.total(prom.ACCEPTED), per_token.sum, per_token.count,
                             snap.total("vllm:num_requests_running")])


def check_varied(workload: Workload) -> None:
    """The run sends the workload's prompts in turn: refuse one whose consecutive prompts (the
    last and the first included) are the same, so that no two requests in a row are alike."""
    items = workload.items
    same = [i for i in range(len(items)) if (items[i].prompt, items[i].messages) ==
            (items[(i + 1) % len(items)].prompt, items[(i + 1) % len(items)].messages)]
    if len(items) < 2 or same:
        raise ValueError(f"workload {workload.name}: a soak needs prompts that vary from one request to the next; "
                         + ("it has one prompt" if len(items) < 2 else f"prompt {same[0] + 1} repeats the one before"))


def capacity(records: list[Any]) -> float | None:
    """Requests per second a closed-loop run completed (the client's request throughput: successful
    requests over the interval from the first sent to the last finished); None when none succeeded."""
    client = stats.summarize(records)
    return client.request_throughput if client.ok else None


class _Run:
    """One drafter's server and the Locust jobs sent to it."""

    def __init__(self, name: str, opts: argparse.Namespace):
        self.name = name
        self.opts = opts
        self.slug = soak_report.slug(name)
        # Checked here, so that a config this machine cannot serve fails this drafter only.
        self.resolved, self.plan = plan_from_config(CONFIG, [*DRAFTERS[name], Override("server.port", free_port())])
        self.server = Server(self.plan, opts.out / "logs" / f"server-{self.slug}.log")
        self.request = RequestSettings.from_cli_args(opts)

    def job(self, phase: str, requests: int, load: Load, repeat_head: int = 0) -> LocustJob:
        """A Locust job on this server at `load` (an open loop's last `repeat_head` arrivals repeat
        the first's gaps and prompts)."""
        return LocustJob(host=self.server.base_url, load=load, model=self.plan.served_name, request=self.request,
                         requests=requests, seed=self.opts.seed, repeat_head=repeat_head,
                         records_dir=self.opts.out / "records" / f"{self.slug}-{phase}",
                         log_path=self.opts.out / "logs" / f"locust-{self.slug}-{phase}.log",
                         api_key_env=self.resolved.config.server.api_key_env or "")

    def server_gone(self) -> str | None:
        return None if self.server.alive() else self.server.exit_reason()

    def closed_loop(self, phase: str, requests: int) -> list[Any]:
        job = self.job(phase, requests, Closed(PROBE_USERS))
        with Progress(f"{self.name} {phase}", requests, job.records_dir) as bar:
            outcome = run_locust(job, self.request.request_timeout_s * requests, self.server_gone, bar.tick)
        records = load_records(job.records_dir)
        if outcome.aborted:
            raise RuntimeError(f"{phase}: {outcome.aborted}")
        if not any(r.ok for r in records):
            raise RuntimeError(f"{phase}: every request failed: {records[0].error if records else 'none finished'}")
        return records

    def soak(self) -> DrafterSoak:
        """Start, warm up, find the rate, run the soak; the server is stopped whatever happens."""
        opts = self.opts
        result = DrafterSoak(self.name, overrides_as_text(DRAFTERS[self.name]))
        started = time.monotonic()
        tqdm.write(f"{self.name}: starting vLLM, log {self.server.log_path}")
        try:
            self.server.start()
            result.startup_s = self.server.wait_healthy(self.resolved.config.server.startup_timeout_s)
            self.closed_loop("warmup", opts.warmup)
            if opts.rate:
                result.rate, result.rate_source = opts.rate, "--rate"
            else:
                measured = capacity(self.closed_loop("probe", PROBE_REQUESTS))
                if not measured:
                    raise RuntimeError("the rate probe measured no throughput")
                result.rate, result.probe_requests_per_s = RATE_FRACTION * measured, measured
                result.rate_source = f"{RATE_FRACTION:g} x {measured:.2f}/s, the closed-loop probe at {PROBE_USERS} users"
            rate = result.rate
            tqdm.write(f"{self.name}: {opts.requests} requests at {rate:.2f}/s (about {opts.requests / rate / 60:.0f} min)")
            # The last window replays the first's arrival gaps and prompts: the two offer the same load,
            # so what differs between them is the server's state (Poisson windows of 500 differ by ~10%).
            job = self.job("soak", opts.requests, Open(rate), repeat_head=opts.window)
            # Open loop: the run lasts requests / rate; twice that, and a request's timeout, bound it.
            deadline = 2 * opts.requests / rate + self.request.request_timeout_s
            began = time.monotonic()
            with Progress(f"{self.name} soak", opts.requests, job.records_dir) as bar, \
                    RssSampler(self.server.process.pid, opts.sample_every) as sampler, \
                    EngineSampler(self.server.base_url, opts.metrics_every,
                                  auth_headers(self.resolved.config.server.api_key_env)) as engine:
                def tick() -> None:
                    bar.tick()
                    if sampler.latest_gib is not None:
                        bar.bar.set_description_str(f"{self.name} soak, RSS {sampler.latest_gib:.2f} GiB",
                                                    refresh=False)

                outcome = run_locust(job, deadline, self.server_gone, tick)
            result.run_s = time.monotonic() - began
            records = load_records(job.records_dir)
            result.processes = int(max((s[2] for s in sampler.samples), default=0))
            result.verdict = verdict = soak_report.judge(records, sampler.samples, opts.window, opts.tolerance,
                                                         expected=opts.requests, engine=engine.samples)
            if outcome.aborted:
                verdict.problems.append(outcome.aborted)
                verdict.status = "failed" if verdict.status == "ok" else verdict.status
            result.series = soak_report.series(records, sampler.samples, engine.samples)
        except (ServerStartError, RuntimeError, OSError) as exc:
            result.error = str(getattr(exc, "reason", None) or exc)
        finally:
            self.server.stop()
        result.wall_s = time.monotonic() - started
        return result


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options of `python -m tuning soak`."""
    parser.add_argument("--drafters", nargs="*", default=list(DRAFTERS), choices=list(DRAFTERS), metavar="NAME",
                        help=f"subset of: {', '.join(DRAFTERS)}")
    parser.add_argument("--requests", type=positive_int, default=5000, help="requests per drafter (%(default)s)")
    parser.add_argument("--rate", type=float, default=None,
                        help=f"requests per second for every drafter (default: per drafter, {RATE_FRACTION:g} x what "
                             f"it completes in a closed-loop probe at {PROBE_USERS} users)")
    parser.add_argument("--window", type=positive_int, default=WINDOW,
                        help="requests in each compared window, the first and the last (%(default)s)")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE,
                        help="largest change of a figure, last window against first, that passes (%(default)s)")
    parser.add_argument("--sample-every", type=float, default=2.0, help="seconds between RSS samples (%(default)s)")
    parser.add_argument("--metrics-every", type=float, default=10.0,
                        help="seconds between scrapes of the server's /metrics (acceptance, engine per-token "
                             "latency: not judged, they say whose a drift is) (%(default)s)")
    parser.add_argument("--warmup", type=positive_int, default=8, help="warm-up requests, not judged (%(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the Poisson arrivals (%(default)s)")
    # Each request, with the soak's own defaults (chat prompts, short answers); the rest are RequestSettings'.
    parser.add_argument("--workload", default="chat", help=f"{WORKLOAD_HELP} (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=32, help=f"{MAX_TOKENS_HELP} (default: %(default)s)")
    parser.add_argument("--temperature", type=float, default=RequestSettings.temperature,
                        help=f"{TEMPERATURE_HELP} (default: %(default)s)")
    add_timing_args(parser, arrival_gap=False)
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="report folder (%(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (servers, requests, estimate) and exit")


def dry_run(opts: argparse.Namespace) -> int:
    """The soak's plan: a server per drafter, its requests and rate, about how long; starts nothing."""
    from loadtest.sweeps.plan import ASSUMED_START, duration_text

    names = list(dict.fromkeys(opts.drafters))
    rate = (f"{opts.rate:g} requests/s (--rate): about {duration_text(opts.requests / opts.rate)} of arrivals each"
            if opts.rate else
            f"{RATE_FRACTION:g} x the requests/s each completes in a closed-loop probe of {PROBE_REQUESTS} requests at "
            f"{PROBE_USERS} users, measured first (so the duration is known only then: at 2 requests/s "
            f"{opts.requests} requests take {duration_text(opts.requests / 2)})")
    print("\n".join([
        f"soak plan (dry run: nothing starts): {CONFIG}.yaml (the embedded pair), workload '{opts.workload}', "
        f"{opts.max_tokens} output tokens a request, temperature {opts.temperature:g}",
        "  servers, one at a time, one start each (config overrides):",
        *[f"    {name}: {' '.join(map(str, DRAFTERS[name])) or '(the config as it is)'}" for name in names],
        f"  each: {opts.warmup} warm-up requests, then {opts.requests} requests open loop (Poisson arrivals) at {rate}",
        f"  judged: the last {opts.window} requests' memory and latency against the first {opts.window}'s "
        f"(within {opts.tolerance:.0%})",
        f"  server starts: {len(names)}, about {duration_text(ASSUMED_START['cpu'][0])} each (assumed)"]))
    return 0


def validate(parser: argparse.ArgumentParser, opts: argparse.Namespace) -> None:
    """Refuse settings that cannot be judged, before any server starts."""
    if opts.requests < 2 * opts.window:
        parser.error(f"--requests {opts.requests} cannot fill two windows of --window {opts.window}")
    if opts.rate is not None and opts.rate <= 0:
        parser.error("--rate must be above 0")
    if not 0 < opts.tolerance < 1:
        parser.error("--tolerance is a fraction between 0 and 1, e.g. 0.1")
    if opts.sample_every <= 0 or opts.metrics_every <= 0:
        parser.error("--sample-every and --metrics-every must be above 0")
    try:
        check_varied(load_workload(opts.workload))
    except ValueError as exc:
        parser.error(str(exc))


def soak(opts: argparse.Namespace) -> int:
    """Soak every drafter in `opts.drafters`; write the report after each. 0: every drafter
    stayed within the tolerance with no failed request; 1: otherwise."""
    if opts.dry_run:
        return dry_run(opts)
    names = list(dict.fromkeys(opts.drafters))
    workload = load_workload(opts.workload)
    rule = (f"{opts.rate:g} requests/s for every drafter (--rate)" if opts.rate else
            f"each drafter's rate {RATE_FRACTION:g} x the requests/s it completed in a closed-loop probe of "
            f"{PROBE_REQUESTS} requests at {PROBE_USERS} users")
    meta = SoakMeta(config=CONFIG, requests=opts.requests, window=opts.window, tolerance=opts.tolerance,
                    max_tokens=opts.max_tokens, workload=opts.workload, prompts=len(workload.items),
                    temperature=opts.temperature, seed=opts.seed, warmup=opts.warmup, sample_every_s=opts.sample_every,
                    metrics_every_s=opts.metrics_every, rate_rule=rule, repeat_head=opts.window,
                    machine=f"{platform.machine()}, {os.cpu_count()} CPUs", date=time.strftime("%Y-%m-%d %H:%M:%S"))
    report = SoakReport(meta)
    for name in names:
        try:
            result = _Run(name, opts).soak()
        except (ConfigError, OSError, ValueError) as exc:
            result = DrafterSoak(name, overrides_as_text(DRAFTERS[name]), error=f"config: {exc}")
        report.drafters.append(result)
        soak_report.write(report, opts.out)
        tqdm.write(soak_report.verdict_line(result))
    print("\n".join(soak_report.verdict_line(r) for r in report.drafters))
    print(f"report: {opts.out / 'soak.md'}")
    return soak_report.exit_code(report)
