"""Speedups, verdicts and service-target lines derived from a sweep's results: what every report
(the sweep's, the comparison's, tuning's and distillation's) reads off the levels measured. Numbers
and short facts only; how they are worded on a page is the reports' (loadtest.reports).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any

from loadtest.measurement import content
from loadtest.measurement import slo
from loadtest.measurement import stats
from loadtest.measurement.results import LevelResult, SweepResults, VariantResult


def levels(results: SweepResults) -> Iterator[tuple[VariantResult, LevelResult]]:
    """(variant, level) pairs of closed-loop levels that have client numbers (open-loop levels:
    `rate_levels`)."""
    for variant, level in results.levels():
        if level.ok_client and level.rate is None:
            yield variant, level


def rate_levels(results: SweepResults) -> Iterator[tuple[VariantResult, LevelResult]]:
    """(variant, level) pairs of open-loop levels (a `rate`), measured or not."""
    for variant, level in results.levels():
        if level.rate is not None:
            yield variant, level


def level_name(level: LevelResult) -> str:
    """`32` for a concurrency, `2/s` for an arrival rate."""
    return f"{level.rate:g}/s" if level.rate is not None else str(level.concurrency)


def _ratio(base: float | None, mine: float | None) -> float | None:
    return base / mine if base and mine else None


def derive_rates(results: SweepResults) -> list[dict[str, Any]]:
    """One row per open-loop level: asked and achieved rate, in-flight, outcomes, latencies,
    throughput, acceptance, vLLM's benchmark beside; for speculation, what a user sees against
    the baseline's run at the same rate and repeat (same arrivals): the baseline's TPOT p50 over
    this one's, and its mean end-to-end latency over this one's (above 1: speculation faster)."""
    base = {(lv.rate, lv.repeat): lv for v, lv in rate_levels(results) if v.name == "baseline"}
    rows = []
    for variant, level in rate_levels(results):
        c, ol, server = level.client or {}, level.open_loop or {}, level.server or {}
        bench = level.vllm_bench or {}
        base_level = base.get((level.rate, level.repeat))
        b = (base_level.client if base_level else None) or {}
        row = {"variant": variant.name, "rate": level.rate, "repeat": level.repeat,
               "status": level.status, "achieved_rate": ol.get("achieved_rate"), "behind": ol.get("behind"),
               "in_flight_max": ol.get("in_flight_max"), "in_flight_mean": ol.get("in_flight_mean"),
               "outcomes": level.outcomes or ol.get("outcomes") or {},
               "ttft_ms": c.get("ttft_ms") or {}, "tpot_ms": c.get("per_token_latency_ms") or {},
               "e2e_ms": c.get("e2e_ms") or {}, "output_tokens_per_s": c.get("output_tokens_per_s"),
               "acceptance": server.get("acceptance_rate"),
               "bench": {"output_tokens_per_s": bench.get("output_tokens_per_s"),
                         "ttft_p50_ms": (bench.get("ttft_ms") or {}).get("p50"),
                         "tpot_p50_ms": (bench.get("per_token_latency_ms") or {}).get("p50"),
                         "agrees": (level.vllm_bench_agreement or {}).get("agrees"),
                         "error": bench.get("error")}}
        if variant.name != "baseline" and b:
            row["tpot_p50_speedup"] = _ratio((b.get("per_token_latency_ms") or {}).get("p50"), row["tpot_ms"].get("p50"))
            row["e2e_mean_speedup"] = _ratio((b.get("e2e_ms") or {}).get("mean"), row["e2e_ms"].get("mean"))
        rows.append(row)
    return sorted(rows, key=lambda r: (r["rate"], r["repeat"], r["variant"] == "baseline", r["variant"]))


def level_at(results: SweepResults, variant_name: str, concurrency: int, repeat: int = 1) -> LevelResult | None:
    for variant, level in levels(results):
        if (variant.name, level.concurrency, level.repeat) == (variant_name, concurrency, repeat):
            return level
    return None


def derive(results: SweepResults) -> list[dict[str, Any]]:
    """For each speculative variant, concurrency and repeat: speedup over the baseline's run of the
    same repeat (measured beside it), and the cost model."""
    rows = []
    for variant, level in levels(results):
        if variant.name == "baseline" or not variant.k:
            continue
        c, repeat = level.concurrency, level.repeat
        client, server = level.client, level.server or {}
        base = level_at(results, "baseline", c, repeat)
        base_client = base.client if base else {}
        # Per-token costs from the engine's own clock when the server reports them (robust to a
        # client or API server that is short of CPU and delivers chunks late), else the client's.
        tpot, source = _tpot_s(level), "server"
        base_tpot = _tpot_s(base) if base else None
        if tpot is None or base_tpot is None:
            tpot, source = _tpot_s(level, client_side=True), "client"
            base_tpot = _tpot_s(base, client_side=True) if base else None
        row: dict[str, Any] = {"variant": variant.name, "concurrency": c, "repeat": repeat,
                               "per_token_source": source}
        if base and level.sequence and base.sequence:
            row["went_first"] = level.sequence < base.sequence
        row.update(stats.speculation_analysis(
            server.get("acceptance_rate"), server.get("mean_accepted_length"), variant.k, tpot, base_tpot))
        if base_client.get("output_tokens_per_s"):
            row["speedup"] = client["output_tokens_per_s"] / base_client["output_tokens_per_s"]
        bench, base_bench = level.vllm_bench or {}, (base.vllm_bench if base else None) or {}
        if bench.get("output_tokens_per_s") and base_bench.get("output_tokens_per_s"):
            row["vllm_bench_speedup"] = bench["output_tokens_per_s"] / base_bench["output_tokens_per_s"]
        # The content check (loadtest.measurement.content): whether the outputs behind these speeds are text.
        row["content"], row["baseline_content"] = client.get("content"), base_client.get("content")
        row["vllm_bench_content"] = bench.get("content")
        valid, base_valid = ((x or {}).get("tokens_per_s_valid") for x in (row["content"], row["baseline_content"]))
        if valid and base_valid:
            row["valid_speedup"] = valid / base_valid
        rows.append(row)
    return rows


SPEEDUPS = {"speedup": "client output tokens/s (Locust)", "vllm_bench_speedup": "vLLM's benchmark output tokens/s",
            "measured_speedup": "per token on the engine's clock"}
VALID_SPEEDUP = "per-request tokens/s over the content-valid requests"


def summarize_speedups(results: SweepResults) -> list[dict[str, Any]]:
    """Per speculative variant and concurrency: each speedup's mean over the repeats and its 95%
    interval (Student's t; none from one run), and a verdict read from all of them together."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in derive(results):
        groups.setdefault((row["variant"], row["concurrency"]), []).append(row)
    out = []
    for (variant, c), rows in groups.items():
        entry: dict[str, Any] = {"variant": variant, "concurrency": c, "runs": len(rows)}
        for key in SPEEDUPS:
            entry[key] = stats.mean_interval([r[key] for r in rows if r.get(key) is not None])
        for key in ("acceptance_rate", "mean_accepted_length", "valid_speedup"):
            entry[key] = stats.mean_interval([r[key] for r in rows if r.get(key) is not None])
        for key in ("content", "baseline_content", "vllm_bench_content"):
            entry[key] = content.merge([r.get(key) for r in rows])
        by_order = {o: [r["speedup"] for r in rows if r.get("went_first") is first and r.get("speedup")]
                    for o, first in (("first", True), ("second", False))}
        if all(by_order.values()):
            # Runs where the variant went before its baseline run against those where it went after:
            # a gap between the two is drift or an order effect, which the alternating order cancels.
            entry["speedup_by_order"] = {o: sum(v) / len(v) for o, v in by_order.items()}
        entry["verdict"] = verdict(entry)
        out.append(entry)
    return out


def by_category(results: SweepResults) -> list[dict[str, Any]]:
    """Per concurrency, prompt category and variant (closed loop, a categorised workload): requests,
    acceptance, mean per-request tokens/s, and the speedup over the baseline's same category in the
    same repeat (its mean over the repeats, with a 95% interval from two or more)."""
    groups: dict[tuple[int, str, str], list[tuple[dict[str, Any], dict[str, Any] | None]]] = {}
    for variant, level in levels(results):
        base = level_at(results, "baseline", level.concurrency, level.repeat) if variant.name != "baseline" else None
        for category, figs in ((level.client or {}).get("by_category") or {}).items():
            base_figs = ((base.client or {}).get("by_category") or {}).get(category) if base else None
            groups.setdefault((level.concurrency, category, variant.name), []).append((figs, base_figs))
    rows = []
    for (c, category, name), runs in groups.items():
        drafted = [f["acceptance"] for f, _ in runs if f.get("acceptance") is not None]
        speeds = [f["tokens_per_s"] for f, _ in runs if f.get("tokens_per_s")]
        ratios = [f["tokens_per_s"] / b["tokens_per_s"] for f, b in runs
                  if b and f.get("tokens_per_s") and b.get("tokens_per_s")]
        rows.append({"concurrency": c, "category": category, "variant": name,
                     "requests": sum(f["requests"] for f, _ in runs),
                     "not_text": sum(f.get("not_text") or 0 for f, _ in runs),
                     "acceptance": statistics.fmean(drafted) if drafted else None,
                     "tokens_per_s": statistics.fmean(speeds) if speeds else None,
                     "speedup": stats.mean_interval(ratios) if ratios else None})
    order = {name: i for i, name in enumerate(v.name for v in results.variants)}
    firsts = {c: i for i, c in enumerate(dict.fromkeys(r["category"] for r in rows))}
    return sorted(rows, key=lambda r: (r["concurrency"], firsts[r["category"]], order.get(r["variant"], 99)))


def costs(results: SweepResults) -> list[dict[str, Any]]:
    """Where a variant's config names a price per GPU-hour: its GPU-hours in this sweep (starts and
    measured runs) and, per batch size, its cost per million output tokens at the throughput the
    client measured (mean over the repeats)."""
    rows = []
    for variant in results.variants:
        price, gpus = variant.price_per_gpu_hour, variant.gpus
        if not price or not gpus:
            continue
        seconds = sum(variant.startup_s) + sum((lv.client or {}).get("duration_s") or 0 for lv in variant.levels)
        by_batch: dict[int, list[float]] = {}
        for level in variant.levels:
            tps = (level.ok_client or {}).get("output_tokens_per_s")
            if tps and level.rate is None:
                by_batch.setdefault(level.concurrency or 0, []).append(tps)
        per_million = {c: price * gpus / 3600 / statistics.fmean(v) * 1e6 for c, v in sorted(by_batch.items())}
        rows.append({"variant": variant.name, "gpus": gpus, "price_per_gpu_hour": price,
                     "gpu_hours": gpus * seconds / 3600, "cost_per_million_tokens": per_million})
    return rows


def verdict(entry: dict[str, Any]) -> str:
    """Pays / does not pay / even, from the client's interval, checked against the engine and vLLM's benchmark."""
    client = entry.get("speedup") or {}
    if client.get("mean") is None:
        return "no baseline to compare with"
    low, high = client.get("low"), client.get("high")
    if low is not None and low > 1:
        text = "pays"
    elif high is not None and high < 1:
        text = "does not pay"
    elif low is None:
        text = "pays" if client["mean"] > 1 else "does not pay"
    else:
        return "breaks even (the 95% interval spans 1.0x)"
    others = [(SPEEDUPS[k], (entry.get(k) or {}).get("mean")) for k in ("vllm_bench_speedup", "measured_speedup")]
    against = [name for name, mean in others if mean is not None and (mean > 1) != (client["mean"] > 1)]
    if against:
        text += f"; but {' and '.join(against)} say the opposite: read the report's trust section before using it"
    return text


def content_warnings(entry: dict[str, Any]) -> list[str]:
    """What the content check says about the outputs behind one verdict (none: they are text). The
    baseline's line names the baseline, so that a sweep of several drafters says it once (callers
    keep each line once)."""
    out = []
    for key, whose in (("content", "speculation's"), ("baseline_content", "the baseline's"),
                       ("vllm_bench_content", "vLLM's benchmark's")):
        text = content.warning(entry.get(key))
        if text:
            label = content.label(entry.get(key))
            name = "baseline" if key == "baseline_content" else entry["variant"]
            out.append(f"batch {entry['concurrency']}, {name}: {label}: {whose} output {text}")
    return out


def slo_lines(results: SweepResults) -> list[str]:
    """Per variant: the highest concurrency at which every run met every service target."""
    targets = results.settings.get("slo")
    if not targets:
        return []
    described = ", ".join(t.describe() for t in slo.parse_targets(targets))
    lines = []
    for variant in results.variants:
        at_rates = [lv for lv in variant.levels if lv.slo and lv.rate is not None]
        if at_rates:
            met = [lv.rate for lv in at_rates if lv.slo.get("met")
                   and all(x.slo.get("met") for x in at_rates if x.rate == lv.rate)]
            lines.append(f"service targets ({described}), {variant.name}: "
                         + (f"met up to {max(met):g} requests/s (open loop)" if met else "not met at any measured rate"))
        measured = [lv for lv in variant.levels if lv.slo and lv.rate is None]
        if not measured:
            continue
        best = slo.highest_concurrency(measured)
        at_best = [lv.slo["goodput_tokens_per_s"] for lv in measured
                   if lv.concurrency == best and lv.slo.get("goodput_tokens_per_s") is not None]
        lines.append(f"service targets ({described}), {variant.name}: "
                     + (f"met up to batch {best}, goodput {sum(at_best) / len(at_best):.0f} tok/s there"
                        if best is not None and at_best else "not met at any measured batch size"))
    return lines


def _tpot_s(level: LevelResult, client_side: bool = False) -> float | None:
    """Mean per-token latency of a level in seconds: the server's histogram, or the client's records."""
    if client_side:
        ms = ((level.client or {}).get("per_token_latency_ms") or {}).get("mean")
        return ms / 1000 if ms else None
    hist = ((level.server or {}).get("histograms") or {}).get("per_token_latency_s") or {}
    return hist.get("mean") or None
