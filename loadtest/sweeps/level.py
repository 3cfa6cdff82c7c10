"""One level of one variant on its running server: warm-up (not measured), a settled `/metrics`
snapshot, the measured Locust run (closed loop at a concurrency, or open loop at an arrival
rate), another snapshot, then the judging: the client's figures against the server's counters,
notes on the load generator, and vLLM's serving benchmark on the same server as a second opinion.
The sweep (`loadtest.sweeps.runner`) chooses the levels and keeps their results."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy import Server
from plugins import step_profile
from loadtest.measurement import prom, slo, stats
from loadtest.measurement.figures import ClientFigures, GeneratorLag, LocustRun
from loadtest.measurement.records import RequestRecord
from loadtest.measurement.results import Closed, LevelResult, Load, Open
from loadtest.progress import Progress
from loadtest.sweeps.judging import (delivery_notes, judge_second_opinion, load_generator_lag, load_generator_notes,
                                     load_records, schedule_start, send_lag_notes)
from loadtest.sweeps.plan import RATE_WARMUP_USERS
from loadtest.sweeps.servers import Running
from loadtest.sweeps.settings import SweepSettings, Variant, configured_k, requests_for, requests_for_rate
from loadtest.traffic import vllm_bench
from loadtest.traffic.client import auth_headers
from loadtest.traffic.endpoint import RemoteServer
from loadtest.traffic.locust_run import LocustJob, LocustOutcome, run_locust
from loadtest.traffic.request_settings import RequestSettings
from loadtest.traffic.workloads import Workload

log = logging.getLogger("specdeploy.loadtest")


@dataclass(frozen=True)
class Measured:
    """How much an open-loop level measures and whether vLLM's benchmark follows it: the sweep's
    settings' by default; a search that picks its levels asks for its own
    (`Sweep.rate_level`), the settings unchanged."""

    requests: int | None
    """Measured requests (None: those arriving in `duration_s`, else the default length)."""
    duration_s: float | None
    """The requests arriving in this long at the level's rate are measured (None: `requests`)."""
    vllm_bench: bool
    """vLLM's serving benchmark after the Locust run, on the same server, as a second opinion."""


@dataclass
class LevelRun:
    """One closed-loop level's context: the variant's server, the users, names and the request count.
    What differs in an open loop is `ScheduledRun`'s."""

    state: Running
    users: int
    """Locust's users: those of the measured run (closed loop), or of the warm-up (open loop)."""
    tag: str
    """Names its files: `<variant>-c<users>[-r<repeat>]`."""
    title: str
    total: int
    """Measured requests (0: a run of `duration_s`)."""
    duration_s: float | None
    """The measured length asked (closed loop: the run lasts this long where `total` is 0; open
    loop: its requests are those arriving in it); shown by the progress bar."""
    vllm_bench: bool
    """vLLM's benchmark follows the Locust run."""
    seed = 0
    """The arrival schedule's seed (an open loop's)."""

    def pacing(self) -> dict[str, Any]:
        """How Locust paces the measured run: users for `duration_s` (or until `total` requests)."""
        return {"load": Closed(self.users), "duration_s": self.duration_s}

    def client_figures(self, level: LevelResult, records: list[RequestRecord], folder: Path) -> list[RequestRecord]:
        """The client's figures of the measured run into `level`; the records sent (all of them here)."""
        level.client = stats.summarize(records, self.state.embedded)
        level.load_generator = load_generator_lag(records, folder)
        return records

    def generator_notes(self, outcome: LocustOutcome, workers: int, lag: GeneratorLag | None) -> list[str]:
        """What may have limited Locust: its CPU, its loop, and requests sent late after the previous response."""
        return load_generator_notes(outcome, workers, lag) + send_lag_notes(lag)

    @property
    def server(self) -> Server | RemoteServer:
        assert self.state.server is not None
        return self.state.server

    @property
    def metrics(self) -> bool:
        """Whether the server's /metrics can be read (a running server given by URL may hide it)."""
        return self.state.entry.metrics is not False

    @property
    def auth(self) -> dict[str, str] | None:
        return auth_headers(self.state.api_key_env)

    def server_gone(self) -> str | None:
        return None if self.server.alive() else self.server.exit_reason()


@dataclass
class ScheduledRun(LevelRun):
    """An open-loop level: requests arriving at `rate` a second by a Poisson process seeded with `seed`,
    whatever is in flight (`users` are the warm-up's)."""

    rate: float = 0.0
    seed: int = 0

    def pacing(self) -> dict[str, Any]:
        return {"load": Open(self.rate), "seed": self.seed, "duration_s": None}

    def client_figures(self, level: LevelResult, records: list[RequestRecord], folder: Path) -> list[RequestRecord]:
        # Every request of the schedule ends as one outcome; the client's figures are over those
        # sent, timed from the schedule's start as vLLM's benchmark times its run.
        sent = [r for r in records if r.outcome != "unsent"]
        level.client = stats.summarize(sent, self.state.embedded, schedule_start(sent, self.rate, self.total, self.seed))
        level.open_loop = stats.open_loop(records, self.rate, self.total)
        level.outcomes = level.open_loop.outcomes
        level.load_generator = load_generator_lag(sent, folder)
        return sent

    def generator_notes(self, outcome: LocustOutcome, workers: int, lag: GeneratorLag | None) -> list[str]:
        # How late requests left is judged against the schedule (`stats.open_loop`: `behind`).
        return load_generator_notes(outcome, workers, lag)


class LevelRunner:
    """Runs the levels of one sweep: `closed` (a concurrency) and `open` (an arrival rate), each
    warm-up -> settled /metrics snapshot -> measured Locust run -> snapshot -> judge, into a
    `LevelResult`; files under `out` (records/, locust/, logs/, vllm-bench/)."""

    def __init__(self, settings: SweepSettings, request: RequestSettings, out: Path, workload: Workload,
                 targets: list[slo.Target]):
        self.settings = settings
        self.request = request
        """What each request looks like (the sweep's: `Sweep.request`), for Locust and vLLM's benchmark."""
        self.out = out
        self.workload = workload
        """The sweep's workload (vLLM's benchmark's dataset, and the prompts' order it is matched by)."""
        self.targets = targets
        """Service targets each level is held to (`loadtest.measurement.slo`); empty: none."""

    def at(self, load: Load, state: Running, variant: Variant, repeat: int, title: str) -> LevelResult:
        """One level at `load`: `closed` at its users or `open` at its rate."""
        run = {Closed: self.closed, Open: self.open}[type(load)]
        return run(state, variant, load.at, repeat, title)  # type: ignore[operator]

    def closed(self, state: Running, variant: Variant, users: int, repeat: int, title: str) -> LevelResult:
        """warm-up -> settled /metrics snapshot -> measured Locust run -> snapshot -> judge."""
        s = self.settings
        run = LevelRun(state, users, f"{variant.name}-c{users}" + (f"-r{repeat}" if s.repeat > 1 else ""),
                       title, 0 if s.duration_s else requests_for(users, s.requests, s.requests_per_user, s.requests_min),
                       s.duration_s, s.vllm_bench and (repeat == 1 or s.vllm_bench_every_repeat))
        level = Closed(users).level(repeat)
        level.requests, level.duration_target_s = run.total or None, s.duration_s
        level.configured_k = configured_k(state.resolved, variant, users)
        return self.run(run, level)

    def open(self, state: Running, variant: Variant, rate: float, repeat: int, title: str, tag_suffix: str = "",
             measured: Measured | None = None) -> LevelResult:
        """An open-loop level: closed-loop warm-up -> settled snapshot -> the open-loop Locust run
        at `rate` -> snapshot -> judge (vLLM's benchmark at the same rate and seed). `measured`:
        its length and second opinion (default: the settings')."""
        s = self.settings
        m = measured or Measured(s.requests, s.duration_s, s.vllm_bench)
        total = requests_for_rate(rate, m.requests, m.duration_s)
        tag = f"{variant.name}-rate{rate:g}" + (f"-r{repeat}" if s.repeat > 1 else "") + tag_suffix
        bench = m.vllm_bench and (measured is not None or repeat == 1 or s.vllm_bench_every_repeat)
        # The arrival schedule's seed: one per repeat, shared by all variants.
        run = ScheduledRun(state, RATE_WARMUP_USERS, tag, title, total, m.duration_s, bench, rate=rate, seed=repeat)
        level = Open(rate).level(repeat)
        level.seed, level.requests = run.seed, total
        level.configured_k = None if variant.no_speculation else variant.k
        return self.run(run, level)

    def run(self, run: LevelRun, level: LevelResult) -> LevelResult:
        """What every level does: warm-up -> settled /metrics snapshot -> the measured Locust run
        (closed or open loop) -> snapshot -> judge, into `level` (which says what is measured: its
        load, repeat, K)."""
        failed = self._warm_up(run)
        before = None
        if not failed and run.metrics:
            before, failed = self._snapshot(run, "/metrics before the run")
        if failed:
            level.status, level.problems = "failed", [failed]
            return level
        steps = run.state.step_profile
        steps_before = step_profile.read_settled(steps) if steps else None
        outcome, records = self._measure(run, level)
        if steps and run.server.alive():
            level.step_ms = step_profile.per_step_ms(steps_before or {}, step_profile.read_settled(steps)) or None
        after = None
        if before is not None and run.server.alive():
            after, problem = self._snapshot(run, "/metrics after the run")
            if problem:
                level.problems.append(problem)
        ol = level.open_loop
        if ol and ol.behind:
            level.problems.append("the load generator fell behind the arrival schedule: "
                                  + "; ".join(ol.behind_reasons) + " (the offered load was not the rate asked)")
        # An open loop's unsent requests were never sent: nothing of theirs to judge (they count in its outcomes).
        self._judge(run, level, outcome, [r for r in records if r.outcome != "unsent"], before, after)
        _log_level(run.tag, level)
        return level

    def _locust_job(self, run: LevelRun, phase: str, requests: int, measured: bool) -> LocustJob:
        s, tag = self.settings, run.tag
        return LocustJob(
            host=run.server.base_url, records_dir=self.out / "records" / f"{tag}{phase}",
            model=run.state.served_name, request=self.request, requests=requests,
            # The measured run only is paced by its kind of load (an open loop's warm-up is a closed loop).
            **(run.pacing() if measured else {"load": Closed(run.users)}), workers=s.workers,
            log_path=self.out / "logs" / f"locust-{tag}{phase}.log", api_key_env=run.state.api_key_env,
            csv_prefix=self.out / "locust" / tag if measured else None,
            html=self.out / "locust" / f"{tag}.html" if measured else None)

    def _warm_up(self, run: LevelRun) -> str | None:
        """Requests not measured, so the run starts on a warm server; why the level fails, or None."""
        count = run.users * self.settings.warmup
        if count <= 0:
            return None
        warm = self._locust_job(run, "-warmup", count, measured=False)
        with Progress(f"{run.title} warm-up", count, warm.records_dir) as bar:
            outcome = run_locust(warm, self.settings.level_timeout_s, run.server_gone, bar.tick)
        if outcome.aborted:
            return f"warm-up: {outcome.aborted}"
        records = load_records(warm.records_dir)
        if not any(r.ok for r in records):
            # Nothing works (wrong model name, no chat template, ...): say why instead of
            # running the measured phase into the same wall.
            first = records[0].error if records else "no request finished"
            log.error("%s: every warm-up request failed: %s", run.tag, first)
            return f"every warm-up request failed: {first}"
        return None

    @staticmethod
    def _snapshot(run: LevelRun, what: str) -> tuple[prom.Snapshot | None, str | None]:
        """The server's counters once they stopped moving; or why they could not be read."""
        try:
            return prom.scrape_settled(run.server.base_url, headers=run.auth), None
        except Exception as exc:  # noqa: BLE001 - any scrape failure is reported the same way
            return None, f"{what}: {exc}"

    def _measure(self, run: LevelRun, level: LevelResult) -> tuple[LocustOutcome, list[RequestRecord]]:
        """The measured Locust run: its outcome, its records, and the client's figures in `level`."""
        s, tag = self.settings, run.tag
        job = self._locust_job(run, "", run.total, measured=True)
        with Progress(run.title, run.total or None, job.records_dir, run.duration_s) as bar:
            outcome = run_locust(job, s.level_timeout_s, run.server_gone, bar.tick)
        level.locust = LocustRun(exit_code=outcome.exit_code, wall_s=outcome.wall_s, cpu_s=outcome.cpu_s,
                                 csv=f"locust/{tag}_stats.csv", html=f"locust/{tag}.html",
                                 log=f"logs/locust-{tag}.log", records=f"records/{tag}")
        if outcome.aborted:
            level.problems.append(outcome.aborted)
        records = load_records(job.records_dir)
        run.client_figures(level, records, job.records_dir)
        if self.workload.categories:
            level.client.by_category = stats.by_category(records, {i.id: i.category for i in self.workload.items},
                                                         level.client.content.reference if level.client.content else None)
        if self.targets and records:
            # Open loop: unsent requests are in `records` too, and meet no target.
            level.slo = slo.evaluate(records, self.targets, level.client.duration_s or 0.0)
        return outcome, records

    def _judge(self, run: LevelRun, level: LevelResult, outcome: LocustOutcome, records: list[RequestRecord],
               before: prom.Snapshot | None, after: prom.Snapshot | None) -> None:
        """The client's figures against the server's counters, notes on what limits them, vLLM's
        benchmark as a second opinion, and the level's status."""
        s, client = self.settings, level.client
        if before is not None and after is not None:
            d = level.server = prom.delta(before, after)
            d.output_tokens_per_s = d.generation_tokens / client.duration_s if client.duration_s else None
            check = level.consistency = stats.agreement(client.output_tokens or 0, d.generation_tokens, s.tolerance)
            check.client_output_tokens, check.server_generation_tokens = client.output_tokens or 0, d.generation_tokens
            if not check.ok:
                level.problems.append(
                    f"throughput disagrees with the server: client {check.client_output_tokens} tokens vs "
                    f"server counter {d.generation_tokens:.0f} over the same interval")
        level.notes = (delivery_notes(client, level.server, outcome, s.workers)
                       + run.generator_notes(outcome, s.workers, level.load_generator))
        if not run.metrics:
            level.notes.append("the server's /metrics could not be read: the engine's histograms, acceptance "
                               "and the token-count check are missing for this run")
        if client.failed:
            level.problems.append(f"{client.failed} of {client.requests} requests failed: {client.failure_reasons}")
        if run.total and client.requests < run.total and not outcome.aborted:
            level.problems.append(f"only {client.requests} of {run.total} requests finished")
        broken = outcome.aborted or not client.ok or (run.metrics and after is None)
        if run.vllm_bench and not broken:
            self._second_opinion(run, level, after, records)
        level.status = "failed" if broken else ("flagged" if level.problems else "ok")

    def _second_opinion(self, run: LevelRun, level: LevelResult, before: prom.Snapshot | None,
                        records: list[RequestRecord]) -> None:
        """vLLM's serving benchmark on the same server, prompts, length and concurrency (open loop:
        the same rate and seed, so the same arrival times); compared, with the engine's counters
        over its window (from `before`, the snapshot that closed Locust's run) telling how far the
        server itself drifted between the two clients."""
        s, state, server = self.settings, run.state, run.server
        if not state.tokenizer:
            level.notes.append("vLLM's benchmark skipped: no tokenizer for the served model on this machine "
                               "(give --tokenizer or the deployment's YAML)")
            return
        print(f"{run.title}: vLLM's serving benchmark, {level.client.requests} requests", file=sys.stderr,
              flush=True)
        prompts, workers = level.load.prompt_order(level, s.workers)
        job = vllm_bench.BenchJob(
            base_url=server.base_url, model=state.served_name, tokenizer=state.tokenizer,
            workload=self.workload, request=self.request, load=level.load,
            num_prompts=prompts, out_dir=self.out / "vllm-bench" / run.tag, workers=workers,
            api_key_env=state.api_key_env, timeout_s=s.level_timeout_s, embedded=state.embedded, seed=run.seed)
        bench = vllm_bench.run(job)
        level.vllm_bench = bench
        if bench.error:
            level.problems.append(bench.error)
            return
        if bench.open_loop_requests:  # a closed loop's only: nothing caps an open loop's requests in flight
            level.problems.append(
                f"vLLM's benchmark: {bench.open_loop_requests} requests found a free slot on arrival, so it ran "
                f"below {run.users} users at times; its arrivals ({1 / self.request.arrival_gap_s:.0f}/s) did not "
                f"outpace the server: lower --arrival-gap")
        if before is not None and server.alive():
            try:  # the benchmark's requests exactly: it runs no warm-ups (see `vllm_bench.bench_args`)
                after = prom.scrape_settled(server.base_url, headers=run.auth)
                level.vllm_bench_server = prom.delta(before, after)
            except Exception as exc:  # noqa: BLE001 - the comparison then stays unadjusted
                level.notes.append(f"/metrics after vLLM's benchmark: {exc}; its figures are compared unadjusted")
        judge_second_opinion(level, bench, records, self.workload, s.workers)


def _log_level(tag: str, level: LevelResult) -> None:
    c = level.client or ClientFigures()
    accept = level.server.acceptance_rate if level.server else None
    msg = (f"{tag}: {level.status}, {c.ok}/{c.requests} ok, {c.output_tokens_per_s or 0:.1f} tok/s"
           + (f", acceptance {accept:.2f}" if accept is not None else ""))
    (log.warning if level.problems else log.info)("%s%s", msg,
                                                  "; " + "; ".join(level.problems) if level.problems else "")
