"""The shape of results.json: a sweep holds variants, a variant holds its levels (one run of it at
one concurrency). Typed dicts, because the file is the interface: the report, `rejudge`, the
tuner and the advisor read it back as JSON, also from reports written before this code.
Everything is written through `loadtest.files.write_json` (atomically: a crash keeps the last
complete file)."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

CREATED_FORMAT = "%Y-%m-%dT%H:%M:%S%z"
"""`SweepResults.created`: when the sweep began, local time with its offset."""

Status = Literal["running", "starting", "ok", "flagged", "failed", "skipped", "interrupted"]


class LevelResult(TypedDict, total=False):
    """One measured run of a variant at one concurrency (closed loop) or one arrival rate (open
    loop: `rate` instead of `concurrency`)."""

    concurrency: int
    rate: float
    """Open loop: the arrival rate asked (requests/s); what was achieved is in `open_loop`."""
    seed: int
    """Open loop: the arrival schedule's seed (the same for every variant of a repeat)."""
    open_loop: dict[str, Any]
    """Open loop: `stats.open_loop` (achieved rate, send lag, in-flight series, behind, outcomes)."""
    outcomes: dict[str, int]
    """Open loop: how the requests ended (served, refused, timed_out, failed, unsent)."""
    repeat: int
    sequence: int
    """The run's place in the sweep (1 = first): says which of a pair of runs went first."""
    requests: int | None
    """Measured requests (None: the run lasted `duration_target_s`)."""
    duration_target_s: float | None
    configured_k: int | None
    """K the config gives at this concurrency (its schedule's where it has one); None for the baseline.
    The K that ran is `server.effective_k` (draft tokens per drafting step, from /metrics)."""
    status: Status
    """ok, flagged (measured, with problems to read), failed (not measured) or skipped."""
    problems: list[str]
    notes: list[str]
    """Things that limit how far a figure can be trusted, but do not flag the run."""
    locust: dict[str, Any]
    """Locust's exit code, wall and CPU seconds, and where its CSV, HTML, log and records are."""
    client: dict[str, Any]
    """What the client measured (`stats.summarize` over the request records)."""
    load_generator: dict[str, Any]
    """How late Locust itself was (`loadtest.sweeps.judging.load_generator_lag`)."""
    slo: dict[str, Any]
    server: dict[str, Any]
    """The engine's counters and histograms over the run (`prom.Delta.to_json`)."""
    consistency: dict[str, Any]
    """Client token count against the server's counter (`stats.agreement`)."""
    vllm_bench: dict[str, Any]
    """vLLM's serving benchmark on the same server right after (`vllm_bench.summarize`)."""
    vllm_bench_server: dict[str, Any]
    """The engine's counters over the benchmark's window."""
    vllm_bench_agreement: dict[str, Any]
    """Locust against the benchmark, figure by figure (`vllm_bench.compare`)."""


class VariantResult(TypedDict, total=False):
    """One server configuration: speculation with some K, or the baseline."""

    name: str
    label: str
    k: int | None
    drafter: str | None
    status: Status
    levels: list[LevelResult]
    error: str
    served_model: str
    speculative_config: dict[str, Any] | None
    device: str
    command: str
    server_log: str
    server_log_tail: list[str]
    server_exit_code: int | None
    startup_s: list[float]
    """Seconds to healthy, one per start."""
    url: str
    """A server that was already running (not started by the sweep)."""
    metrics: bool
    """Whether its /metrics could be read."""


class SweepResults(TypedDict, total=False):
    schema: int
    status: Status
    config: str
    settings: dict[str, Any]
    """The sweep's settings, flat (`request_settings.settings_record`)."""
    created: str
    machine: dict[str, Any]
    variants: list[VariantResult]
    problems: list[str]
    plan: dict[str, Any]
    """The order the sweep ran in and why, its server starts and its estimated seconds (`loadtest.sweeps.plan`)."""
    comparisons: list[dict[str, Any]]
    """Speedups derived by the report (`loadtest.measurement.derive.derive`), added to the written copy."""
