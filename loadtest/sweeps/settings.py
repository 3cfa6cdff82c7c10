"""What a sweep is asked to do (`SweepSettings`), the variants a config makes of it (speculation
at each K, the tuned schedule, alternatives, the baseline), and the sizes of its runs."""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from deploy import load_config
from deploy.config import Override, as_overrides
from models.embedded_pair import is_pair_folder
from deploy.preflight import ResolvedDeployment
from loadtest.measurement.results import LevelResult
from loadtest.traffic.request_settings import RequestSettings, settings_record

Loop = Literal["closed", "open"]
"""How a sweep's load comes: `closed`, a fixed number of users each sending its next request when
its last one ended; `open`, requests arriving at a rate whether or not earlier ones finished."""


@dataclass
class SweepSettings:
    config: str
    overrides: list[Override] = field(default_factory=list)
    """Config fields set for every variant (`--set`; texts given here are parsed: `as_overrides`)."""
    no_spec: bool = False
    """Run the baseline only."""
    baseline: bool = True
    """Also run the baseline (speculation off) beside the speculative variants."""
    extra_k: list[int] = field(default_factory=list)
    """More speculative variants with these K (num_speculative_tokens)."""
    alternatives: list[tuple[str, list[Override]]] = field(default_factory=list)
    """More speculative variants, each (name, overrides) of the config: another draft model, say."""
    users: list[int] = field(default_factory=lambda: [1, 32])
    rates: list[float] = field(default_factory=list)
    """Open loop: the levels are these arrival rates (requests/s), not `users`; empty: closed loop."""
    loop: Loop = field(init=False)
    """`open` (the levels are `rates`) or `closed` (the levels are `users`): set from `rates` when the
    settings are made, never given; read this, not `rates`, for the kind of load. Not in results.json
    (`record`): its `rates` say it there, as in reports made before this field."""
    repeat: int = 3
    """Runs of every (variant, concurrency); speedups get a 95% interval over them."""
    order: str = "auto"
    """`alternate`, `grouped` or `auto` (`loadtest.sweeps.plan.choose_order`)."""
    requests: int | None = None
    """Measured requests of each run, shared by its users; default: see `requests_for` (open loop:
    `requests_for_rate`)."""
    duration_s: float | None = None
    """Measure for this long per level instead of a request count (open loop: the requests that
    arrive in this long at the level's rate)."""
    warmup: int = 1
    """Warm-up requests per user before each run (not measured; open loop: per warm-up user)."""
    request: RequestSettings = field(default_factory=RequestSettings)
    """What each request looks like (workload, length, temperature, ...) and how users start."""
    traffic_source: str = ""
    """Where `request`'s traffic came from (`loadtest.traffic.declared.origin`), for the plan and the report."""
    workers: int = 0
    """Locust worker processes (0: one local process)."""
    vllm_bench: bool = True
    """After each Locust run, run vLLM's serving benchmark on the same server and compare."""
    level_timeout_s: float = 1800
    startup_timeout_s: float | None = None
    """Default: the config's server.startup_timeout_s."""
    tolerance: float = 0.05
    """Allowed relative difference between our token counts and the server's counter."""
    slo: str = ""
    """Service targets, e.g. `ttft_p95=500ms,tpot_p95=50ms` (see `loadtest.measurement.slo`); empty: none."""
    url: str = ""
    """Load the server already running here instead of starting one (`make serve` elsewhere)."""
    baseline_url: str = ""
    """With `url`: a running server without speculation to compare with."""
    model: str = ""
    """With `url`: the served model name (default: the config's, else the server's only model)."""
    tokenizer: str = ""
    """With `url`: tokenizer for vLLM's benchmark (default: the served model's folder if it is here)."""
    api_key_env: str | None = None
    """With `url`: variable holding the API key (default: the config's server.api_key_env)."""
    out: Path | None = None

    def __post_init__(self) -> None:
        # Overrides are data from here on; a caller may still give their `field=value` texts.
        self.overrides = as_overrides(self.overrides)
        self.alternatives = [(name, as_overrides(overrides)) for name, overrides in self.alternatives]
        self.loop = "open" if self.rates else "closed"

    def record(self) -> dict[str, Any]:
        """The settings as results.json keeps them: flat (`settings_record`), without `loop` (a
        reader tells the loop by `rates`, in older results too)."""
        return {k: v for k, v in settings_record(self).items() if k != "loop"}


def is_embedded(config: Any = None, folder: str = "") -> bool:
    """Whether a config (its target is `embedded:target`) or a model folder serves the embedded pair."""
    return (config is not None and str(config.target.model).startswith("embedded:")) or is_pair_folder(folder)


def requests_for(concurrency: int, requested: int | None) -> int:
    """Measured requests of a run: `requested`, or max(32, 8 x concurrency): on the embedded
    default about half a minute a run at batch 1 and at batch 32 without speculation."""
    return max(1, requested or max(32, 8 * concurrency))


OPEN_LOOP_SECONDS = 60.0
"""An open-loop level's default length: the requests that arrive in about this long."""
OPEN_LOOP_MIN_REQUESTS = 32


def requests_for_rate(rate: float, requested: int | None, duration_s: float | None = None) -> int:
    """Measured requests of an open-loop run: `requested`, else those arriving in `duration_s`,
    else in OPEN_LOOP_SECONDS, at least OPEN_LOOP_MIN_REQUESTS (percentiles need some)."""
    if requested:
        return max(1, requested)
    if duration_s:
        return max(1, round(duration_s * rate))
    return max(OPEN_LOOP_MIN_REQUESTS, math.ceil(OPEN_LOOP_SECONDS * rate))


def level_key(level: LevelResult) -> float:
    """A level's place in the sweep: its rate (open loop) or its concurrency."""
    return level["rate"] if "rate" in level else level["concurrency"]


def seed_for(repeat: int) -> int:
    """The arrival schedule's seed of an open-loop run: one per repeat, shared by all variants."""
    return repeat


# The variants' names, in every report, compare table and doc: `spec-k<K>` speculation at one K,
# `spec-schedule` speculation with the config's K by batch size, `baseline` speculation off.
SCHEDULE_VARIANT = "spec-schedule"


@dataclass(frozen=True)
class Variant:
    name: str
    label: str
    overrides: tuple[Override, ...]
    no_speculation: bool
    k: int | None
    drafter: str | None


def plan_variants(settings: SweepSettings) -> list[Variant]:
    config = load_config(settings.config, settings.overrides)
    spec = config.speculation
    baseline = Variant("baseline", "no speculation", (), True, None, None)
    if settings.no_spec or not spec.enabled:
        return [baseline]
    if spec.schedule:
        # A tuned config: its schedule against each fixed K it chose from (schedule removed, and
        # the temperature gate a tuned plugin config carries too: a fixed K drafts for every request).
        schedule = ", ".join(f"{a}-{b}: {k}" for a, b, k in spec.schedule)
        gate = "" if spec.draft_max_temperature is None else f", drafts at T <= {spec.draft_max_temperature:g}"
        tuned = Variant(SCHEDULE_VARIANT, f"{spec.drafter} K by batch size ({schedule}{gate})", (), False,
                        spec.num_speculative_tokens, spec.drafter)
        fixed = [Variant(f"spec-k{k}", f"{spec.drafter} K={k}", (Override("speculation.schedule", None),
                                                                 Override("speculation.draft_max_temperature", None),
                                                                 Override("speculation.num_speculative_tokens", k)),
                         False, k, spec.drafter) for k in dict.fromkeys(settings.extra_k)]
        return [tuned, *fixed, *_alternatives(settings, spec)] + ([baseline] if settings.baseline else [])
    ks = [spec.num_speculative_tokens] + [k for k in settings.extra_k if k != spec.num_speculative_tokens]
    variants = []
    for k in dict.fromkeys(ks):
        extra = () if k == spec.num_speculative_tokens else (Override("speculation.num_speculative_tokens", k),)
        variants.append(Variant(f"spec-k{k}", f"{spec.drafter} K={k}", extra, False, k, spec.drafter))
    return variants + _alternatives(settings, spec) + ([baseline] if settings.baseline else [])


def _alternatives(settings: SweepSettings, spec: Any) -> list[Variant]:
    return [Variant(name, f"{spec.drafter} K={spec.num_speculative_tokens}, " + " ".join(map(str, overrides)),
                    tuple(overrides), False, spec.num_speculative_tokens, spec.drafter)
            for name, overrides in settings.alternatives]


def configured_k(resolved: ResolvedDeployment | None, variant: Variant, users: int) -> int | None:
    """K the config gives a step at `users` running requests (its schedule's, where it has one);
    None without speculation. The effective K the server reports is read beside it."""
    if variant.no_speculation:
        return None
    if resolved is None:  # a running server given by URL: what it told
        return variant.k
    return resolved.config.speculation.k_at_batch(users)


def default_out_dir(config: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", Path(config).stem)
    return Path("reports") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
