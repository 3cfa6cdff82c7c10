"""The batch-size sweep: each variant of a config on its own server, loaded at each concurrency,
the server's counters read around each run, and vLLM's own benchmark run after Locust on the
same server as a second opinion.

Variants: speculation as configured, optional extra K values, and the baseline (speculation
off). A run of one variant at one concurrency: warm-up (not measured), a settled `/metrics`
snapshot, the measured Locust run (closed loop, a request count or a duration), another
snapshot, then vLLM's serving benchmark with the same prompts, output length, temperature,
concurrency and request count. `--repeat N` makes N runs of every (variant, concurrency).

Open loop (`rates`): each level is an arrival rate instead of a concurrency. A run: warm-up (closed
loop, `RATE_WARMUP_USERS` users), a snapshot, the open-loop Locust run (`requests_for_rate`
requests arriving by a Poisson process, seeded by the repeat so every variant of a repeat gets the
same arrivals and prompts), a snapshot, then vLLM's benchmark at the same rate and seed. The level
keeps `rate` (asked), `seed`, `open_loop` (`stats.open_loop`: achieved rate, send lag, in-flight
series, `behind`), `outcomes`, the client's figures, `slo` and the server's delta.

Order (`loadtest.sweeps.plan`): on a CPU every variant's server stays up where they fit (an idle
vLLM server costs no CPU; they start together, before the first run) and the variants take turns at
each run, so spec and baseline of the same repeat are measured minutes apart and share the machine's
mood; each speedup is paired within its repeat. Who goes first alternates from one repeat to the
next (`run_order`), so an even number of repeats cancels a steady drift and any advantage of going
first. Where servers cannot share the device, one runs at a time: on GPUs each variant's server
starts once and runs all its levels and repeats (`--order grouped`, a 70B server's cold start takes
minutes); on a CPU the variants still take turns every repeat (`--order alternate`). Before it
starts, the sweep prints its plan (servers, starts, levels, an estimated duration);
`Sweep.plan(dry_run=True)` makes it alone. Results go to `results.json` (its shape:
`loadtest.measurement.results`) after every run, so a crash or a dead server keeps what was done.

Here: the order of the runs, the servers' starts and the results. One level's run is
`loadtest.sweeps.level`, its judging `loadtest.sweeps.judging`, the variants' servers
`loadtest.sweeps.servers`, the machine and commit a result names `loadtest.sweeps.provenance`.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from deploy import ConfigError, Server, ServerStartError
from deploy.preflight import Machine
from deploy.footprint import first_start_lines
from plugins import step_profile
from loadtest.measurement import slo
from loadtest.traffic import declared as traffic
from loadtest.measurement import second_opinion
from loadtest.traffic.endpoint import EndpointError
from loadtest.sweeps.plan import (ClosedLoop, OpenLoop, ServerInfo, SweepPlan, Timings, choose_order, duration_text,
                                  gpu_groups, gpu_text, servers_fit_together)
from loadtest.measurement.results import CREATED_FORMAT, LevelResult, Open, SweepResults
from loadtest.traffic.workloads import Workload, load_workload
from loadtest.sweeps.judging import overall_status
from loadtest.sweeps.level import LevelRunner, Measured
from loadtest.sweeps.provenance import machine_info
from loadtest.sweeps.servers import Running, finish_variant, health, on_gpus, prepare, running_servers, stop
from loadtest.sweeps.settings import (SweepSettings, Variant, default_out_dir, plan_variants,
                                      requests_for, requests_for_rate)

log = logging.getLogger("specdeploy.loadtest")


class Sweep:
    """Runs the sweep and keeps `results` (the future results.json) up to date.

    `run()` runs the whole sweep: every variant at every level and repeat. A search that picks its
    levels as it goes (a capacity search over rates) runs one level at a time instead:

        sweep = Sweep(SweepSettings(config, ...))   # rates need not be set
        with sweep.serving():                         # prepares the variants; servers stop on exit
            level = sweep.rate_level("baseline", 2.0, repeat=1)   # -> LevelResult
            level = sweep.rate_level("spec-k4", 2.0, repeat=1)    # same arrivals as the baseline's

    `rate_level(variant_name, rate, repeat)` starts the variant's server on first use (stopping
    the others first where servers cannot be up together) and keeps it up until `serving()`
    ends; each level is appended to `results` and saved. Variant names: `variants()` inside
    `serving()` (from `plan_variants`, or "spec-kK"/"server" and "baseline" for `url`/`baseline_url`).
    """

    def __init__(self, settings: SweepSettings, temperature: float | None = None,
                 on_server_started: Callable[[Server, Variant], None] | None = None, timings: Timings | None = None):
        self.settings = settings
        self.request = settings.request if temperature is None else replace(settings.request, temperature=temperature)
        """What each request looks like: the settings' request, at `temperature` where one is given (a
        sweep per temperature, `loadtest.sweeps.temperature`). The sweep reads this, never
        `settings.request`: the temperature goes only where requests are made and recorded."""
        self.timings = timings if timings is not None else Timings.load()
        """Measured start times and run costs of this machine's servers: the plan's estimates."""
        self.sweep_plan: SweepPlan | None = None
        self._servers: dict[str, ServerInfo] = {}
        self._measured: dict[Any, float] = {}
        """What this sweep measured, for the time left: ("start", variant) and (variant, users) -> seconds."""
        self.out = settings.out or default_out_dir(settings.config or "running-servers")
        self.on_server_started = on_server_started
        """Hook for tests and tools: called each time a variant's server is healthy."""
        self.workload: Workload | None = None
        """The workload, read once before any server starts (vLLM's benchmark's dataset)."""
        self._levels: LevelRunner | None = None
        """Runs the levels, once the workload is read (`_setup`)."""
        self.targets = slo.parse_targets(settings.slo) if settings.slo else []
        self._serving: tuple[dict[str, Running], SweepPlan] | None = None
        """Inside `serving()`: the variants' servers, the plan."""
        self._variants: dict[str, Variant] = {}
        """The variants by name, once set up."""
        self._on_demand = 0
        """Levels `rate_level` ran: their `sequence`."""
        s = replace(settings, request=self.request).record()  # as this sweep runs: its own request
        self.results = SweepResults(config=settings.config or settings.url, settings=s,
                                    created=time.strftime(CREATED_FORMAT), machine=machine_info())

    # ------------------------------------------------------------------ bookkeeping
    def save(self) -> Path:
        return self.results.save(self.out / "results.json")

    # ------------------------------------------------------------------ the sweep
    def plan(self, dry_run: bool = False) -> SweepPlan:
        """The sweep's plan without starting anything. `dry_run`: made for the machine the config
        describes (a GPU config plans on a laptop: what this machine lacks is listed as skipped),
        with no server contacted and no model built or loaded."""
        self.workload = load_workload(self.request.workload)
        if self.settings.url:
            variants = [Variant("server", "running server (not contacted in a dry run)", (), False, None, None)]
            if self.settings.baseline_url:
                variants.append(Variant("baseline", "running server without speculation", (), True, None, None))
            servers = [ServerInfo(v.name, v.label, "cuda", 0, "", "", url=url)
                       for v, url in zip(variants, (self.settings.url, self.settings.baseline_url))]
            return self._make_plan(servers, together=True,
                                   notes=["servers already running: their device is not known, GPU speeds assumed"])
        running = {v.name: self._prepare(v, plan_only=dry_run) for v in plan_variants(self.settings)}
        return self._plan_started(running)

    def _plan_started(self, running: dict[str, Running]) -> SweepPlan:
        usable = [name for name, r in running.items() if not r.broken]
        servers = [self._servers[name] for name in usable]
        planned = [r for r in running.values() if r.resolved is not None]
        host_gib = planned[0].resolved.machine.host_memory_gib if planned else Machine.detect().host_memory_gib
        skipped = list(dict.fromkeys(p for r in planned for p in r.resolved.machine_problems))
        notes = [f"{name}: {r.broken}" for name, r in running.items() if r.broken]
        notes += list(dict.fromkeys(n for r in running.values() for n in r.plan_notes))
        # The first variant carries the most weights (the draft too): its first start's download, the GPUs it needs.
        notes += first_start_lines(planned[0].resolved) if planned else []
        node_gpus = self.settings.node_gpus or (planned[0].resolved.machine.gpus if planned else 0)
        return self._make_plan(servers, servers_fit_together(servers, host_gib), skipped, notes, node_gpus)

    def _make_plan(self, servers: list[ServerInfo], together: bool, skipped: list[str] | None = None,
                   notes: list[str] | None = None, node_gpus: int = 0) -> SweepPlan:
        s = self.settings
        groups = gpu_groups(servers, node_gpus) if s.order != "grouped" else []
        if groups:  # each server on its own GPUs: the plan and the starts read them from here
            servers = [server for group in groups for server in group]
            self._servers.update({server.name: server for server in servers})
        order, why = choose_order(s.order, together, {x.device for x in servers}, len(groups))
        # The sweep's kind of load becomes a type here, once.
        loop: ClosedLoop | OpenLoop
        if s.loop == "open":
            loop, requests = OpenLoop(list(s.rates)), {r: requests_for_rate(r, s.requests, s.duration_s) for r in s.rates}
        else:
            loop, requests = ClosedLoop(list(s.users)), ({} if s.duration_s else {
                c: requests_for(c, s.requests, s.requests_per_user, s.requests_min) for c in s.users})
        self.sweep_plan = SweepPlan(
            config=s.config or s.url, servers=servers, order_name=order, why=why, together=together, loop=loop,
            repeat=s.repeat, requests=requests,
            duration_s=s.duration_s, warmup=s.warmup, max_tokens=self.request.max_tokens,
            temperatures=[self.request.temperature], vllm_bench=s.vllm_bench, timings=self.timings,
            vllm_bench_every_repeat=s.vllm_bench_every_repeat,
            skipped=skipped or [], notes=notes or [], traffic=traffic.describe(self.request, s.traffic_source),
            groups=groups)
        return self.sweep_plan

    def _setup(self) -> tuple[dict[str, Running], SweepPlan]:
        """Read the workload and prepare every variant (or find the running servers); raises
        ConfigError, EndpointError, ValueError or OSError before any server starts."""
        self.out.mkdir(parents=True, exist_ok=True)
        # Read once; a bad workload fails here, before any server starts.
        self.workload = load_workload(self.request.workload)
        self._levels = LevelRunner(self.settings, self.request, self.out, self.workload, self.targets)
        if self.settings.url:
            variants, running = [], {}
            for variant, state, info in running_servers(self.settings):  # each entered in the results as it is found
                self.results.variants.append(state.entry)
                self._servers[variant.name] = info
                running[variant.name] = state
                variants.append(variant)
            plan = self._make_plan([self._servers[v.name] for v in variants], together=True)
        else:
            variants = plan_variants(self.settings)
            running = {v.name: self._prepare(v) for v in variants}
            plan = self._plan_started(running)
        self._variants = {v.name: v for v in variants}
        return running, plan

    def _finish(self, running: dict[str, Running]) -> None:
        """Whatever happened (failure, Ctrl-C), no server is left running; statuses and the file follow."""
        for state in running.values():
            stop(state)
            finish_variant(state)
        self.results.problems += second_opinion.systematic_problems(self.results)
        if self.results.status != "interrupted":
            self.results.status = overall_status(self.results)
        self.save()

    def run(self) -> SweepResults:
        try:
            running, plan = self._setup()
        except (ConfigError, EndpointError, ValueError, OSError) as exc:
            self.results.status = "failed"
            self.results.problems.append(str(exc))
            self.save()
            return self.results
        order = [(r, c, self._variants[server.name]) for r, c, server in plan.steps]
        self.results.plan = {"order": plan.order_name, "why": plan.why, "servers_together": plan.together,
                             "server_starts": len(plan.starts()), "estimated_s": round(plan.total_s()),
                             "planned_runs": len(order), "variants": list(self._variants)}
        if plan.servers:
            print(plan.describe(), file=sys.stderr, flush=True)
        log.info("load test of %s: report in %s", self.settings.config or self.settings.url, self.out)
        began, levels = time.monotonic(), self._levels
        assert levels is not None  # set by `_setup`
        try:
            for n, (repeat, load, variant) in enumerate(order, 1):
                which = load.level(repeat)
                state = self._ready(running, plan, variant, which,
                                    lambda started: f"{n}/{len(order)}, {self._clock(began, n, started)}")
                if not isinstance(state, Running):
                    continue
                title = (f"[{n}/{len(order)}] {variant.name} {which.label} run {repeat}/{self.settings.repeat} "
                         f"({self._clock(began, n, started=True)})")
                run_began = time.monotonic()
                level = levels.at(load, state, variant, repeat, title)
                wall_s = time.monotonic() - run_began
                self._keep(state, variant, level, n, wall_s)
                if not state.entry.url:  # a run's cost on another machine's server says nothing of this one's
                    plan.loop.record_run(plan, self._servers[variant.name], level, wall_s)
        except KeyboardInterrupt:
            self.results.problems.append("interrupted")
            self.results.status = "interrupted"
            raise
        finally:
            self._finish(running)
        return self.results

    def _ready(self, running: dict[str, Running], plan: SweepPlan, variant: Variant, which: LevelResult,
               where: Callable[[bool], str]) -> Running | LevelResult | None:
        """The variant's server, up for the level `which` names (its rate or concurrency, and its
        repeat): started first where needed, the others stopped first where servers run one at a
        time. Where it cannot run: the level kept as skipped (its server died), or None (the
        variant is broken)."""
        state = running[variant.name]
        if not state.broken and state.server is not None and not state.server.alive():
            state.broken, state.died = "server no longer running", True
        if state.broken:
            if state.died:
                skipped = replace(which, status="skipped", problems=[state.broken])
                state.entry.levels.append(skipped)
                return skipped
            return None
        if plan.groups:  # another group's servers stop first; this group's start together
            group = plan.group_of(variant.name)
            for name, other in running.items():
                if name not in group:
                    stop(other)
            if state.server is None:
                self._start_group([(running[n], self._variants[n]) for n in group
                                   if running[n].server is None and not running[n].broken], where(False))
            return state if state.server is not None and not state.broken else None
        if plan.one_at_a_time:  # the others stop first
            for other in running.values():
                if other is not state:
                    stop(other)
        elif plan.start_together and state.server is None:  # every server not up yet starts now, beside this one
            self._start_group([(other, self._variants[name]) for name, other in running.items()
                               if other.server is None and not other.broken], where(False))
            return state if state.server is not None and not state.broken else None
        if state.server is None and not (self._launch(state, variant, where(False)) and self._await(state, variant)):
            return None
        return state

    def _start_group(self, members: list[tuple[Running, Variant]], position: str) -> None:
        """Start servers side by side (on their GPUs, or on a CPU's cores): every process launched
        first, then each awaited, so their start-ups overlap."""
        launched = [(state, variant) for state, variant in members if self._launch(state, variant, position)]
        for state, variant in launched:
            self._await(state, variant)

    def _keep(self, state: Running, variant: Variant, level: LevelResult, sequence: int, wall_s: float) -> LevelResult:
        """A measured level: its wall time kept for this sweep's clock, its place in the sweep, appended and saved."""
        if level.measured_requests:
            self._measured[(variant.name, level.at, level.repeat or 1)] = wall_s
        level.sequence = sequence
        state.entry.levels.append(level)
        self.save()
        return level

    # ------------------------------------------------------------------ one level on demand
    @contextmanager
    def serving(self) -> Iterator[Sweep]:
        """Prepare the variants for `rate_level`; on exit stop every server the sweep started and
        finish the results (statuses, results.json). Raises what `_setup` raises (a bad config,
        an unreachable URL) before any server starts."""
        running, plan = self._setup()
        self._serving = (running, plan)
        self.results.plan = {"order": "on demand", "why": "levels chosen one at a time (rate_level)",
                             "servers_together": plan.together, "server_starts": 0, "estimated_s": 0}
        try:
            yield self
        except KeyboardInterrupt:
            self.results.problems.append("interrupted")
            self.results.status = "interrupted"
            raise
        finally:
            self._serving = None
            for state in running.values():
                if not state.entry.levels and not state.broken:
                    state.entry.status = "skipped"  # the search never asked for it
            self._finish(running)

    def variants(self) -> list[str]:
        """The variants' names `rate_level` takes (inside `serving()`)."""
        if self._serving is None:
            raise RuntimeError("Sweep.variants() is available inside `with sweep.serving():`")
        return list(self._variants)

    def server_health(self, variant_name: str) -> str | None:
        """Inside `serving()`: None while the variant's server answers /health, else why not (an
        overload must leave it up; a server not started yet is not asked)."""
        if self._serving is None:
            raise RuntimeError("Sweep.server_health() is available inside `with sweep.serving():`")
        return health(self._serving[0][variant_name])

    def rate_level(self, variant_name: str, rate: float, repeat: int = 1, *, vllm_bench: bool | None = None,
                   duration_s: float | None = None) -> LevelResult:
        """One open-loop level of one variant at `rate` requests/s, now (inside `serving()`; a
        search over rates says `loop="open"` in its settings): the same run and result shape as a
        level of `run()` with rates (warm-up, snapshots, the open-loop Locust run of
        `requests_for_rate(rate, settings.requests, settings.duration_s)` requests seeded by
        `repeat`, vLLM's benchmark unless `settings.vllm_bench` is off). `vllm_bench` (None: the
        settings') and `duration_s` (the requests arriving in this long instead; None: the
        settings' count or duration) are this level's own; the settings stay as they are. Its
        server starts on first use. A variant whose server failed or died gets a level with
        status `failed`/`skipped` and the reason in `problems`."""
        if self._serving is None:
            raise RuntimeError("Sweep.rate_level() runs inside `with sweep.serving():`")
        running, plan = self._serving
        if variant_name not in self._variants:
            raise ValueError(f"no variant {variant_name!r}; the sweep has {', '.join(self._variants)}")
        if rate <= 0:
            raise ValueError(f"an arrival rate must be positive, not {rate}")
        s = self.settings
        measured = Measured(None if duration_s else s.requests, duration_s or s.duration_s,
                            s.vllm_bench if vllm_bench is None else vllm_bench)
        self._on_demand += 1
        n, variant, which = self._on_demand, self._variants[variant_name], Open(rate).level(repeat)
        state = self._ready(running, plan, variant, which, lambda started: f"on demand {n}")
        if isinstance(state, LevelResult):  # its server died: the level is kept as skipped
            return state
        if state is None:
            return replace(which, status="failed", problems=[running[variant_name].broken or "server not running"])
        assert self._levels is not None  # set by `_setup`
        began = time.monotonic()
        # Its files are named by its place among the levels asked for, so a level asked for
        # again (the same variant, rate and repeat) keeps the earlier one's.
        level = self._levels.open(state, variant, rate, repeat, f"[{n}] {variant.name} {which.label} run {repeat}/"
                                  f"{s.repeat} (on demand)", f"-n{n}", measured)
        return self._keep(state, variant, level, n, time.monotonic() - began)

    def _prepare(self, variant: Variant, plan_only: bool = False) -> Running:
        """The variant's server planned (`servers.prepare`), its entry in the results and what the
        plan shows of it kept."""
        state, info = prepare(self.settings, variant, plan_only)
        self.results.variants.append(state.entry)
        if info is not None:
            self._servers[variant.name] = info
        return state

    def _clock(self, began: float, step: int, started: bool = False) -> str:
        """`3 min in, about 41 min left` before step `step` (1-based), or once its server has started."""
        assert self.sweep_plan is not None
        plan = self.sweep_plan
        left = plan.left_s(step - 1, self._measured, skip_start=started)
        return f"{duration_text(time.monotonic() - began)} in, about {duration_text(left)} left"

    def _launch(self, state: Running, variant: Variant, position: str) -> bool:
        """The server's process started (not yet healthy: `_await`)."""
        server_log = self.out / (state.entry.server_log or "")
        info = self._servers.get(variant.name)
        gpus = info.gpu_set if info else ()
        print(f"[{position}] {variant.name} ({variant.label}): starting vLLM"
              + (f" on GPUs {gpu_text(gpus)}" if gpus else "") + f", log {server_log}", file=sys.stderr, flush=True)
        if gpus:  # side by side with other servers: its own GPUs only
            state.plan = on_gpus(state.plan, gpus)
        par = state.resolved.config.parallelism if state.resolved else None
        if par is not None and par.world_size == 1:
            # Where each step's time goes (schedule, forward, verify, draft): timers that cost little
            # beside a step, read around each measured run. One engine process only: the
            # workers of tensor or pipeline parallelism would each add their own forward.
            state.step_profile = self.out / "logs" / f"steps-{variant.name}"
            state.plan = replace(state.plan, env={**state.plan.env, step_profile.ENV: str(state.step_profile)})
        server = Server(state.plan, server_log)
        state.server = server
        try:
            server.start()
        except ServerStartError as exc:
            return self._failed_start(state, variant, exc)
        return True

    def _await(self, state: Running, variant: Variant) -> bool:
        """Wait for a launched server's health; its start time kept for later plans."""
        server = state.server
        assert isinstance(server, Server)
        try:
            took = server.wait_healthy(state.startup_timeout_s, progress=True)
            state.entry.startup_s.append(took)
            self._measured[("start", variant.name)] = took
            self.timings.record_start(self._servers[variant.name].key, took)
        except ServerStartError as exc:
            return self._failed_start(state, variant, exc)
        if self.on_server_started:
            self.on_server_started(server, variant)
        return True

    def _failed_start(self, state: Running, variant: Variant, exc: ServerStartError) -> bool:
        log.error("%s: server failed to start: %s", variant.name, exc.reason)
        state.entry.status, state.entry.error = "failed", f"server failed to start: {exc.reason}"
        state.entry.server_log_tail = exc.log_tail[-20:]
        state.broken = state.entry.error
        stop(state)
        self.save()
        return False
