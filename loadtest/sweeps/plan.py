"""A sweep's plan, shown before anything starts: the variants and their servers, the order they
run in and how many server starts it takes, the levels, and how long it should last.

Order (`--order`): `alternate` takes the variants in turn at every repeat, who goes first flipping
from one repeat to the next (A B, B A, ...), so a machine that drifts over the sweep favours none;
`grouped` starts each variant's server once and runs all its levels and repeats in a row. `auto`
groups where servers cannot be up together and run on GPUs (a cold start of a 70B server takes
minutes, and a GPU's speed holds steady); elsewhere it alternates: servers up together on a CPU
(started together, their start-ups overlapping on the cores) take turns without restarting, and a
shared CPU's speed drifts within minutes.

GPU placement: where the variants' servers fit side by side on the node's GPUs (each needs tensor x
pipeline x data parallel of them), they go in groups that fit (`gpu_groups`), each server on its own
GPUs (`CUDA_VISIBLE_DEVICES`): a group's servers start together and take turns at every run, as on
a CPU, and the groups follow one another (70B at TP=4 on 8 GPUs: two servers at a time).

Estimates come from this machine's own measurements where it has them (`Timings`: each server's
start time and each level's seconds per generated token, kept between sweeps by config, variant
and device), else from the assumptions below, which the plan says it used.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from deploy.config import Override
from loadtest.files import write_json
from loadtest.measurement.results import Closed, LevelResult, Load, Open


LoopKind = Literal["closed", "open"]
"""How a sweep's load comes: `closed`, a fixed number of users each sending its next request when
its last one ended; `open`, requests arriving at a rate whether or not earlier ones finished."""

log = logging.getLogger("specdeploy.loadtest")

ORDERS = ("auto", "alternate", "grouped")
SERVER_PROCESSES_GIB = 2.0
"""Memory of one CPU server besides its KV cache and weights: the measured PSS of the embedded
default's API server, engine core and worker (beyond its KV cache) together, rounded up."""
UNKNOWN_WEIGHTS_GIB = 1.0
"""Weights assumed for a server whose model size preflight could not estimate."""

# Assumptions for a machine that has not measured a server yet. Start: fixed seconds (engine
# start, compilation, CUDA graphs) plus seconds per GiB of weights loaded, near the embedded
# default's starts on a 2-core CPU. Speed: tokens/s per user at batch 1 and at batch 32
# (interpolated on a log scale between, flat beyond): on a CPU, between the embedded default's
# baseline and speculation on a 2-core AVX2 machine; on GPUs a guess for a 70B-class target on 8 GPUs.
ASSUMED_START = {"cuda": (120.0, 1.0), "cpu": (40.0, 170.0)}
"""Seconds a server takes to start: fixed + per GiB of weights (on a CPU warm-up compiles grow with the
model)."""
ASSUMED_USER_TPS = {"cuda": (30.0, 15.0), "cpu": (50.0, 13.0)}
ASSUMED_CPU_TPS_GIB = (8.0, 40.0)
"""On a CPU with the weights' size known: output tokens/s x GiB of weights at batch 1 (reading the
weights bounds a step) and of the whole server at batch 32 (arithmetic does); the smaller of these
and `ASSUMED_USER_TPS` is assumed."""
RUN_OVERHEAD_S = 30.0
"""Per run, besides generating tokens: Locust's and the benchmark's start-up, settled /metrics scrapes."""
KEEP = 5
"""Measurements kept per key; the estimate is their median."""
RATE_WARMUP_USERS = 2
"""Closed-loop users of the warm-up before an open-loop level (each sends `warmup` requests)."""


def choose_order(requested: str, together: bool, devices: set[str], groups: int = 0) -> tuple[str, str]:
    """The order a sweep runs in (`alternate` or `grouped`) and why, in a few words; `groups`: how
    many groups of GPU servers side by side (`gpu_groups`), 0 for none."""
    if requested not in ORDERS:
        raise ValueError(f"--order is one of {', '.join(ORDERS)}, not {requested!r}")
    if groups:
        return "alternate", (f"servers side by side on disjoint GPUs, {groups} group{'s' if groups > 1 else ''} "
                             f"one after the other: a group's variants take turns at every run")
    if requested != "auto":
        return requested, f"--order {requested}"
    if together:
        return "alternate", "servers up together, the variants take turns at every run"
    if devices - {"cpu"}:
        return "grouped", "servers cannot be up together on the GPUs: each starts once and runs all its levels"
    return "alternate", ("servers cannot be up together, and a shared CPU's speed drifts: the variants take "
                         "turns every repeat, restarting")


def run_order(variants: Sequence[Any], users: list[int], repeat: int, together: bool,
              grouped: bool = False, groups: Sequence[Sequence[Any]] = ()) -> list[tuple[int, int, Any]]:
    """(repeat, concurrency, variant) in the order they run.

    Servers up together: the variants take turns at each run, in the listed order on odd repeats
    and reversed on even ones (A B, B A, ...): a machine that drifts steadily over a pair's
    minutes, or a run that gains from going first or second, then favours each variant equally
    over two repeats. One server at a time: each variant's levels in a row, the variants in turn
    per repeat with the same flip (which also spares a restart: the last of one repeat is the
    first of the next). Grouped: each variant's repeats and levels in a row, one start each.
    `groups` (servers side by side on disjoint GPUs): each group's variants take turns as servers up
    together do, one group after the other."""
    repeats = range(1, repeat + 1)
    if groups:
        return [step for group in groups for step in run_order(group, users, repeat, True)]
    if grouped:
        return [(r, c, v) for v in variants for r in repeats for c in users]
    if together:
        return [(r, c, v) for c in users for r in repeats for v in (variants if r % 2 else variants[::-1])]
    return [(r, c, v) for r in repeats for v in (variants if r % 2 else variants[::-1]) for c in users]


def starts_needed(order: Sequence[tuple[int, int, Any]], one_at_a_time: bool,
                  groups: Sequence[Sequence[Any]] = ()) -> list[bool]:
    """For each step of `order`, whether its variant's server starts before it (as `Sweep.run`
    does: one at a time, a variant other than the last one running stops it; in `groups`, a
    variant of another group stops the group that ran)."""
    up: set[Any] = set()
    group_of = {v: i for i, group in enumerate(groups) for v in group}
    needed = []
    for _, _, variant in order:
        starts = variant not in up
        if starts and groups:
            up = {v for v in up if group_of.get(v) == group_of.get(variant)}
        elif starts and one_at_a_time:
            up.clear()
        up.add(variant)
        needed.append(starts)
    return needed


def gpu_groups(servers: Sequence[ServerInfo], node_gpus: int) -> list[list[ServerInfo]]:
    """GPU servers packed, in their order, into groups whose GPUs fit the node, each server given its
    own GPUs (`gpu_set`); empty where no two fit side by side (one server at a time, as before) or
    where a server is not a one-node GPU server."""
    if len(servers) < 2 or any(s.device != "cuda" or not s.gpus or s.url for s in servers):
        return []
    groups: list[list[ServerInfo]] = [[]]
    used = 0
    for server in servers:
        if used + server.gpus > node_gpus and groups[-1]:
            groups.append([])
            used = 0
        groups[-1].append(replace(server, gpu_set=tuple(range(used, used + server.gpus))))
        used += server.gpus
    return groups if any(len(g) > 1 for g in groups) else []


@dataclass(frozen=True)
class ServerInfo:
    """What the plan knows of one variant's server."""

    name: str
    label: str
    device: str
    """`cuda` or `cpu`."""
    gpus: int
    """GPUs per node it runs on (0 on a CPU)."""
    models: str
    """The target, and the draft where there is one, as the config names them."""
    key: str
    """Its entry in `Timings`: config, variant, device."""
    weight_gib: float | None = None
    kv_gib: float = 0.0
    """A CPU server's KV cache."""
    url: str = ""
    """A server already running there (the sweep starts none)."""
    gpu_set: tuple[int, ...] = ()
    """The node's GPUs it runs on, where servers share the node side by side (`gpu_groups`)."""


def server_key(config_name: str, variant: str, device: str, overrides: Sequence[Override | str] = (),
               plumbing: bool = False) -> str:
    """`Timings` key of a server: what changes its start time and speed."""
    parts = [config_name, variant, device + ("-plumbing" if plumbing else "")]
    if overrides:
        parts.append("set " + " ".join(sorted(map(str, overrides))))  # as written on the command line
    return "|".join(parts)


def servers_fit_together(servers: Sequence[ServerInfo], host_memory_gib: float) -> bool:
    """On a CPU, when every server's KV cache, weights and processes fit in memory with room to spare."""
    if len(servers) < 2 or any(s.device != "cpu" for s in servers):
        return len(servers) < 2
    need_gib = sum(s.kv_gib + SERVER_PROCESSES_GIB + (s.weight_gib if s.weight_gib is not None else UNKNOWN_WEIGHTS_GIB)
                   for s in servers)
    return need_gib <= 0.8 * host_memory_gib  # the rest: the load test, the OS, a load's growth


def gpu_text(gpus: Sequence[int]) -> str:
    """`0-3` for consecutive GPUs, else `0,2`: as CUDA_VISIBLE_DEVICES lists them, shortened."""
    if len(gpus) > 1 and list(gpus) == list(range(gpus[0], gpus[-1] + 1)):
        return f"{gpus[0]}-{gpus[-1]}"
    return ",".join(map(str, gpus))


class Timings:
    """Measured start times (seconds until healthy) and run costs (wall seconds per planned output
    token at a concurrency) of this machine's servers, kept in a small JSON file between sweeps."""

    def __init__(self, path: Path | None = None, data: dict[str, Any] | None = None):
        self.path = path
        self.data: dict[str, Any] = data or {"starts": {}, "runs": {}}

    @classmethod
    def load(cls, path: Path | None = None) -> Timings:
        from models.cache import cache_root

        path = path or cache_root() / "loadtest-timings.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data.get("starts"), dict) or not isinstance(data.get("runs"), dict):
                raise ValueError("not a timings file")
        except (OSError, ValueError, AttributeError):
            data = None  # none yet, or unreadable: estimates fall back to the assumptions
        return cls(path, data)

    def start_s(self, key: str) -> float | None:
        values = self.data["starts"].get(key)
        return statistics.median(values) if values else None

    def seconds_per_token(self, key: str, users: int) -> float | None:
        values = self.data["runs"].get(f"{key}|c{users}")
        return statistics.median(values) if values else None

    def record_start(self, key: str, seconds: float) -> None:
        self._add("starts", key, seconds)

    def record_run(self, key: str, users: int, seconds_per_token: float) -> None:
        self._add("runs", f"{key}|c{users}", seconds_per_token)

    def _add(self, kind: str, key: str, value: float) -> None:
        values = self.data[kind].setdefault(key, [])
        values.append(round(value, 6))
        del values[:-KEEP]
        if self.path is None:
            return
        try:
            write_json(self.path, self.data)
        except OSError as exc:  # an estimate is not worth failing a measurement for
            log.warning("cannot keep the measured timings in %s: %s", self.path, exc)


@dataclass
class Estimate:
    seconds: float
    measured: bool


def assumed_start_s(server: ServerInfo) -> float:
    fixed, per_gib = ASSUMED_START.get(server.device, ASSUMED_START["cuda"])
    return fixed + per_gib * (server.weight_gib or 0.0)


def assumed_tokens_per_s(device: str, users: int, weight_gib: float | None = None) -> float:
    """Output tokens/s of the whole server at `users` concurrent users (an assumption)."""
    one, at32 = ASSUMED_USER_TPS.get(device, ASSUMED_USER_TPS["cuda"])
    if device == "cpu" and weight_gib:
        one, at32 = min(one, ASSUMED_CPU_TPS_GIB[0] / weight_gib), min(at32, ASSUMED_CPU_TPS_GIB[1] / weight_gib / 32)
    x = min(max(math.log(max(users, 1)) / math.log(32), 0.0), 1.0)
    return users * math.exp((1 - x) * math.log(one) + x * math.log(at32))


@dataclass
class SweepPlan:
    """What a sweep will do, and about how long it takes."""

    config: str
    servers: list[ServerInfo]
    order_name: str
    why: str
    together: bool
    loop: ClosedLoop | OpenLoop
    """The levels each variant runs at: numbers of users (closed loop) or arrival rates (open loop)."""
    repeat: int
    requests: dict[float, int]
    """Measured requests per run at each level (its users or rate; empty with a closed loop's `duration_s`)."""
    duration_s: float | None
    warmup: int
    max_tokens: int
    temperatures: list[float]
    vllm_bench: bool
    timings: Timings = field(default_factory=Timings)
    vllm_bench_every_repeat: bool = False
    """vLLM's benchmark after every repeat's run, not only the first's."""
    skipped: list[str] = field(default_factory=list)
    """Checks this machine fails, not applied to a dry run's plan (it is made for the config's machine)."""
    notes: list[str] = field(default_factory=list)
    traffic: list[str] = field(default_factory=list)
    """What every request looks like and where that came from (`loadtest.traffic.declared.describe`)."""
    groups: list[list[ServerInfo]] = field(default_factory=list)
    """GPU servers side by side (`gpu_groups`): `servers` in groups, each with its GPUs; empty otherwise."""

    def group_of(self, name: str) -> list[str]:
        """The names of the servers up beside `name`'s (its group's), or [] without groups."""
        index = self.group_index.get(name)
        return [] if index is None else [s.name for s in self.groups[index]]

    @property
    def group_index(self) -> dict[str, int]:
        """Each server's group (`groups`), by name."""
        return {s.name: i for i, group in enumerate(self.groups) for s in group}

    @property
    def levels(self) -> list[Load]:
        return self.loop.loads

    # ------------------------------------------------------------------ the steps
    @property
    def one_at_a_time(self) -> bool:
        return not self.together or self.order_name == "grouped"

    @property
    def up_together(self) -> bool:
        """Two or more servers up at once for the whole sweep, taking turns."""
        return self.together and not self.one_at_a_time and len(self.servers) > 1

    @property
    def start_together(self) -> bool:
        """CPU servers up together start at once, their start-ups (mostly single-threaded imports)
        overlapping on the cores. GPU servers sharing a GPU start one after the other: each engine
        sizes its KV cache from the GPU memory it finds free as it starts."""
        return self.up_together and all(s.device == "cpu" for s in self.servers)

    @property
    def steps(self) -> list[tuple[int, Load, ServerInfo]]:
        """(repeat, load, server) in the order one sweep runs them."""
        return run_order(self.servers, self.levels, self.repeat, self.together, self.order_name == "grouped",
                         self.groups)

    def starts(self) -> list[ServerInfo]:
        """Server starts of one sweep, in order."""
        if any(s.url for s in self.servers):
            return []
        steps = self.steps
        return [s for (_, _, s), start in zip(steps, starts_needed(steps, self.one_at_a_time, self.groups)) if start]

    def starts_if(self, order_name: str) -> int:
        other = SweepPlan(**{**self.__dict__, "order_name": order_name})
        return len(other.starts())

    # ------------------------------------------------------------------ estimates
    def start_estimate(self, server: ServerInfo) -> Estimate:
        measured = self.timings.start_s(server.key)
        return Estimate(measured, True) if measured is not None else Estimate(assumed_start_s(server), False)

    def bench_runs(self, repeat: int) -> int:
        """1 where vLLM's benchmark follows repeat `repeat`'s run, else 0."""
        return int(self.vllm_bench and (repeat == 1 or self.vllm_bench_every_repeat))

    def run_tokens(self, server: ServerInfo, load: Load, repeat: int = 1) -> float:
        """Output tokens a run generates: warm-up, the measured requests, and vLLM's benchmark's."""
        return self.loop.run_tokens(self, server, load.at, repeat)

    def assumed_tps(self, server: ServerInfo, users: int) -> float:
        return assumed_tokens_per_s(server.device, users, server.weight_gib)

    def run_estimate(self, server: ServerInfo, load: Load, repeat: int = 1) -> Estimate:
        return self.loop.run_estimate(self, server, load.at, repeat)

    def step_seconds(self, measured: dict[Any, float] | None = None) -> list[tuple[float, float]]:
        """(server start, run) seconds of each step of one sweep, the start 0 where its server is up;
        `measured` replaces estimates with what this sweep measured: ("start", name) and
        (name, level, repeat) (a repeat's run may differ from another's: vLLM's benchmark)."""
        measured = measured or {}
        steps = self.steps
        needed = ([False] * len(steps) if any(s.url for s in self.servers)
                  else starts_needed(steps, self.one_at_a_time, self.groups))
        # Runs not measured yet: their estimates scaled by how far off the measured ones were.
        by_name = {s.name: s for s in self.servers}
        loads = {load.at: load for load in self.levels}
        pairs = [(seconds, self.run_estimate(by_name[key[0]], loads[key[1]], key[2]).seconds)
                 for key, seconds in measured.items() if key[0] != "start" and key[0] in by_name]
        scale = sum(m for m, _ in pairs) / sum(e for _, e in pairs) if pairs else 1.0
        starts = [measured.get(("start", server.name), self.start_estimate(server).seconds) if start else 0.0
                  for (_, _, server), start in zip(steps, needed)]
        if self.groups or self.start_together:  # servers starting together: their slowest start, at their first step
            where, first = self.group_index if self.groups else {s.name: 0 for s in self.servers}, {}
            for i, (_, _, server) in enumerate(steps):
                if starts[i]:
                    j = first.setdefault(where[server.name], i)
                    if j != i:
                        starts[j], starts[i] = max(starts[j], starts[i]), 0.0
        return [(start, measured.get((server.name, load.at, repeat), scale * self.run_estimate(server, load, repeat).seconds))
                for (repeat, load, server), start in zip(steps, starts)]

    def total_s(self) -> float:
        return sum(a + b for a, b in self.step_seconds()) * max(1, len(self.temperatures))

    def left_s(self, step: int, measured: dict[Any, float], skip_start: bool = False) -> float:
        """Seconds left in this sweep from step `step` (0-based) on; `skip_start`: its server is up."""
        steps = self.step_seconds(measured)[step:]
        return sum(a + b for a, b in steps) - (steps[0][0] if skip_start and steps else 0.0)

    # ------------------------------------------------------------------ the text
    def describe(self, dry_run: bool = False) -> str:
        sweeps = max(1, len(self.temperatures))
        lines = [f"load-test plan{' (dry run: nothing starts)' if dry_run else ''}: {self.config}"]
        lines += [f"  {line}" for line in self.traffic]
        if self.skipped:
            lines.append("  planned for the machine the config describes; checks this machine fails, skipped:")
            lines += [f"    - {p}" for p in self.skipped]
        lines.append(f"  variants, each on its own server ({self._where()}):")
        width = max(len(s.name) for s in self.servers)
        for s in self.servers:
            lines.append(f"    {s.name:<{width}}  {s.label}; {s.url or s.models}"
                         + (f"; GPUs {gpu_text(s.gpu_set)}" if s.gpu_set else ""))
        lines.append(f"  order: {self.order_name} ({self.why})")
        starts = self.starts()
        lines += self._describe_starts(starts, sweeps)
        lines += self._describe_levels(sweeps)
        lines += self._describe_duration(starts, sweeps)
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _describe_starts(self, starts: list[ServerInfo], sweeps: int) -> list[str]:
        """The plan's server starts (per temperature where there are several sweeps)."""
        if any(s.url for s in self.servers):
            return ["  server starts: none (servers already running)"]
        counts = {s.name: sum(x is s for x in starts) * sweeps for s in self.servers}
        each = ", ".join(f"{n} {c}" for n, c in counts.items())
        other = "alternate" if self.order_name == "grouped" else "grouped"
        lines = [f"  server starts: {len(starts) * sweeps} ({each}"
                 + (f"; {len(starts)} per temperature" if sweeps > 1 else "") + ")"
                 + (f"; --order {other} would take {self.starts_if(other) * sweeps}"
                    if self.starts_if(other) != len(starts) and not self.together else "")]
        return lines + self._per_server("    each starts in {}", "    {} starts in {}",
                                        {s.name: self.start_text(s) for s in self.servers})

    def _describe_levels(self, sweeps: int) -> list[str]:
        """The plan's levels, temperatures and runs, and what each run sends."""
        temps = ", ".join(f"{t:g}" for t in self.temperatures)
        lines = [f"  levels: {self.loop.levels_text()}; temperature {temps}"
                 + (" (one sweep each, servers started anew)" if sweeps > 1 else "")
                 + f"; {self.repeat} repeat(s); {len(self.steps) * sweeps} runs"]
        return lines + [f"  each run: {self.loop.each_run(self)}" + self._bench_text(self.loop.bench_sends)]

    def _describe_duration(self, starts: list[ServerInfo], sweeps: int) -> list[str]:
        """How long each run and the whole plan take, and which of it is assumed."""
        runs = {s.name: ", ".join(f"{c.label} {duration_text(e.seconds)}{'' if e.measured else '*'}"
                                  for c in self.levels for e in [self.run_estimate(s, c)]) for s in self.servers}
        lines = self._per_server("    a run takes about {} (each variant)", "    a run of {} takes about {}", runs)
        guessed = any(not self.run_estimate(s, c).measured for s in self.servers for c in self.levels)
        if guessed:
            assumed = "; ".join(sorted({f"{s.device}: {self.assumed_tps(s, 1):.3g} tok/s per user at batch 1, "
                                        f"{self.assumed_tps(s, 32) / 32:.3g} at 32" for s in self.servers}))
            lines.append(f"    * a guess, no measured throughput yet: assumed {assumed}, +{RUN_OVERHEAD_S:g} s a run")
        start_s = sum(a for a, _ in self.step_seconds()) * sweeps
        total = self.total_s()
        lines.append(f"  estimated duration: {duration_text(total)} ({duration_text(start_s)} starting servers, "
                     f"{duration_text(total - start_s)} running load)"
                     + ("" if not guessed and all(self.start_estimate(s).measured for s in self.servers)
                        else "; partly assumed, see above"))
        return lines

    def _bench_text(self, arrivals: str) -> str:
        if not self.vllm_bench:
            return ""
        when = "" if self.vllm_bench_every_repeat or self.repeat == 1 else \
            " (first repeat only; --vllm-bench-every-repeat for all)"
        return f", then vLLM's benchmark with the same requests{arrivals}{when}"

    @staticmethod
    def _per_server(all_same: str, each: str, texts: dict[str, str]) -> list[str]:
        """One line for all servers where they agree, else one each."""
        if len(set(texts.values())) == 1:
            return [all_same.format(next(iter(texts.values())))]
        return [each.format(name, text) for name, text in texts.items()]

    def start_text(self, server: ServerInfo) -> str:
        e = self.start_estimate(server)
        return f"about {duration_text(e.seconds)} (" + (
            "measured here before" if e.measured else
            f"estimated, no measured start time yet: assumed {self._start_rule(server)}") + ")"

    def _where(self) -> str:
        if any(s.url for s in self.servers):
            return "already running"
        devices = sorted({(s.device, s.gpus) for s in self.servers})
        text = ", ".join(f"{g} GPU{'s' if g != 1 else ''}" if d == "cuda" else "CPU" for d, g in devices)
        together = ("started and up together" if self.start_together else "up together" if self.up_together
                    else "one at a time" if len(self.servers) > 1 else "")
        if self.groups:
            together = "side by side: " + "; then ".join(" + ".join(s.name for s in g) for g in self.groups)
        return ", ".join(x for x in (text, together) if x)

    @staticmethod
    def _start_rule(server: ServerInfo) -> str:
        fixed, per_gib = ASSUMED_START.get(server.device, ASSUMED_START["cuda"])
        weights = (f" x {server.weight_gib:.{0 if server.weight_gib >= 10 else 1}f} GiB of weights"
                   if server.weight_gib is not None else " of weights (size unknown)")
        return f"{fixed:g} s + {per_gib:g} s per GiB{weights} on {'GPUs' if server.device == 'cuda' else 'a CPU'}"


@dataclass(frozen=True)
class ClosedLoop:
    """Levels of users, each sending its next request when its last one ended (`--users`)."""

    users: list[int]
    bench_sends = ""
    """What vLLM's benchmark repeats besides the requests."""

    @property
    def loads(self) -> list[Load]:
        return [Closed(u) for u in self.users]

    def levels_text(self) -> str:
        return f"concurrency {', '.join(map(str, self.users))}"

    def each_run(self, plan: SweepPlan) -> str:
        per_run = (f"{plan.duration_s:g} s measured" if plan.duration_s else
                   ", ".join(f"{plan.requests[c]} requests at c={c}" for c in self.users))
        return f"{plan.warmup} warm-up request(s) per user, then {per_run}, {plan.max_tokens} output tokens each"

    def run_tokens(self, plan: SweepPlan, server: ServerInfo, users: float, repeat: int) -> float:
        clients = 1 + plan.bench_runs(repeat)
        users = int(users)
        if plan.duration_s:
            measured = plan.duration_s * plan.assumed_tps(server, users) / plan.max_tokens
        else:
            measured = plan.requests[users]
        return (users * plan.warmup + measured * clients) * plan.max_tokens

    def run_estimate(self, plan: SweepPlan, server: ServerInfo, users: float, repeat: int) -> Estimate:
        tokens = self.run_tokens(plan, server, users, repeat)
        per_token = plan.timings.seconds_per_token(server.key, int(users))
        if per_token is not None:
            return Estimate(tokens * per_token, True)
        return Estimate(tokens / plan.assumed_tps(server, int(users)) + RUN_OVERHEAD_S, False)

    def record_run(self, plan: SweepPlan, server: ServerInfo, level: LevelResult, wall_s: float) -> None:
        """Keep a measured run's cost (wall seconds per output token it asked for: warm-up, measured,
        vLLM's benchmark) for later plans."""
        requests = level.measured_requests
        if not requests:
            return
        users = int(level.at)
        bench = (level.vllm_bench.completed if level.vllm_bench else None) or 0
        tokens = (users * plan.warmup + requests + bench) * plan.max_tokens
        plan.timings.record_run(server.key, users, wall_s / tokens)


@dataclass(frozen=True)
class OpenLoop:
    """Levels of arrival rates: requests arriving by a Poisson process, whatever is in flight (`--rates`)."""

    rates: list[float]
    bench_sends = " and arrivals"

    @property
    def loads(self) -> list[Load]:
        return [Open(r) for r in self.rates]

    def levels_text(self) -> str:
        return (f"rates {', '.join(f'{r:g}' for r in self.rates)} requests/s (open loop: Poisson arrivals, "
                f"nothing caps the requests in flight)")

    def each_run(self, plan: SweepPlan) -> str:
        per_run = ", ".join(f"{plan.requests[r]} requests at {r:g}/s" for r in self.rates)
        return (f"{plan.warmup * RATE_WARMUP_USERS} warm-up request(s) (closed loop, {RATE_WARMUP_USERS} users), "
                f"then {per_run} (the same arrival times for every variant of a repeat), {plan.max_tokens} output "
                f"tokens each")

    def run_tokens(self, plan: SweepPlan, server: ServerInfo, rate: float, repeat: int) -> float:
        clients = 1 + plan.bench_runs(repeat)
        return (RATE_WARMUP_USERS * plan.warmup + plan.requests[rate] * clients) * plan.max_tokens

    def run_estimate(self, plan: SweepPlan, server: ServerInfo, rate: float, repeat: int) -> Estimate:
        """Always assumed: the schedule's length, or the time the server takes for its tokens where it
        cannot keep up, plus the last request's own time, for Locust and again for vLLM's benchmark;
        the warm-up; the run's overhead."""
        n, one = plan.requests[rate], plan.max_tokens / plan.assumed_tps(server, 1)
        client = max(n / rate, n * plan.max_tokens / plan.assumed_tps(server, 32)) + one
        warm = RATE_WARMUP_USERS * plan.warmup * plan.max_tokens / plan.assumed_tps(server, RATE_WARMUP_USERS)
        return Estimate(client * (1 + plan.bench_runs(repeat)) + warm + RUN_OVERHEAD_S, False)

    def record_run(self, plan: SweepPlan, server: ServerInfo, level: LevelResult, wall_s: float) -> None:
        """Nothing to keep: an open loop's length is its schedule's, not the server's time per token."""


def duration_text(seconds: float) -> str:
    """`45 s`, `12 min`, `1 h 05 min`."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"

