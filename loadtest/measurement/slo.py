"""Service targets: does a run meet the deployment's latency goals, and what throughput is left.

A target names a per-request latency, a percentile and a bound, e.g. `ttft_p95=500ms`: 95%
of requests see their first token within 500 ms. Per run the sweep reports, for each target,
the run's percentile (by nearest rank: the one its verdict rests on), the share of requests
within the bound, and the goodput: output tokens/s counted only from requests that met every
bound (vLLM's benchmark defines its `--goodput` the same way). A concurrency meets the targets when every run at it does; the
highest such concurrency is what the deployment can take.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loadtest.measurement.figures import SloFigures, TargetFigures
from loadtest.measurement.records import RequestRecord

if TYPE_CHECKING:
    from loadtest.measurement.results import LevelResult

METRICS = {
    "ttft": "time to first token",
    "tpot": "per-token latency after the first token",
    "e2e": "end-to-end request latency",
}
_TARGET = re.compile(r"^(?P<metric>[a-z0-9]+)_p(?P<pct>\d{1,2}(?:\.\d+)?)=(?P<value>[0-9.]+)\s*(?P<unit>ms|s)$")


@dataclass(frozen=True)
class Target:
    metric: str
    """ttft, tpot or e2e."""
    percentile: float
    bound_s: float

    @property
    def name(self) -> str:
        return f"{self.metric}_p{self.percentile:g}"

    def describe(self) -> str:
        return f"{self.name} <= {1000 * self.bound_s:g} ms"

    def value_s(self, record: RequestRecord) -> float | None:
        return {"ttft": record.ttft_s, "tpot": record.per_token_latency_s, "e2e": record.e2e_s}[self.metric]


def parse_targets(text: str) -> list[Target]:
    """`ttft_p95=500ms,tpot_p95=50ms` -> targets; ValueError with the accepted form otherwise."""
    targets: list[Target] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        match = _TARGET.match(part.lower())
        if not match or match["metric"] not in METRICS:
            raise ValueError(f"service target '{part}' not understood: write METRIC_pPCT=VALUE with METRIC one of "
                             f"{', '.join(METRICS)} and a unit, e.g. ttft_p95=500ms,tpot_p95=50ms")
        pct, value = float(match["pct"]), float(match["value"])
        if not 0 < pct < 100 or value <= 0:
            raise ValueError(f"service target '{part}': the percentile must be in (0, 100) and the bound positive")
        target = Target(match["metric"], pct, value / 1000 if match["unit"] == "ms" else value)
        if any(t.name == target.name for t in targets):
            raise ValueError(f"service target {target.name} given twice")
        targets.append(target)
    if not targets:
        raise ValueError("no service target given; e.g. --slo ttft_p95=500ms,tpot_p95=50ms")
    return targets


def rank_percentile(values: Sequence[float | None], p: float) -> float | None:
    """The p-th percentile by nearest rank: the smallest value that at least p% of `values` do not
    exceed, a missing value (a failed request) counting above every bound; None when it falls on
    one. A target's `met` (that share within the bound) holds exactly when this value is within
    it. An interpolated percentile can sit below the bound while fewer than p% are: with 56
    requests, three at 55 ms and the rest near 30, numpy's p95 is about 40 ms, yet 94.6% are within 50."""
    if not values:
        return None
    ordered = sorted(values, key=lambda v: (v is None, v or 0.0))
    rank = max(math.ceil(p / 100 * len(ordered) - 1e-9), 1)
    return ordered[rank - 1]


def evaluate(records: Sequence[RequestRecord], targets: Sequence[Target], duration_s: float) -> SloFigures:
    """One run against the targets: per target its percentile and the share of requests within
    the bound; goodput from the requests within every bound. Failed requests meet no target."""
    out = SloFigures(requests=len(records))
    within_all = [r.ok for r in records]
    for t in targets:
        values = [t.value_s(r) for r in records]
        within = [r.ok and v is not None and v <= t.bound_s for r, v in zip(records, values)]
        within_all = [a and b for a, b in zip(within_all, within)]
        level_value = rank_percentile([v if r.ok else None for r, v in zip(records, values)], t.percentile)
        out.targets[t.name] = TargetFigures(
            bound_ms=1000 * t.bound_s,
            # The percentile the verdict rests on (None: it falls on a failed request), so that the
            # value shown and `met` cannot disagree; the interpolated one is in the run's latencies.
            value_ms=1000 * level_value if level_value is not None else None,
            share_within=sum(within) / len(records) if records else None,
            # The target is a percentile: met when that share of all requests (failures count
            # against it) is within the bound.
            met=bool(records) and sum(within) / len(records) >= t.percentile / 100)
    good_tokens = sum(r.output_tokens or 0 for r, good in zip(records, within_all) if good)
    out.goodput_tokens_per_s = good_tokens / duration_s if duration_s > 0 else None
    out.share_within_all = sum(within_all) / len(records) if records else None
    out.met = bool(records) and all(v.met for v in out.targets.values())
    return out


def highest_concurrency(levels: Sequence[LevelResult]) -> int | None:
    """The highest concurrency at which every run met every target, among levels that carry an
    `slo` result; None when none did."""
    by_c: dict[int, list[bool]] = {}
    for level in levels:
        if level.slo is not None:
            by_c.setdefault(level.concurrency or 0, []).append(level.slo.met)
    meeting = [c for c, runs in by_c.items() if runs and all(runs)]
    return max(meeting) if meeting else None
