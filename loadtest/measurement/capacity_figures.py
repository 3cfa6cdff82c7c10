"""What a capacity search's levels say, read off `capacity.json`: speculation and the baseline paired
at each rate (the same arrivals), the speedup there and where it crosses 1.0, capacities a later run
contradicts (`revised`), and the report's first lines (`headline`). The search that measures the
levels is `loadtest.sweeps.capacity`; the pages, `loadtest.reports.capacity_report`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from loadtest.measurement import content
from loadtest.measurement import slo
from loadtest.measurement.results import CapacityLevel, CapacityResults, LevelResult

BASELINE = "baseline"
"""The variant without speculation: every speedup is over its run at the same rate and repeat."""


# ---------------------------------------------------------------------------------- the crossover
def tpot_p50(level: LevelResult) -> float | None:
    """A level's per-token latency p50 (ms), as its client measured it."""
    return ((level.client or {}).get("per_token_latency_ms") or {}).get("p50")


def e2e_mean(level: LevelResult) -> float | None:
    """A level's mean end-to-end latency (ms), as its client measured it."""
    return ((level.client or {}).get("e2e_ms") or {}).get("mean")


SPEEDUPS = (("speedup", tpot_p50), ("e2e_speedup", e2e_mean))
"""The speedups of a pair: the baseline's figure over speculation's (lower latency is better)."""


def level_pairs(levels: Sequence[CapacityLevel], spec: str,
                baseline: str = BASELINE) -> list[tuple[float, CapacityLevel, CapacityLevel]]:
    """(rate, speculation's level, the baseline's) for each (rate, repeat) both measured: the same
    arrival sequence on both servers. The overload phase and failed runs are left out."""
    by_key: dict[tuple[float, int], dict[str, CapacityLevel]] = {}
    for lv in levels:
        if lv.phase == "overload" or not lv.ok_client:
            continue
        by_key.setdefault((lv.rate, lv.repeat), {})[lv.variant] = lv
    return [(rate, pair[spec], pair[baseline]) for (rate, _), pair in sorted(by_key.items())
            if spec in pair and baseline in pair]


def paired_speedups(levels: Sequence[CapacityLevel], spec: str, baseline: str = BASELINE) -> list[dict[str, Any]]:
    """Per rate: speculation against the baseline over its pairs (`level_pairs`). `speedup` =
    baseline per-token latency p50 / speculation's, `e2e_speedup` = baseline mean end-to-end latency
    / speculation's; means over the rate's pairs."""
    per_rate: dict[float, dict[str, list[float]]] = {}
    for rate, s, b in level_pairs(levels, spec, baseline):
        entry = per_rate.setdefault(rate, {"speedup": [], "e2e_speedup": []})
        for key, fig in SPEEDUPS:
            mine, theirs = fig(s), fig(b)
            if mine and theirs:
                entry[key].append(theirs / mine)
    return [{"rate": rate, "pairs": max(len(v["speedup"]), len(v["e2e_speedup"])),
             **{k: (sum(xs) / len(xs) if xs else None) for k, xs in v.items()}}
            for rate, v in sorted(per_rate.items())]


def crossover(points: Sequence[dict[str, Any]], key: str = "speedup") -> dict[str, Any]:
    """Where the speedup crosses 1.0 between measured rates, interpolated linearly in log(rate):
    `kind` "stops paying" (above it speculation is slower), "starts paying", "pays throughout",
    "never pays" or "no pairs"; `rate` the first crossing's, `crossings` all of them."""
    pts = [(p["rate"], p[key]) for p in points if p.get(key) is not None and p["rate"] > 0]
    if not pts:
        return {"kind": "no pairs", "rate": None, "crossings": [], "range": None}
    crossings = []
    for (r1, s1), (r2, s2) in zip(pts, pts[1:]):
        if (s1 >= 1) != (s2 >= 1):
            t = (s1 - 1) / (s1 - s2)
            crossings.append({"rate": math.exp(math.log(r1) + t * (math.log(r2) - math.log(r1))),
                              "between": [r1, r2], "direction": "down" if s1 >= 1 else "up"})
    out: dict[str, Any] = {"range": [pts[0][0], pts[-1][0]], "crossings": crossings,
                           "speedups": [min(s for _, s in pts), max(s for _, s in pts)]}
    if not crossings:
        return {**out, "kind": "pays throughout" if pts[0][1] >= 1 else "never pays", "rate": None}
    first_down = next((c for c in crossings if c["direction"] == "down"), None)
    chosen = first_down or crossings[0]
    return {**out, "kind": "stops paying" if chosen is first_down else "starts paying", "rate": chosen["rate"],
            "between": chosen["between"]}


# ---------------------------------------------------------------------------------- the first lines
def describe_targets(text: str) -> str:
    parts = [t.describe() for t in slo.parse_targets(text)]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def rate_text(x: float | None) -> str:
    """A rate in requests/s for the reports, three significant figures; "-" when there is none."""
    return "-" if x is None else f"{x:.3g}"


def _interval(c: dict[str, Any]) -> str:
    lo, hi = c["interval"]
    if lo is None:
        return f"none passing down to {rate_text(c.get('lowest_tried'))}"
    return f"{rate_text(lo)}-{rate_text(hi)}" if hi is not None else f"at least {rate_text(lo)} (none failed)"


def variant_content_warnings(result: CapacityResults) -> list[str]:
    """Per variant, what the content check says of the outputs behind its capacity, over every level
    it served (none: they are text). Looping output makes speculation look fast, so it comes first."""
    lines = []
    for variant in result.variants:
        summary = content.merge([(lv.client or {}).get("content") for lv in result.levels if lv.variant == variant])
        text = content.warning(summary)
        if text:
            whose = "the baseline's" if variant == BASELINE else "speculation's"
            lines.append(f"{variant}: {content.label(summary)}: {whose} output {text}")
    return lines


def contradictions(result: CapacityResults, variant: str) -> list[CapacityLevel]:
    """Runs of `variant` at or below its capacity that were measured (served, not broken off) and
    missed the targets: a later run (the second opinion's, a scan's) that the search's capacity
    does not survive."""
    c = result.capacity.get(variant) or {}
    cap = c.get("capacity")
    if cap is None:
        return []
    return [lv for lv in result.levels if lv.variant == variant and lv.phase != "overload"
            and lv.rate <= cap and not lv.meets_targets and lv.status not in ("failed", "skipped") and lv.ok_client]


def revised(result: CapacityResults, variant: str) -> dict[str, Any] | None:
    """The variant's capacity as every run measured allows (None: the search's stands): the highest
    rate below the lowest contradicting run's at which every run met the targets, with `was` (the
    search's capacity) and `missed` (the contradicting runs: rate, phase, why)."""
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
    return {**c, "capacity": new, "interval": [new, low], "status": "revised", "was": c["capacity"],
            "lowest_tried": min(passing, default=low),
            "missed": [{"rate": lv.rate, "phase": lv.phase, "why": lv.why} for lv in missed]}


def measured_variants(result: CapacityResults) -> set[str]:
    """Variants with at least one run that served requests."""
    return {lv.variant for lv in result.levels if lv.ok_client}


def effective_capacity(result: CapacityResults) -> dict[str, dict[str, Any]]:
    """Each measured variant's capacity, revised where a later run contradicts it (`revised`)."""
    seen = measured_variants(result)
    return {v: revised(result, v) or c for v, c in result.capacity.items() if v in seen}


def revision_text(variant: str, c: dict[str, Any]) -> str:
    missed = ", ".join(f"{m['rate']:g} req/s ({m['phase']})" for m in c["missed"])
    return (f"{'the baseline' if variant == BASELINE else 'speculation'}'s capacity revised from {rate_text(c['was'])} to "
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
    planned = [v for v in result.variants if v]
    unmeasured = [v for v in planned if v not in caps]
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
    lines += [revision_text(v, c) for v, c in caps.items() if c.get("status") == "revised"]
    cross = result.crossover or {}
    lines.append(crossover_text(cross, result.scan))
    return lines


def capacity_text(c: dict[str, Any]) -> str:
    lo, hi = c["interval"]
    if lo is None:
        return f"none (no rate met them, down to {rate_text(c.get('lowest_tried'))} req/s)"
    return f"at least {rate_text(lo)}" if hi is None else rate_text(lo)


def _capacity_change(base: dict[str, Any], mine: dict[str, Any]) -> str:
    intervals = (f". Intervals (highest rate meeting them - lowest missing them): baseline {_interval(base)}, "
                 f"speculation {_interval(mine)} req/s")
    a, b = base["capacity"], mine["capacity"]
    if a is None and b is None:
        return (f"neither variant meets them at any rate measured (down to "
                f"{rate_text(min(x for x in (base.get('lowest_tried'), mine.get('lowest_tried')) if x))} req/s)")
    if a is None:
        return f"only speculation meets them: up to {capacity_text(mine)} req/s; the baseline at no rate measured" \
               + intervals
    if b is None:
        return f"speculation meets them at no rate measured; the baseline up to {capacity_text(base)} req/s" + intervals
    # Within the intervals the change lies between b / a_hi - 1 and b_hi / a - 1.
    low = b / base["interval"][1] - 1 if base["interval"][1] else None
    high = mine["interval"][1] / a - 1 if mine["interval"][1] else None
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


def crossover_text(cross: dict[str, Any], scan: dict[str, Any] | None = None) -> str:
    kind, rng = cross.get("kind"), cross.get("range")
    if kind in (None, "no pairs"):
        return "no rate was measured on both variants: no speedup to show"
    span = f"{rate_text(rng[0])}-{rate_text(rng[1])} req/s"
    lo, hi = cross["speedups"]
    seen = f"per-token latency p50 {lo:.2f}x-{hi:.2f}x the baseline's speed"
    between = cross.get("between") or [None, None]
    more = (f"; it crosses 1.0 {len(cross['crossings'])} times in all: near 1.0 the speedup is within the noise"
            if len(cross.get("crossings") or []) > 1 else "")
    if kind == "stops paying":
        return (f"speculation stops paying above {rate_text(cross['rate'])} req/s (its per-token speedup crosses 1.0 "
                f"between {rate_text(between[0])} and {rate_text(between[1])} req/s; {seen} over {span}{more})")
    if kind == "starts paying":
        return f"speculation pays only above {rate_text(cross['rate'])} req/s (slower below it; {seen} over {span}{more})"
    if kind == "pays throughout":
        why = ("no crossover: from " + rate_text(scan["saturated_at"]) + " req/s neither variant's throughput grows "
               "(both saturated: a higher rate only lengthens the queue)" if scan and scan.get("saturated_at")
               else "no crossover in the range measured")
        return f"speculation pays at every rate measured ({span}): {seen}; {why}"
    return f"speculation does not pay at any rate measured ({span}): {seen}; no crossover in the range measured"
