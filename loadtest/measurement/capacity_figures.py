"""What a capacity search finds, as types (`VariantCapacity`, `Crossover`, `Scan`, `SecondOpinion`,
`Overload`...: capacity.json's fields besides the levels), and what its levels say: speculation and
the baseline paired at each rate (the same arrivals), the speedup there and where it crosses 1.0,
capacities a later run contradicts (`revised`), and the report's first lines (`headline`). The
search that measures the levels is `loadtest.sweeps.capacity`; the pages,
`loadtest.reports.capacity_report`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from loadtest.measurement import content
from loadtest.measurement.figures import NO_VALUES, ClientFigures, Distribution, FigureAgreement
from loadtest.measurement.serial import Serial

if TYPE_CHECKING:  # results.py declares its fields with this module's types
    from loadtest.measurement.results import CapacityLevel, CapacityResults, LevelResult

    Pair = tuple[CapacityLevel, CapacityLevel]  # speculation's level and the baseline's: the same arrivals

BASELINE = "baseline"
"""The variant without speculation: every speedup is over its run at the same rate and repeat."""


# ---------------------------------------------------------------------------------- the types
@dataclass
class SearchSettings(Serial):
    """The search's settings as capacity.json keeps them (`loadtest.sweeps.capacity.CapacitySettings`
    says what each means; None: not recorded)."""

    slo: str | None = None
    start_rate: float | None = None
    max_rate: float | None = None
    min_rate: float | None = None
    repeat: int | None = None
    precision: float | None = None
    max_steps: int | None = None
    scan_steps: int | None = None
    overload_s: float | None = None
    second_opinion: bool | None = None


@dataclass
class SearchRequest(Serial):
    """The requests every level sends."""

    workload: str | None = None
    api: str | None = None
    max_tokens: int | None = None
    fixed_length: bool | None = None
    temperature: float | None = None


@dataclass
class MissedRun(Serial):
    """A run at or below a capacity that missed the targets (`revised`)."""

    rate: float = 0.0
    phase: str = ""
    why: str = ""


@dataclass
class VariantCapacity(Serial):
    """One variant's capacity: what its search found (`loadtest.sweeps.capacity.VariantSearch.result`),
    or what every run measured allows (`revised`)."""

    variant: str = ""
    capacity: float | None = None
    """The highest rate (req/s) at which every run met the targets (None: none did)."""
    interval: list[float | None] = field(default_factory=lambda: [None, None])
    """[the highest passing rate, the lowest failing one] (None: none passed, none failed)."""
    status: str = ""
    """found, budget, open, at least, none passing or stopped; revised (`revised`)."""
    steps: int = 0
    """The distinct rates the search asked for."""
    stopped: str | None = None
    """Why the search ended early (its server stopped answering)."""
    lowest_tried: float | None = None
    runs: dict[str, list[bool]] = field(default_factory=dict)
    """Rate (`%g`) -> whether each run there met the targets, in repeat order."""
    was: float | None = None
    """Revised: the search's capacity."""
    missed: list[MissedRun] | None = None
    """Revised: the runs that contradict the search's capacity."""


@dataclass
class RateSpeedup(Serial):
    """Speculation against the baseline at one rate, means over its pairs (`paired_speedups`)."""

    rate: float = 0.0
    pairs: int = 0
    speedup: float | None = None
    """The baseline's per-token latency p50 over speculation's."""
    e2e_speedup: float | None = None
    """The baseline's mean end-to-end latency over speculation's."""


@dataclass
class Crossing(Serial):
    """Where a speedup crosses 1.0 between two measured rates."""

    rate: float = 0.0
    between: list[float] = field(default_factory=list)
    direction: str = ""
    """down: speculation stops paying above it; up: it starts paying."""


@dataclass
class Crossover(Serial):
    """Where a speedup crosses 1.0 (`crossover`)."""

    kind: str = "no pairs"
    """stops paying, starts paying, pays throughout, never pays or no pairs."""
    rate: float | None = None
    """The first fall below 1.0 (else the first crossing), interpolated in log(rate)."""
    between: list[float] | None = None
    crossings: list[Crossing] = field(default_factory=list)
    range: list[float] | None = None
    """[the lowest rate paired, the highest]."""
    speedups: list[float] | None = None
    """[the lowest speedup, the highest]."""
    e2e: Crossover | None = None
    """The end-to-end speedup's crossover (on the per-token one)."""


@dataclass
class Scan(Serial):
    """Both variants above the search's rates while speculation still pays (`Capacity._scan`)."""

    rates: list[float] = field(default_factory=list)
    ended: str = ""
    saturated_at: float | None = None
    """The rate from which neither variant's throughput grew."""


@dataclass
class SecondOpinion(Serial):
    """Locust against vLLM's benchmark in one level below the capacities."""

    variant: str = ""
    rate: float = 0.0
    share: float = 0.0
    """Of the smaller capacity."""
    figures: dict[str, FigureAgreement] = field(default_factory=dict)
    """By `Agreement` figure; `difference` is the judged one (the engine's drift taken out where known)."""
    agrees: bool | None = None
    error: str | None = None
    """Why vLLM's benchmark did not run."""
    achieved_rate: float | None = None


@dataclass
class MemoryPeaks(Serial):
    """Peak resident memory of this process and of the Locust processes it runs, sampled every
    `interval_s` (`loadtest.sweeps.capacity.MemoryWatch`)."""

    self_peak_mib: float = 0.0
    locust_peak_mib: float = 0.0
    """The most the Locust processes held together at one sample."""
    locust_process_peak_mib: float = 0.0
    locust_processes: int = 0
    samples: int = 0
    interval_s: float = 0.5


@dataclass
class Overload(Serial):
    """A variant at twice its capacity (`loadtest.sweeps.capacity.overload_summary`), or why not (`skipped`)."""

    skipped: str | None = None
    rate: float | None = None
    duration_s: float | None = None
    achieved_rate: float | None = None
    behind: bool | None = None
    sent: int | None = None
    outcomes: dict[str, int | None] | None = None
    accounted: bool | None = None
    """sent == served + refused + timed out + failed."""
    server_up_after: bool | None = None
    server_gone: str | None = None
    memory: MemoryPeaks | None = None
    status: str | None = None
    problems: list[str] | None = None


# ---------------------------------------------------------------------------------- the crossover
def _latency(level: LevelResult, pick: Callable[[ClientFigures], Distribution | None]) -> Distribution:
    """A latency (ms) its client measured (no values where it measured none)."""
    return (pick(level.client) if level.client else None) or NO_VALUES


def ttft_p95(level: LevelResult) -> float | None:
    return _latency(level, lambda c: c.ttft_ms).p95


def tpot_p50(level: LevelResult) -> float | None:
    return _latency(level, lambda c: c.per_token_latency_ms).p50


def tpot_p95(level: LevelResult) -> float | None:
    return _latency(level, lambda c: c.per_token_latency_ms).p95


def e2e_mean(level: LevelResult) -> float | None:
    return _latency(level, lambda c: c.e2e_ms).mean


def pairs_by_rate(levels: Sequence[CapacityLevel], spec: str, baseline: str = BASELINE) -> dict[float, list[Pair]]:
    """Per rate, in order, its pairs: each repeat both variants measured. The overload phase and
    failed runs are left out."""
    by_key: dict[tuple[float, int], dict[str, CapacityLevel]] = {}
    for lv in levels:
        if lv.phase != "overload" and lv.ok_client:
            by_key.setdefault((lv.rate, lv.repeat), {})[lv.variant] = lv
    out: dict[float, list[Pair]] = {}
    for (rate, _), pair in sorted(by_key.items()):
        if spec in pair and baseline in pair:
            out.setdefault(rate, []).append((pair[spec], pair[baseline]))
    return out


def speedups(pairs: Sequence[Pair], figure: Callable[[LevelResult], float | None]) -> list[float]:
    """The baseline's `figure` over speculation's, per pair where both have it (lower latency is better)."""
    return [theirs / mine for mine, theirs in ((figure(s), figure(b)) for s, b in pairs) if mine and theirs]


def paired_speedups(levels: Sequence[CapacityLevel], spec: str, baseline: str = BASELINE) -> list[RateSpeedup]:
    """Per rate: speculation against the baseline, means over its pairs (`pairs_by_rate`)."""
    out = []
    for rate, pairs in pairs_by_rate(levels, spec, baseline).items():
        tpot, e2e = speedups(pairs, tpot_p50), speedups(pairs, e2e_mean)
        out.append(RateSpeedup(rate=rate, pairs=max(len(tpot), len(e2e)), speedup=mean(tpot), e2e_speedup=mean(e2e)))
    return out


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def crossover(points: Sequence[tuple[float, float | None]]) -> Crossover:
    """Where the speedup ((rate, speedup) `points`) crosses 1.0 between measured rates, interpolated
    linearly in log(rate); the first fall below 1.0 is the crossover, else the first rise."""
    pts = [(r, s) for r, s in points if s is not None and r > 0]
    if not pts:
        return Crossover()
    crossings = []
    for (r1, s1), (r2, s2) in zip(pts, pts[1:]):
        if (s1 >= 1) != (s2 >= 1):
            t = (s1 - 1) / (s1 - s2)
            crossings.append(Crossing(rate=math.exp(math.log(r1) + t * (math.log(r2) - math.log(r1))),
                                      between=[r1, r2], direction="down" if s1 >= 1 else "up"))
    out = Crossover(range=[pts[0][0], pts[-1][0]], crossings=crossings,
                    speedups=[min(s for _, s in pts), max(s for _, s in pts)])
    if not crossings:
        out.kind = "pays throughout" if pts[0][1] >= 1 else "never pays"
        return out
    first_down = next((c for c in crossings if c.direction == "down"), None)
    chosen = first_down or crossings[0]
    out.kind = "stops paying" if chosen is first_down else "starts paying"
    out.rate, out.between = chosen.rate, chosen.between
    return out


# ---------------------------------------------------------------------------------- the first lines
def describe_targets(text: str) -> str:
    from loadtest.measurement import slo  # slo reads results, which declares its fields with this module's types

    parts = [t.describe() for t in slo.parse_targets(text)]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def rate_text(x: float | None) -> str:
    """A rate in requests/s for the reports, three significant figures; "-" when there is none."""
    return "-" if x is None else f"{x:.3g}"


def _interval(c: VariantCapacity) -> str:
    lo, hi = c.interval
    if lo is None:
        return f"none passing down to {rate_text(c.lowest_tried)}"
    return f"{rate_text(lo)}-{rate_text(hi)}" if hi is not None else f"at least {rate_text(lo)} (none failed)"


def variant_content_warnings(result: CapacityResults) -> list[str]:
    """Per variant, what the content check says of the outputs behind its capacity, over every level
    it served (none: they are text). Looping output makes speculation look fast, so it comes first."""
    lines = []
    for variant in result.variants:
        summary = content.merge([lv.client.content for lv in result.levels if lv.variant == variant and lv.client])
        text = content.warning(summary)
        if text:
            whose = "the baseline's" if variant == BASELINE else "speculation's"
            lines.append(f"{variant}: {content.label(summary)}: {whose} output {text}")
    return lines


def contradictions(result: CapacityResults, variant: str) -> list[CapacityLevel]:
    """Runs of `variant` at or below its capacity that were measured (served, not broken off) and
    missed the targets: a later run (the second opinion's, a scan's) that the search's capacity
    does not survive."""
    c = result.capacity.get(variant)
    if c is None or c.capacity is None:
        return []
    return [lv for lv in result.levels if lv.variant == variant and lv.phase != "overload"
            and lv.rate <= c.capacity and not lv.meets_targets and lv.status not in ("failed", "skipped")
            and lv.ok_client]


def revised(result: CapacityResults, variant: str) -> VariantCapacity | None:
    """The variant's capacity as every run measured allows (None: the search's stands): the highest
    rate below the lowest contradicting run's at which every run met the targets, with `was` (the
    search's capacity) and `missed` (the contradicting runs)."""
    missed = contradictions(result, variant)
    if not missed:
        return None
    c = result.capacity[variant]
    low = min(lv.rate for lv in missed)
    passing: dict[float, bool] = {}
    for lv in result.levels:
        if lv.variant == variant and lv.phase != "overload" and lv.rate < low:
            passing[lv.rate] = passing.get(lv.rate, True) and bool(lv.meets_targets)
    ok = [r for r, met in passing.items() if met]
    new = max(ok) if ok else None
    return replace(c, capacity=new, interval=[new, low], status="revised", was=c.capacity,
                   lowest_tried=min(passing, default=low),
                   missed=[MissedRun(rate=lv.rate, phase=lv.phase, why=lv.why) for lv in missed])


def measured_variants(result: CapacityResults) -> set[str]:
    """Variants with at least one run that served requests."""
    return {lv.variant for lv in result.levels if lv.ok_client}


def effective_capacity(result: CapacityResults) -> dict[str, VariantCapacity]:
    """Each measured variant's capacity, revised where a later run contradicts it (`revised`)."""
    seen = measured_variants(result)
    return {v: revised(result, v) or c for v, c in result.capacity.items() if v in seen}


def revision_text(variant: str, c: VariantCapacity) -> str:
    missed = ", ".join(f"{m.rate:g} req/s ({m.phase})" for m in c.missed or [])
    return (f"{'the baseline' if variant == BASELINE else 'speculation'}'s capacity revised from {rate_text(c.was)} to "
            f"{capacity_text(c)} req/s: a run at {missed} missed the targets")


def headline(result: CapacityResults) -> list[str]:
    """The report's first lines: what the run is where it is incomplete, output that is no text
    (`content_warnings`), capacity with and without speculation (revised where a later run at a
    lower rate missed the targets), then the crossover. Only measured variants are compared."""
    spec = result.spec_variant
    caps = effective_capacity(result)
    base = caps.get(BASELINE)
    mine = caps.get(spec) if spec else None
    targets = describe_targets(result.slo)
    lines = variant_content_warnings(result)
    unmeasured = [v for v in result.variants if v and v not in caps]
    if result.status == "interrupted":
        runs = len([lv for lv in result.levels if lv.ok_client])
        lines.append(f"Interrupted after {runs} run{'s' if runs != 1 else ''}"
                     + (f"; not measured: {', '.join(unmeasured)}: no comparison" if unmeasured else ""))
    if mine is None or base is None:
        only = mine or base
        who = "speculation" if only is mine else "the baseline"
        missing = "the baseline" if only is mine else "speculation"
        lines.append(f"At {targets}, " + (f"{who}'s capacity is {capacity_text(only)} req/s; {missing} was not "
                                           f"measured: no comparison" if only else "nothing was measured"))
    else:
        lines.append(f"At {targets}, {_capacity_change(base, mine)}")
    lines += [revision_text(v, c) for v, c in caps.items() if c.status == "revised"]
    lines.append(crossover_text(result.crossover, result.scan))
    return lines


def capacity_text(c: VariantCapacity) -> str:
    lo, hi = c.interval
    if lo is None:
        return f"none (no rate met them, down to {rate_text(c.lowest_tried)} req/s)"
    return f"at least {rate_text(lo)}" if hi is None else rate_text(lo)


def _capacity_change(base: VariantCapacity, mine: VariantCapacity) -> str:
    intervals = (f". Intervals (highest rate meeting them - lowest missing them): baseline {_interval(base)}, "
                 f"speculation {_interval(mine)} req/s")
    a, b = base.capacity, mine.capacity
    if a is None and b is None:
        return (f"neither variant meets them at any rate measured (down to "
                f"{rate_text(min(x for x in (base.lowest_tried, mine.lowest_tried) if x))} req/s)")
    if a is None:
        return f"only speculation meets them: up to {capacity_text(mine)} req/s; the baseline at no rate measured" \
               + intervals
    if b is None:
        return f"speculation meets them at no rate measured; the baseline up to {capacity_text(base)} req/s" + intervals
    # Within the intervals the change lies between b / a_hi - 1 and b_hi / a - 1.
    a_hi, b_hi = base.interval[1], mine.interval[1]
    low = b / a_hi - 1 if a_hi else None
    high = b_hi / a - 1 if b_hi else None
    spread = (f", so {_pct(low)} to {_pct(high)}" if low is not None and high is not None else
              f", so at least {_pct(low)}" if low is not None else f", so at most {_pct(high)}" if high is not None
              else "")
    if b == a:
        text = f"speculation leaves capacity unchanged: {capacity_text(base)} req/s ({_pct(0.0)})"
    else:
        text = (f"speculation {'raises' if b > a else 'lowers'} capacity from {capacity_text(base)} to "
                f"{capacity_text(mine)} req/s ({_pct((b - a) / a)})")
    return text + intervals + spread


def _pct(x: float) -> str:
    return f"{100 * x:+.0f}%"


def crossover_text(cross: Crossover | None, scan: Scan | None = None) -> str:
    if cross is None or cross.kind == "no pairs" or not cross.range or not cross.speedups:
        return "no rate was measured on both variants: no speedup to show"
    span = f"{rate_text(cross.range[0])}-{rate_text(cross.range[1])} req/s"
    lo, hi = cross.speedups
    seen = f"per-token latency p50 {lo:.2f}x-{hi:.2f}x the baseline's speed"
    between = cross.between or [None, None]
    more = (f"; it crosses 1.0 {len(cross.crossings)} times in all: near 1.0 the speedup is within the noise"
            if len(cross.crossings) > 1 else "")
    if cross.kind == "stops paying":
        return (f"speculation stops paying above {rate_text(cross.rate)} req/s (its per-token speedup crosses 1.0 "
                f"between {rate_text(between[0])} and {rate_text(between[1])} req/s; {seen} over {span}{more})")
    if cross.kind == "starts paying":
        return f"speculation pays only above {rate_text(cross.rate)} req/s (slower below it; {seen} over {span}{more})"
    if cross.kind == "pays throughout":
        why = ("no crossover: from " + rate_text(scan.saturated_at) + " req/s neither variant's throughput grows "
               "(both saturated: a higher rate only lengthens the queue)" if scan and scan.saturated_at
               else "no crossover in the range measured")
        return f"speculation pays at every rate measured ({span}): {seen}; {why}"
    return f"speculation does not pay at any rate measured ({span}): {seen}; no crossover in the range measured"
