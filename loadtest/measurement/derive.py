"""Speedups, verdicts and service-target lines derived from a sweep's results: what every report
(the sweep's, the comparison's, tuning's and distillation's) reads off the levels measured. Numbers
and short facts only; how they are worded on a page is the reports' (loadtest.reports).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator

from loadtest.measurement import content
from loadtest.measurement import slo
from loadtest.measurement import stats
from loadtest.measurement.derived import Comparison, CategoryRow, CostRow, RateBench, RateRow, SpeedupSummary
from loadtest.measurement.figures import (BenchFigures, CategoryFigures, ClientFigures, Distribution, Interval,
                                          OpenLoopFigures, ServerFigures, p50)
from loadtest.measurement.results import Closed, LevelResult, Open, SweepResults, VariantResult


def levels(results: SweepResults) -> Iterator[tuple[VariantResult, LevelResult]]:
    """(variant, level) pairs of closed-loop levels that have client numbers."""
    return ((v, lv) for v, lv in results.levels(Closed) if lv.ok_client)


def rate_levels(results: SweepResults) -> Iterator[tuple[VariantResult, LevelResult]]:
    """(variant, level) pairs of open-loop levels, measured or not."""
    return iter(results.levels(Open))


def _ratio(base: float | None, mine: float | None) -> float | None:
    return base / mine if base and mine else None



def derive_rates(results: SweepResults) -> list[RateRow]:
    """One row per open-loop level: asked and achieved rate, in-flight, outcomes, latencies,
    throughput, acceptance, vLLM's benchmark beside; for speculation, what a user sees against
    the baseline's run at the same rate and repeat (same arrivals): the baseline's TPOT p50 over
    this one's, and its mean end-to-end latency over this one's (above 1: speculation faster)."""
    base = {(lv.rate, lv.repeat): lv for v, lv in rate_levels(results) if v.name == "baseline"}
    rows = []
    for variant, level in rate_levels(results):
        c, ol, bench = level.client or ClientFigures(), level.open_loop or OpenLoopFigures(), level.vllm_bench
        row = RateRow(variant=variant.name, rate=level.rate or 0.0, repeat=level.repeat, status=level.status,
                      achieved_rate=ol.achieved_rate, behind=ol.behind if level.open_loop else None,
                      in_flight_max=ol.in_flight_max if level.open_loop else None, in_flight_mean=ol.in_flight_mean,
                      outcomes=level.outcomes or ol.outcomes or {}, ttft_ms=c.ttft_ms or Distribution(),
                      tpot_ms=c.per_token_latency_ms or Distribution(), e2e_ms=c.e2e_ms or Distribution(),
                      output_tokens_per_s=c.output_tokens_per_s,
                      acceptance=level.server.acceptance_rate if level.server else None)
        if bench:
            row.bench = RateBench(output_tokens_per_s=bench.output_tokens_per_s, ttft_p50_ms=p50(bench.ttft_ms),
                                  tpot_p50_ms=p50(bench.per_token_latency_ms), error=bench.error,
                                  agrees=level.vllm_bench_agreement.agrees if level.vllm_bench_agreement else None)
        base_level = base.get((level.rate, level.repeat))
        b = base_level.client if base_level else None
        if variant.name != "baseline" and b:
            row.tpot_p50_speedup = _ratio(p50(b.per_token_latency_ms), row.tpot_ms.p50)
            row.e2e_mean_speedup = _ratio(b.e2e_ms.mean if b.e2e_ms else None, row.e2e_ms.mean)
        rows.append(row)
    return sorted(rows, key=lambda r: (r.rate, r.repeat, r.variant == "baseline", r.variant))


def level_at(results: SweepResults, variant_name: str, concurrency: int, repeat: int = 1) -> LevelResult | None:
    for variant, level in levels(results):
        if (variant.name, level.concurrency, level.repeat) == (variant_name, concurrency, repeat):
            return level
    return None


def derive(results: SweepResults) -> list[Comparison]:
    """For each speculative variant, concurrency and repeat: speedup over the baseline's run of the
    same repeat (measured beside it), and the cost model."""
    rows = []
    for variant, level in levels(results):
        if variant.name == "baseline" or not variant.k:
            continue
        c, repeat = level.concurrency or 0, level.repeat
        client, server = level.client or ClientFigures(), level.server or ServerFigures()
        base = level_at(results, "baseline", c, repeat)
        base_client = (base.client if base else None) or ClientFigures()
        # Per-token costs from the engine's own clock when the server reports them (robust to a
        # client or API server that is short of CPU and delivers chunks late), else the client's.
        tpot, source = _tpot_s(level), "server"
        base_tpot = _tpot_s(base) if base else None
        if tpot is None or base_tpot is None:
            tpot, source = _tpot_s(level, client_side=True), "client"
            base_tpot = _tpot_s(base, client_side=True) if base else None
        row = stats.speculation_analysis(server.acceptance_rate, server.mean_accepted_length, variant.k, tpot,
                                         base_tpot, Comparison, variant=variant.name, concurrency=c, repeat=repeat,
                                         per_token_source=source)
        if base and level.sequence and base.sequence:
            row.went_first = level.sequence < base.sequence
        row.speedup = _ratio(client.output_tokens_per_s, base_client.output_tokens_per_s)
        bench, base_bench = level.vllm_bench or BenchFigures(), (base.vllm_bench if base else None) or BenchFigures()
        row.vllm_bench_speedup = _ratio(bench.output_tokens_per_s, base_bench.output_tokens_per_s)
        # The content check (loadtest.measurement.content): whether the outputs behind these speeds are text.
        row.content, row.baseline_content, row.vllm_bench_content = client.content, base_client.content, bench.content
        row.valid_speedup = _ratio(*(x.tokens_per_s_valid if x else None for x in (row.content, row.baseline_content)))
        rows.append(row)
    return rows


SPEEDUPS = {"speedup": "client output tokens/s (Locust)", "vllm_bench_speedup": "vLLM's benchmark output tokens/s",
            "measured_speedup": "per token on the engine's clock"}
VALID_SPEEDUP = "per-request tokens/s over the content-valid requests"


def summarize_speedups(results: SweepResults) -> list[SpeedupSummary]:
    """Per speculative variant and concurrency: each speedup's mean over the repeats and its 95%
    interval (Student's t; none from one run), and a verdict read from all of them together."""
    groups: dict[tuple[str, int], list[Comparison]] = {}
    for row in derive(results):
        groups.setdefault((row.variant, row.concurrency), []).append(row)
    out = []
    for (variant, c), rows in groups.items():
        def interval(values: Iterable[float | None]) -> Interval:
            return stats.mean_interval([v for v in values if v is not None])

        entry = SpeedupSummary(
            variant=variant, concurrency=c, runs=len(rows), speedup=interval(r.speedup for r in rows),
            vllm_bench_speedup=interval(r.vllm_bench_speedup for r in rows),
            measured_speedup=interval(r.measured_speedup for r in rows),
            acceptance_rate=interval(r.acceptance_rate for r in rows),
            mean_accepted_length=interval(r.mean_accepted_length for r in rows),
            valid_speedup=interval(r.valid_speedup for r in rows),
            content=content.merge([r.content for r in rows]),
            baseline_content=content.merge([r.baseline_content for r in rows]),
            vllm_bench_content=content.merge([r.vllm_bench_content for r in rows]))
        by_order = {o: [r.speedup for r in rows if r.went_first is first and r.speedup]
                    for o, first in (("first", True), ("second", False))}
        if all(by_order.values()):
            # Runs where the variant went before its baseline run against those where it went after:
            # a gap between the two is drift or an order effect, which the alternating order cancels.
            entry.speedup_by_order = {o: sum(v) / len(v) for o, v in by_order.items()}  # type: ignore[arg-type]
        entry.verdict = verdict(entry)
        out.append(entry)
    return out


def by_category(results: SweepResults) -> list[CategoryRow]:
    """Per concurrency, prompt category and variant (closed loop, a categorised workload): requests,
    acceptance, mean per-request tokens/s, and the speedup over the baseline's same category in the
    same repeat (its mean over the repeats, with a 95% interval from two or more)."""
    groups: dict[tuple[int, str, str], list[tuple[CategoryFigures, CategoryFigures | None]]] = {}
    for variant, level in levels(results):
        c = level.concurrency or 0
        base = level_at(results, "baseline", c, level.repeat) if variant.name != "baseline" else None
        base_categories = (base.client.by_category if base and base.client else None) or {}
        for category, figs in ((level.client.by_category if level.client else None) or {}).items():
            groups.setdefault((c, category, variant.name), []).append((figs, base_categories.get(category)))
    rows = []
    for (c, category, name), runs in groups.items():
        drafted = [f.acceptance for f, _ in runs if f.acceptance is not None]
        speeds = [f.tokens_per_s for f, _ in runs if f.tokens_per_s]
        ratios = [f.tokens_per_s / b.tokens_per_s for f, b in runs if b and f.tokens_per_s and b.tokens_per_s]
        rows.append(CategoryRow(concurrency=c, category=category, variant=name,
                                requests=sum(f.requests for f, _ in runs), not_text=sum(f.not_text for f, _ in runs),
                                acceptance=statistics.fmean(drafted) if drafted else None,
                                tokens_per_s=statistics.fmean(speeds) if speeds else None,
                                speedup=stats.mean_interval(ratios) if ratios else None))
    order = {name: i for i, name in enumerate(v.name for v in results.variants)}
    firsts = {c: i for i, c in enumerate(dict.fromkeys(r.category for r in rows))}
    return sorted(rows, key=lambda r: (r.concurrency, firsts[r.category], order.get(r.variant, 99)))


def costs(results: SweepResults) -> list[CostRow]:
    """Where a variant's config names a price per GPU-hour: its GPU-hours in this sweep (starts and
    measured runs) and, per batch size, its cost per million output tokens at the throughput the
    client measured (mean over the repeats)."""
    rows = []
    for variant in results.variants:
        price, gpus = variant.price_per_gpu_hour, variant.gpus
        if not price or not gpus:
            continue
        seconds = sum(variant.startup_s) + sum((lv.client.duration_s if lv.client else None) or 0
                                               for lv in variant.levels)
        by_batch: dict[int, list[float]] = {}
        for v, level in levels(results):
            tps = level.client.output_tokens_per_s if level.client else None
            if v is variant and tps:
                by_batch.setdefault(level.concurrency or 0, []).append(tps)
        per_million = {c: price * gpus / 3600 / statistics.fmean(v) * 1e6 for c, v in sorted(by_batch.items())}
        rows.append(CostRow(variant=variant.name, gpus=gpus, price_per_gpu_hour=price,
                            gpu_hours=gpus * seconds / 3600, cost_per_million_tokens=per_million))
    return rows


def verdict_rule(m: Interval) -> str:
    """Pays, does not pay or breaks even, from one speedup's interval (one run: its mean)."""
    if m.low is not None and m.low > 1:
        return "pays"
    if m.high is not None and m.high < 1:
        return "does not pay"
    if m.low is None:
        return "pays" if (m.mean or 0) > 1 else "does not pay"
    return "breaks even"


def verdict(entry: SpeedupSummary) -> str:
    """Pays / does not pay / even, from the client's interval, checked against the engine and vLLM's benchmark."""
    client = entry.speedup
    if client.mean is None:
        return "no baseline to compare with"
    text = verdict_rule(client)
    if text == "breaks even":
        return "breaks even (the 95% interval spans 1.0x)"
    others = [(SPEEDUPS["vllm_bench_speedup"], entry.vllm_bench_speedup.mean),
              (SPEEDUPS["measured_speedup"], entry.measured_speedup.mean)]
    against = [name for name, mean in others if mean is not None and (mean > 1) != (client.mean > 1)]
    if against:
        text += f"; but {' and '.join(against)} say the opposite: read the report's trust section before using it"
    return text


def content_warnings(entry: SpeedupSummary) -> list[str]:
    """What the content check says about the outputs behind one verdict (none: they are text). The
    baseline's line names the baseline, so that a sweep of several drafters says it once (callers
    keep each line once)."""
    out = []
    for summary, whose in ((entry.content, "speculation's"), (entry.baseline_content, "the baseline's"),
                           (entry.vllm_bench_content, "vLLM's benchmark's")):
        text = content.warning(summary)
        if text:
            name = "baseline" if summary is entry.baseline_content else entry.variant
            out.append(f"batch {entry.concurrency}, {name}: {content.label(summary)}: {whose} output {text}")
    return out


def slo_lines(results: SweepResults) -> list[str]:
    """Per variant: the highest concurrency at which every run met every service target."""
    targets = results.settings.get("slo")
    if not targets:
        return []
    described = ", ".join(t.describe() for t in slo.parse_targets(targets))
    lines = []
    for variant in results.variants:
        at_rates = [lv for v, lv in results.levels(Open) if v is variant and lv.slo]
        if at_rates:
            met = [lv.rate for lv in at_rates if all(x.slo.met for x in at_rates if x.rate == lv.rate and x.slo)]
            lines.append(f"service targets ({described}), {variant.name}: "
                         + (f"met up to {max(met):g} requests/s (open loop)" if met else "not met at any measured rate"))
        measured = [lv for v, lv in results.levels(Closed) if v is variant and lv.slo]
        if not measured:
            continue
        best = slo.highest_concurrency(measured)
        at_best = [lv.slo.goodput_tokens_per_s for lv in measured
                   if lv.slo and lv.concurrency == best and lv.slo.goodput_tokens_per_s is not None]
        lines.append(f"service targets ({described}), {variant.name}: "
                     + (f"met up to batch {best}, goodput {sum(at_best) / len(at_best):.0f} tok/s there"
                        if best is not None and at_best else "not met at any measured batch size"))
    return lines


def _tpot_s(level: LevelResult, client_side: bool = False) -> float | None:
    """Mean per-token latency of a level in seconds: the server's histogram, or the client's records."""
    if client_side:
        ms = level.client.per_token_latency_ms.mean if level.client and level.client.per_token_latency_ms else None
        return ms / 1000 if ms else None
    return (level.server.histogram("per_token_latency_s").mean if level.server else None) or None
