"""The figures inside a measured level, as types: what the client measured (`ClientFigures`), the
engine's counters over the run (`ServerFigures`), an open loop's offered load (`OpenLoopFigures`),
vLLM's benchmark (`BenchFigures`) and how the two clients agree (`Agreement`), the service targets
(`SloFigures`), the client's token count against the engine's (`Consistency`), Locust's own run
(`LocustRun`) and how late it was (`GeneratorLag`). Each is made in one place (named on it) and
written into results.json as the JSON object it always was (`Serial`), so older files load."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loadtest.measurement.serial import Serial


@dataclass
class Distribution(Serial):
    """Mean, spread and percentiles of a set of values (`stats.distribution`); `min` and `max` where
    the maker adds them."""

    n: int | None = None
    mean: float | None = None
    std: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    min: float | None = None
    max: float | None = None
    over_50ms: int | None = None
    """Loop lag only: wake-ups more than 50 ms late."""

    def percentile(self, name: str) -> float | None:
        """`p50`, `p90`, `p95`, `p99` or `mean` by name (a target names its percentile)."""
        return getattr(self, name) if name in PERCENTILE_NAMES else None


PERCENTILE_NAMES = ("mean", "p50", "p90", "p95", "p99")


def p50(d: Distribution | None) -> float | None:
    return d.p50 if d else None

NO_VALUES = Distribution(n=0)


@dataclass
class Interval(Serial):
    """The mean of repeated measurements and its 95% interval (`stats.mean_interval`; no interval
    from fewer than two runs), with the largest relative distance of a run from the mean."""

    n: int = 0
    mean: float | None = None
    low: float | None = None
    high: float | None = None
    max_deviation: float | None = None


@dataclass
class ContentReference(Serial):
    """What a run's outputs are held against: mean distinct 4-grams of text that is known to be text."""

    distinct_4: float | None = None
    source: str = ""


@dataclass
class ContentSummary(Serial):
    """Whether a run's outputs are text (`content.summarize`, `content.merge`)."""

    checked: int = 0
    reference: ContentReference | None = None
    degenerate: int | None = None
    """Outputs that loop."""
    degenerate_share: float | None = None
    distinct_4: float | None = None
    loop_share: float | None = None
    noise_checked: int | None = None
    noise: int | None = None
    """Outputs that are mostly made-up words (and do not loop)."""
    noise_share: float | None = None
    known_words: float | None = None
    vs_reference: float | None = None
    like_reference: bool | None = None
    acceptance_valid: float | None = None
    acceptance_degenerate: float | None = None
    tokens_per_s_valid: float | None = None
    tokens_per_s_degenerate: float | None = None

    @property
    def not_text(self) -> int:
        """Outputs that loop or are noise."""
        return (self.degenerate or 0) + (self.noise or 0)


@dataclass
class CategoryFigures(Serial):
    """A run's figures over one prompt category (`stats.by_category`)."""

    requests: int = 0
    output_tokens: int = 0
    tokens_per_s: float | None = None
    """Mean per-request output tokens/s."""
    acceptance: float | None = None
    not_text: int = 0


@dataclass
class ClientFigures(Serial):
    """What the client measured over a run's requests (`stats.summarize`)."""

    requests: int = 0
    ok: int = 0
    failed: int = 0
    failure_reasons: dict[str, int] = field(default_factory=dict)
    failure_examples: list[str | None] = field(default_factory=list)
    interval_start: float | None = None
    interval_end: float | None = None
    duration_s: float | None = None
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    tokens_seen: int | None = None
    request_throughput: float | None = None
    output_tokens_per_s: float | None = None
    total_tokens_per_s: float | None = None
    per_user_tokens_per_s: Distribution | None = None
    ttft_ms: Distribution | None = None
    per_token_latency_ms: Distribution | None = None
    chunk_gap_ms: Distribution | None = None
    tokens_per_chunk: Distribution | None = None
    e2e_ms: Distribution | None = None
    output_tokens_per_request: Distribution | None = None
    peak_output_tokens_per_s: float | None = None
    content: ContentSummary | None = None
    server_per_request_spec: dict[str, float] | None = None
    """The server's per-request speculation figures, averaged over the requests."""
    by_category: dict[str, CategoryFigures] | None = None
    """Per prompt category, where the workload has categories (`stats.by_category`)."""


@dataclass
class OpenLoopFigures(Serial):
    """What an open-loop run offered and how its requests ended (`stats.open_loop`)."""

    asked_rate: float = 0.0
    requests: int = 0
    sent: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    achieved_rate: float | None = None
    scheduled_rate: float | None = None
    send_lag_ms: Distribution | None = None
    in_flight: list[list[float]] = field(default_factory=list)
    """[[seconds from the first send, requests in flight], ...]."""
    in_flight_max: int = 0
    in_flight_mean: float | None = None
    behind: bool = False
    behind_reasons: list[str] = field(default_factory=list)


@dataclass
class HistogramFigures(Serial):
    """One of the engine's latency histograms over a window (`prom.delta`)."""

    count: float = 0.0
    mean: float | None = None
    p50: float | None = None
    p99: float | None = None


@dataclass
class ServerFigures(Serial):
    """What the engine counted between two scrapes of /metrics (`prom.delta`)."""

    interval_s: float = 0.0
    generation_tokens: float = 0.0
    prompt_tokens: float = 0.0
    requests_finished: float = 0.0
    spec_enabled: bool = False
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    acceptance_rate: float | None = None
    """Accepted / proposed draft tokens (a fraction; vLLM's benchmark prints it x100)."""
    mean_accepted_length: float | None = None
    """Tokens per verification step: 1 + accepted / drafts (vLLM's "acceptance length")."""
    effective_k: float | None = None
    """Draft tokens per drafting step of a request: the K that ran."""
    per_position_acceptance: list[float] = field(default_factory=list)
    output_tokens_per_s: float | None = None
    """Generated tokens over the client's measured interval (set by the sweep)."""
    histograms: dict[str, HistogramFigures] = field(default_factory=dict)
    """By `prom.HISTOGRAMS` key (ttft_s, per_token_latency_s, e2e_s, ...)."""

    def histogram(self, key: str) -> HistogramFigures:
        """One histogram's figures (empty where the server did not report it)."""
        return self.histograms.get(key) or HistogramFigures()


@dataclass
class PerRequest(Serial):
    """TTFT and per-token latency (ms) of each of the benchmark's requests, in the dataset's order
    (None: the request failed)."""

    ttft_ms: list[float | None] = field(default_factory=list)
    per_token_ms: list[float | None] = field(default_factory=list)


@dataclass
class BenchFigures(Serial):
    """vLLM's serving benchmark on the same server, in our client's names and units
    (`vllm_bench.summarize`); `error` where it could not run."""

    error: str | None = None
    completed: int | None = None
    failed: int | None = None
    duration_s: float | None = None
    output_tokens: int | None = None
    output_tokens_per_s: float | None = None
    ttft_ms: Distribution | None = None
    per_token_latency_ms: Distribution | None = None
    itl_ms: Distribution | None = None
    e2e_ms: Distribution | None = None
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None
    open_loop_requests: int | None = None
    per_request: PerRequest | None = None
    content: ContentSummary | None = None


@dataclass
class FigureAgreement(Serial):
    """One figure, Locust's against vLLM's benchmark's (`second_opinion.compare`)."""

    locust: float | None = None
    vllm_bench: float | None = None
    difference: float | None = None
    engine_drift: float | None = None
    vllm_bench_adjusted: float | None = None
    difference_adjusted: float | None = None
    matched_difference: float | None = None
    matched_requests: int | None = None
    tolerance: float = 0.0
    agrees: bool | None = None

    @property
    def judged(self) -> float | None:
        """The difference the check rests on: drift taken out, else request by request, else raw."""
        for value in (self.difference_adjusted, self.matched_difference, self.difference):
            if value is not None:
                return value
        return None


COMPARED = ("output_tokens_per_s", "ttft_p50_ms", "per_token_p50_ms")
"""The figures Locust and vLLM's benchmark are compared on: fields of `Agreement` and `Systematic`."""


def _compared(holder: Agreement | Systematic) -> dict[str, Any]:
    return {k: v for k in COMPARED if (v := getattr(holder, k)) is not None}


@dataclass
class Agreement(Serial):
    """Locust against vLLM's benchmark over one run, figure by figure (`second_opinion.compare`)."""

    output_tokens_per_s: FigureAgreement | None = None
    ttft_p50_ms: FigureAgreement | None = None
    per_token_p50_ms: FigureAgreement | None = None
    agrees: bool | None = None

    def figures(self) -> dict[str, FigureAgreement]:
        """The compared figures by name (`COMPARED`), those that were compared."""
        return _compared(self)


@dataclass
class FigureSystematic(Interval):
    """One figure's judged differences over a level's runs (`second_opinion.systematic`)."""

    runs: int = 0
    tolerance: float = 0.0
    engine_drift_mean: float | None = None
    """How much slower (+) the engine ran under the benchmark than under Locust, averaged."""
    agrees: bool | None = None


@dataclass
class Systematic(Serial):
    """A level's repeated runs taken together: do Locust and vLLM's benchmark read the same engine
    (`second_opinion.systematic`)?"""

    variant: str = ""
    concurrency: int | None = None
    output_tokens_per_s: FigureSystematic | None = None
    ttft_p50_ms: FigureSystematic | None = None
    per_token_p50_ms: FigureSystematic | None = None
    agrees: bool | None = None

    def figures(self) -> dict[str, FigureSystematic]:
        """The judged figures by name (`COMPARED`), those that were judged."""
        return _compared(self)


@dataclass
class Consistency(Serial):
    """The client's output token count against the engine's counter (`stats.agreement`)."""

    ok: bool = False
    relative_error: float | None = None
    tolerance: float = 0.05
    client_output_tokens: int | None = None
    server_generation_tokens: float | None = None


@dataclass
class TargetFigures(Serial):
    """One service target over a run (`slo.evaluate`)."""

    bound_ms: float = 0.0
    value_ms: float | None = None
    """The percentile the verdict rests on (None: it falls on a failed request)."""
    share_within: float | None = None
    met: bool = False


@dataclass
class SloFigures(Serial):
    """A run held against its service targets (`slo.evaluate`)."""

    targets: dict[str, TargetFigures] = field(default_factory=dict)
    requests: int = 0
    goodput_tokens_per_s: float | None = None
    share_within_all: float | None = None
    met: bool = False


@dataclass
class LocustRun(Serial):
    """Locust's measured run: exit code, wall and CPU seconds, and where its files are (relative
    to the report folder)."""

    exit_code: int | None = None
    wall_s: float | None = None
    cpu_s: float | None = None
    csv: str | None = None
    html: str | None = None
    log: str | None = None
    records: str | None = None


@dataclass
class GeneratorLag(Serial):
    """How late the load generator was (`judging.load_generator_lag`)."""

    send_lag_ms: Distribution | None = None
    loop_lag_ms: Distribution | None = None
    stall_runqueue_share: float | None = None
    """How much of the stalled time the OS had Locust runnable but off the CPU (None: not known)."""
