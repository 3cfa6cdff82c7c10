"""What the reports derive from a sweep's levels, as types (made in `loadtest.measurement.derive`):
a speculative run against its baseline (`Comparison`), those taken over the repeats with a verdict
(`SpeedupSummary`), an open-loop run beside its baseline (`RateRow`), a prompt category's figures
(`CategoryRow`) and a variant's cost (`CostRow`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from loadtest.measurement.figures import ContentSummary, Distribution, Interval
from loadtest.measurement.serial import Serial


@dataclass
class SpeculationAnalysis(Serial):
    """Measured acceptance beside the model's expectations and the break-even acceptance
    (`stats.speculation_analysis`; the arithmetic is in `loadtest.measurement.stats`' docstring)."""

    k: int = 0
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None
    expected_tokens_per_step: float | None = None
    implied_per_token_acceptance: float | None = None
    step_cost_ratio: float | None = None
    """A speculative step's cost in target steps: TPOT_spec x L / TPOT_base."""
    break_even_acceptance_rate: float | None = None
    break_even_per_token_acceptance: float | None = None
    measured_speedup: float | None = None
    """Per token on the engine's clock: TPOT_base / TPOT_spec."""
    pays: bool | None = None


@dataclass
class Comparison(SpeculationAnalysis):
    """A speculative variant's closed-loop run against the baseline's run of the same batch size
    and repeat (`derive.derive`)."""

    variant: str = ""
    concurrency: int = 0
    repeat: int = 1
    per_token_source: str = "server"
    """Whose per-token latency the cost model used: the engine's histogram (server) or the client's."""
    went_first: bool | None = None
    speedup: float | None = None
    """Client output tokens/s over the baseline's."""
    vllm_bench_speedup: float | None = None
    valid_speedup: float | None = None
    """Per-request tokens/s over the content-valid requests, over the baseline's."""
    content: ContentSummary | None = None
    baseline_content: ContentSummary | None = None
    vllm_bench_content: ContentSummary | None = None


@dataclass
class SpeedupSummary(Serial):
    """A speculative variant at one batch size over its repeats: each speedup's mean and 95%
    interval, and the verdict read from them together (`derive.summarize_speedups`)."""

    variant: str = ""
    concurrency: int = 0
    runs: int = 0
    speedup: Interval = field(default_factory=Interval)
    vllm_bench_speedup: Interval = field(default_factory=Interval)
    measured_speedup: Interval = field(default_factory=Interval)
    acceptance_rate: Interval = field(default_factory=Interval)
    mean_accepted_length: Interval = field(default_factory=Interval)
    valid_speedup: Interval = field(default_factory=Interval)
    content: ContentSummary | None = None
    baseline_content: ContentSummary | None = None
    vllm_bench_content: ContentSummary | None = None
    speedup_by_order: dict[str, float] | None = None
    """Mean client speedup of the runs that went first and of those that went second."""
    verdict: str = ""


@dataclass
class RateBench(Serial):
    """vLLM's benchmark beside an open-loop run."""

    output_tokens_per_s: float | None = None
    ttft_p50_ms: float | None = None
    tpot_p50_ms: float | None = None
    agrees: bool | None = None
    error: str | None = None


@dataclass
class RateRow(Serial):
    """One open-loop run (`derive.derive_rates`); for speculation, what a user sees against the
    baseline's run at the same rate and repeat (above 1: speculation faster)."""

    variant: str = ""
    rate: float = 0.0
    repeat: int = 1
    status: str = ""
    achieved_rate: float | None = None
    behind: bool | None = None
    in_flight_max: int | None = None
    in_flight_mean: float | None = None
    outcomes: dict[str, int] = field(default_factory=dict)
    ttft_ms: Distribution = field(default_factory=Distribution)
    tpot_ms: Distribution = field(default_factory=Distribution)
    e2e_ms: Distribution = field(default_factory=Distribution)
    output_tokens_per_s: float | None = None
    acceptance: float | None = None
    bench: RateBench = field(default_factory=RateBench)
    tpot_p50_speedup: float | None = None
    """The baseline's TPOT p50 over this run's."""
    e2e_mean_speedup: float | None = None
    """The baseline's mean end-to-end latency over this run's."""


@dataclass
class CategoryRow(Serial):
    """A variant's figures over one prompt category at one batch size (`derive.by_category`)."""

    concurrency: int = 0
    category: str = ""
    variant: str = ""
    requests: int = 0
    not_text: int = 0
    acceptance: float | None = None
    tokens_per_s: float | None = None
    speedup: Interval | None = None
    """Over the baseline's same category in the same repeat."""


@dataclass
class CostRow(Serial):
    """A variant's GPU-hours in a sweep and its cost per million output tokens (`derive.costs`)."""

    variant: str = ""
    gpus: int = 0
    price_per_gpu_hour: float = 0.0
    gpu_hours: float = 0.0
    cost_per_million_tokens: dict[int, float] = field(default_factory=dict)
    """By batch size."""
