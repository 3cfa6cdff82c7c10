"""What a load test finds, as types: a sweep (`SweepResults`) holds its variants (`VariantResult`,
one server configuration), a variant holds its levels (`LevelResult`, one measured run at one
concurrency or arrival rate); a capacity search (`CapacityResults`) holds its levels
(`CapacityLevel`). results.json and capacity.json are their serialisation, with a version number
(`schema`): the report, `compare`, `rejudge`, the tuner and the advisor read them back with
`load`, also from files older code wrote.

The figures inside a level (what the client measured, the engine's counters, vLLM's benchmark...)
are types too (`loadtest.measurement.figures`). Every type here is a `Serial`: None fields are left
out of the file, keys this code does not know are kept, and files are written atomically
(`loadtest.files.write_json`): a crash keeps the last complete one."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from loadtest.measurement.derived import Comparison, RateRow
from loadtest.measurement.capacity_figures import (Crossover, Overload, RateSpeedup, Scan, SearchRequest,
                                                   SearchSettings, SecondOpinion, VariantCapacity)
from loadtest.measurement.figures import (Agreement, BenchFigures, ClientFigures, Consistency, GeneratorLag,
                                          LocustRun, OpenLoopFigures, ServerFigures, SloFigures)
from loadtest.measurement.serial import Serial

SWEEP_SCHEMA = 4
"""results.json's version. 1 (no `schema` key) and 2 wrote the same keys as plain objects; 3 is
their serialisation as these types (None fields left out); 4 the figures inside a level as types
too (the same keys; None figures left out). All four load."""
CAPACITY_SCHEMA = 3
"""capacity.json's version. 1 wrote the same keys as a plain object, 2 its levels as types; 3 the
search's figures as types too (the same keys; None figures left out). All three load."""

CREATED_FORMAT = "%Y-%m-%dT%H:%M:%S%z"
"""`created`: when the sweep or search began, local time with its offset."""

Status = Literal["running", "starting", "ok", "flagged", "failed", "skipped", "interrupted"]


@dataclass(frozen=True)
class Closed:
    """A closed loop: `users` users, each sending its next request when its last one ends."""

    users: int
    throughput_follows_engine: ClassVar[bool] = True
    """Its throughput is set by the engine's speed: each user waits on the engine before sending
    again (an open loop's is set by its arrivals, while the engine keeps up)."""

    @property
    def at(self) -> float:
        return self.users

    @property
    def max_in_flight(self) -> int | None:
        """The most requests it keeps in flight: its users (an open loop: None, nothing caps them)."""
        return self.users

    @property
    def name(self) -> str:
        """How a table's column names it: `32`."""
        return str(self.users)

    @property
    def label(self) -> str:
        """How lines and titles name it: `c=32`."""
        return f"c={self.users}"

    @property
    def where(self) -> str:
        """How a warning places it: `batch 32`."""
        return f"batch {self.users}"

    def level(self, repeat: int = 1) -> LevelResult:
        """An empty level at this load."""
        return LevelResult(concurrency=self.users, repeat=repeat)

    def prompt_order(self, level: LevelResult, workers: int) -> tuple[int, int]:
        """How `level`'s prompts went out, for vLLM's benchmark to send the same (`Workload.sequence`):
        (requests, Locust workers that split them)."""
        return (level.client.requests if level.client else 0), workers


@dataclass(frozen=True)
class Open:
    """An open loop: requests arriving at `rate` per second (Poisson), whether or not earlier ones ended."""

    rate: float
    throughput_follows_engine: ClassVar[bool] = False

    @property
    def at(self) -> float:
        return self.rate

    @property
    def max_in_flight(self) -> int | None:
        return None

    @property
    def name(self) -> str:
        return f"{self.rate:g}/s"

    @property
    def label(self) -> str:
        return f"{self.rate:g}/s"

    @property
    def where(self) -> str:
        return f"{self.rate:g} req/s"

    def level(self, repeat: int = 1) -> LevelResult:
        return LevelResult(rate=self.rate, repeat=repeat)

    def prompt_order(self, level: LevelResult, workers: int) -> tuple[int, int]:
        # The whole schedule (its length fixes the arrival times), in arrival order whatever the workers.
        return level.requests or 0, 0


Load = Closed | Open
"""What a level put on the server."""


@dataclass
class LevelResult(Serial):
    """One measured run of a variant at one concurrency (closed loop) or one arrival rate (open
    loop: `rate` instead of `concurrency`)."""

    concurrency: int | None = None
    """Closed loop: the number of users, each sending its next request when the last one ends."""
    rate: float | None = None
    """Open loop: the arrival rate asked (requests/s); what was achieved is in `open_loop`."""
    repeat: int = 1
    seed: int | None = None
    """Open loop: the arrival schedule's seed (the same for every variant of a repeat)."""
    requests: int | None = None
    """Measured requests (None: the run lasted `duration_target_s`)."""
    duration_target_s: float | None = None
    configured_k: int | None = None
    """K the config gives at this concurrency (its schedule's where it has one); None for the baseline.
    The K that ran is `server["effective_k"]` (draft tokens per drafting step, from /metrics)."""
    problems: list[str] = field(default_factory=list)
    locust: LocustRun | None = None
    """Locust's exit code, wall and CPU seconds, and where its CSV, HTML, log and records are."""
    client: ClientFigures | None = None
    """What the client measured (`stats.summarize` over the request records)."""
    open_loop: OpenLoopFigures | None = None
    """Open loop: `stats.open_loop` (achieved rate, send lag, in-flight series, behind, outcomes)."""
    outcomes: dict[str, int] | None = None
    """Open loop: how the requests ended (served, refused, timed_out, failed, unsent)."""
    load_generator: GeneratorLag | None = None
    """How late Locust itself was (`loadtest.sweeps.judging.load_generator_lag`)."""
    slo: SloFigures | None = None
    """The service targets held against the run (`slo.evaluate`); None where none were set."""
    server: ServerFigures | None = None
    """The engine's counters and histograms over the run (`prom.Delta.to_json`)."""
    consistency: Consistency | None = None
    """Client token count against the server's counter (`stats.agreement`)."""
    notes: list[str] = field(default_factory=list)
    """Things that limit how far a figure can be trusted, but do not flag the run."""
    vllm_bench: BenchFigures | None = None
    """vLLM's serving benchmark on the same server right after (`vllm_bench.summarize`)."""
    vllm_bench_server: ServerFigures | None = None
    """The engine's counters over the benchmark's window."""
    vllm_bench_agreement: Agreement | None = None
    """Locust against the benchmark, figure by figure (`second_opinion.compare`)."""
    step_ms: dict[str, float] | None = None
    """Where the engine's steps spent their time over the measured run, ms per step by phase
    (`plugins.step_profile.per_step_ms`): servers the sweep started in one engine process."""
    status: Status = "running"
    """ok, flagged (measured, with problems to read), failed (not measured) or skipped."""
    sequence: int | None = None
    """The run's place in the sweep (1 = first): says which of a pair of runs went first."""

    @property
    def load(self) -> Load:
        """Its load: an arrival rate (open loop) or a number of users (closed loop)."""
        return Open(self.rate) if self.rate is not None else Closed(self.concurrency or 0)

    @property
    def at(self) -> float:
        """The arrival rate (open loop) or the concurrency (closed loop)."""
        return self.load.at

    @property
    def label(self) -> str:
        """`2/s` for an arrival rate, `c=32` for a concurrency: how lines and titles name it."""
        return self.load.label

    @property
    def measured_requests(self) -> int:
        """The requests its client measured, where the level was measured (ok or flagged); else 0."""
        return (self.client.requests or 0) if self.client and self.status in ("ok", "flagged") else 0

    @property
    def ok_client(self) -> ClientFigures | None:
        """What the client measured, where it measured anything (`client["ok"]`)."""
        return self.client if self.client and self.client.ok else None


@dataclass
class VariantResult(Serial):
    """One server configuration: speculation with some K, or the baseline."""

    name: str = ""
    label: str = ""
    k: int | None = None
    drafter: str | None = None
    status: Status = "starting"
    levels: list[LevelResult] = field(default_factory=list)
    error: str | None = None
    """Why it measured nothing (a failed start, a config that does not fit)."""
    served_model: str | None = None
    speculative_config: dict[str, Any] | None = None
    """The speculative config its server ran with (None: no speculation)."""
    device: str | None = None
    gpus: int | None = None
    """GPUs its server used (tensor x pipeline x data parallel), on a GPU device."""
    price_per_gpu_hour: float | None = None
    """The config's `resources.price_per_gpu_hour`, for the report's costs."""
    command: str | None = None
    """The `vllm serve` command line that started it."""
    server_log: str | None = None
    server_log_tail: list[str] | None = None
    server_exit_code: int | None = None
    startup_s: list[float] = field(default_factory=list)
    """Seconds to healthy, one per start."""
    url: str | None = None
    """A server that was already running (not started by the sweep)."""
    metrics: bool | None = None
    """Whether its /metrics could be read (a running server's)."""



@dataclass
class SweepResults(Serial):
    """A sweep: every variant at every level and repeat (results.json)."""

    schema: int = SWEEP_SCHEMA
    status: Status = "running"
    config: str | None = None
    """The config file swept, or the URL of the running server measured."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The sweep's settings, flat (`request_settings.settings_record`)."""
    created: str | None = None
    machine: dict[str, Any] | None = None
    """CPU, cores, memory, GPU and versions (`loadtest.sweeps.provenance.machine_info`)."""
    variants: list[VariantResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    plan: dict[str, Any] | None = None
    """The order the sweep ran in and why, its server starts and its estimated seconds (`loadtest.sweeps.plan`)."""
    comparisons: list[Comparison] | None = None
    """Closed-loop speedups derived by the report (`loadtest.measurement.derive.derive`), added to the written copy."""
    rate_comparisons: list[RateRow] | None = None
    """Open-loop speedups at each rate, derived by the report likewise."""


    def levels(self, kind: type[Closed] | type[Open] | None = None) -> list[tuple[VariantResult, LevelResult]]:
        """Every level with its variant (those of one `kind` of load: `Closed` or `Open`), in the order
        of the variants."""
        return [(v, lv) for v in self.variants for lv in v.levels if kind is None or isinstance(lv.load, kind)]

    @classmethod
    def load(cls, path: Path) -> SweepResults:
        """A results.json (or the folder holding it), of this version or an older one."""
        return cls.from_json(read_versioned(path, "results.json", ("variants",), "a load test's", SWEEP_SCHEMA))


@dataclass
class CapacityLevel(LevelResult):
    """One level of a capacity search: a variant at one arrival rate, and whether it met the targets."""

    variant: str = ""
    phase: str = ""
    """search, scan, second-opinion or overload."""
    wall_s: float | None = None
    meets_targets: bool = False
    why: str = ""
    """Why it met the targets or not, in words."""
    server_gone: str | None = None
    """The variant's server stopped answering after this level: its search stopped here."""

    @classmethod
    def of(cls, level: LevelResult, **more: Any) -> CapacityLevel:
        """A copy of `level` (measured by a sweep) as a level of the search, with the search's fields `more`."""
        return cls.from_json({**level.to_json(), **more})


@dataclass
class CapacityResults(Serial):
    """A capacity search (capacity.json): each variant's highest rate within the service targets,
    where speculation stops paying, a second opinion and an overload run."""

    schema: int = CAPACITY_SCHEMA
    status: Status = "running"
    slo: str = ""
    """The service targets, as given (`--slo`, e.g. "ttft_p95=1000ms,tpot_p95=100ms")."""
    settings: SearchSettings = field(default_factory=SearchSettings)
    variants: list[str] = field(default_factory=list)
    spec_variant: str | None = None
    """The speculative variant's name (None: the baseline alone)."""
    created: str | None = None
    levels: list[CapacityLevel] = field(default_factory=list)
    capacity: dict[str, VariantCapacity] = field(default_factory=dict)
    """Per variant: the capacity its search found (`loadtest.sweeps.capacity.search`)."""
    crossover: Crossover | None = None
    """Where the per-token speedup crosses 1.0 (`e2e`: the end-to-end one's), derived from `speedups`."""
    scan: Scan | None = None
    second_opinion: list[SecondOpinion] = field(default_factory=list)
    overload: dict[str, Overload] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    config: str | None = None
    machine: dict[str, Any] | None = None
    traffic: list[str] | None = None
    """The traffic the search ran, in words (`loadtest.traffic.declared.describe`)."""
    request: SearchRequest | None = None
    speedups: list[RateSpeedup] | None = None
    """Paired speedups per rate, derived when the search concludes."""
    revised: dict[str, VariantCapacity] | None = None
    """Capacities revised by the repeats, derived when the search concludes."""


    @classmethod
    def load(cls, path: Path) -> CapacityResults:
        """A capacity.json (or the folder holding it), of this version or an older one."""
        return cls.from_json(read_versioned(path, "capacity.json", ("capacity", "levels"), "a capacity search's",
                                            CAPACITY_SCHEMA))


def read_versioned(path: Path, name: str, keys: tuple[str, ...], whose: str, current: int) -> dict[str, Any]:
    """The file `name` (`path`, or `name` in the folder `path`) as this version reads it: refused
    (ValueError) where it lacks `keys` or a newer kit wrote it (its meaning is then unknown). The
    versions so far differ in how they were written, not in what they hold, so an older file needs
    no change but its `schema`."""
    path = path / name if path.is_dir() else path
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or any(k not in data for k in keys):
        raise ValueError(f"{path}: not {whose} {name}")
    version = data.get("schema") or 1
    if not isinstance(version, int) or version > current:
        raise ValueError(f"{path}: written by a newer specdeploy (schema {version}; this one reads up to "
                         f"{current}): update the kit to read it")
    return {**data, "schema": current}
