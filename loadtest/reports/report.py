"""Turn results.json into what people read: report.md, report.html (plots embedded), PNG plots,
and the batch-1 vs batch-32 table that `python -m loadtest compare` prints.
"""

from __future__ import annotations

import base64
import json
import re
import statistics
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any


from loadtest.measurement import content
from loadtest.reports import markdown
from loadtest.reports import plots
from loadtest.measurement import slo
from loadtest.measurement import stats
from loadtest.traffic import declared as traffic
from loadtest.traffic import vllm_bench
from loadtest.files import write_atomic, write_json
from loadtest.reports.markdown import figure
from loadtest.reports.page import Page, Section
from loadtest.measurement.results import CREATED_FORMAT


# ---------------------------------------------------------------------------------- derived numbers
def levels(results: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(variant, level) pairs of closed-loop levels that have client numbers (open-loop levels:
    `rate_levels`)."""
    for variant in results.get("variants", []):
        for level in variant.get("levels", []):
            if level.get("client", {}).get("ok") and "rate" not in level:
                yield variant, level


def rate_levels(results: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(variant, level) pairs of open-loop levels (a `rate`), measured or not."""
    for variant in results.get("variants", []):
        for level in variant.get("levels", []):
            if "rate" in level:
                yield variant, level


def level_name(level: dict[str, Any]) -> str:
    """`32` for a concurrency, `2/s` for an arrival rate."""
    return f"{level['rate']:g}/s" if "rate" in level else str(level.get("concurrency"))


def _ratio(base: float | None, mine: float | None) -> float | None:
    return base / mine if base and mine else None


def derive_rates(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per open-loop level: asked and achieved rate, in-flight, outcomes, latencies,
    throughput, acceptance, vLLM's benchmark beside; for speculation, what a user sees against
    the baseline's run at the same rate and repeat (same arrivals): the baseline's TPOT p50 over
    this one's, and its mean end-to-end latency over this one's (above 1: speculation faster)."""
    base = {(lv["rate"], lv.get("repeat", 1)): lv for v, lv in rate_levels(results) if v["name"] == "baseline"}
    rows = []
    for variant, level in rate_levels(results):
        c, ol, server = level.get("client") or {}, level.get("open_loop") or {}, level.get("server") or {}
        bench = level.get("vllm_bench") or {}
        b = (base.get((level["rate"], level.get("repeat", 1))) or {}).get("client") or {}
        row = {"variant": variant["name"], "rate": level["rate"], "repeat": level.get("repeat", 1),
               "status": level.get("status"), "achieved_rate": ol.get("achieved_rate"), "behind": ol.get("behind"),
               "in_flight_max": ol.get("in_flight_max"), "in_flight_mean": ol.get("in_flight_mean"),
               "outcomes": level.get("outcomes") or ol.get("outcomes") or {},
               "ttft_ms": c.get("ttft_ms") or {}, "tpot_ms": c.get("per_token_latency_ms") or {},
               "e2e_ms": c.get("e2e_ms") or {}, "output_tokens_per_s": c.get("output_tokens_per_s"),
               "acceptance": server.get("acceptance_rate"),
               "bench": {"output_tokens_per_s": bench.get("output_tokens_per_s"),
                         "ttft_p50_ms": (bench.get("ttft_ms") or {}).get("p50"),
                         "tpot_p50_ms": (bench.get("per_token_latency_ms") or {}).get("p50"),
                         "agrees": (level.get("vllm_bench_agreement") or {}).get("agrees"),
                         "error": bench.get("error")}}
        if variant["name"] != "baseline" and b:
            row["tpot_p50_speedup"] = _ratio((b.get("per_token_latency_ms") or {}).get("p50"), row["tpot_ms"].get("p50"))
            row["e2e_mean_speedup"] = _ratio((b.get("e2e_ms") or {}).get("mean"), row["e2e_ms"].get("mean"))
        rows.append(row)
    return sorted(rows, key=lambda r: (r["rate"], r["repeat"], r["variant"] == "baseline", r["variant"]))


def rate_headline(results: dict[str, Any]) -> list[str]:
    """Per speculative variant and rate: the speedups a user sees, averaged over the repeats; and
    each run whose generator fell behind its schedule."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    lines = []
    for row in derive_rates(results):
        if row["behind"]:
            lines.append(f"rate {row['rate']:g}/s, {row['variant']} run {row['repeat']}: the load generator fell "
                         f"behind (achieved {figure(row['achieved_rate'], 2)}/s): that run's offered load was lower")
        if row.get("tpot_p50_speedup") is not None or row.get("e2e_mean_speedup") is not None:
            groups.setdefault((row["variant"], row["rate"]), []).append(row)
    for (variant, rate), rows in sorted(groups.items(), key=lambda g: (g[0][1], g[0][0])):
        parts = []
        for key, what in (("tpot_p50_speedup", "per token (TPOT p50)"), ("e2e_mean_speedup", "end to end (mean)")):
            m = stats.mean_interval([r[key] for r in rows if r.get(key) is not None])
            if m["mean"] is not None:
                spread = f" (95% interval {m['low']:.2f}-{m['high']:.2f})" if m.get("low") is not None else ""
                parts.append(f"{m['mean']:.2f}x {what}{spread}")
        served = sum(r["outcomes"].get("served", 0) for r in rows)
        total = sum(sum(r["outcomes"].values()) for r in rows)
        lines.append(f"rate {rate:g}/s, {variant}: against the baseline at the same arrivals, " + "; ".join(parts)
                     + f"; {served}/{total} requests served ({len(rows)} run{'s' if len(rows) != 1 else ''})")
    return lines


RATE_COLUMNS = ["rate asked", "variant", "run", "achieved req/s", "in flight max", "served/refused/timed out/failed/unsent",
                "TTFT p50/p95 ms", "TPOT p50/p95 ms", "output tok/s", "acceptance", "TPOT p50 speedup",
                "e2e mean speedup", "vLLM bench tok/s, TTFT p50, TPOT p50", "bench agrees", "status"]


def rate_table_rows(results: dict[str, Any]) -> list[list[str]]:
    out = []
    for r in derive_rates(results):
        o, b = r["outcomes"], r["bench"]
        out.append([f"{r['rate']:g}", r["variant"], str(r["repeat"]),
                    figure(r["achieved_rate"], 2) + (" BEHIND" if r["behind"] else ""), figure(r["in_flight_max"], 0),
                    "/".join(str(o.get(k, 0)) for k in ("served", "refused", "timed_out", "failed", "unsent")),
                    f"{figure(r['ttft_ms'].get('p50'))} / {figure(r['ttft_ms'].get('p95'))}",
                    f"{figure(r['tpot_ms'].get('p50'), 2)} / {figure(r['tpot_ms'].get('p95'), 2)}",
                    figure(r["output_tokens_per_s"]), figure(r["acceptance"], pct=True),
                    _cell("speedup", r.get("tpot_p50_speedup")), _cell("speedup", r.get("e2e_mean_speedup")),
                    b["error"] or f"{figure(b['output_tokens_per_s'])}, {figure(b['ttft_p50_ms'])}, {figure(b['tpot_p50_ms'], 2)}",
                    _cell("bench_agrees", b["agrees"]), str(r["status"])])
    return out


def _level_at(results: dict[str, Any], variant_name: str, concurrency: int, repeat: int = 1) -> dict[str, Any] | None:
    for variant, level in levels(results):
        if (variant["name"], level["concurrency"], level.get("repeat", 1)) == (variant_name, concurrency, repeat):
            return level
    return None


def derive(results: dict[str, Any]) -> list[dict[str, Any]]:
    """For each speculative variant, concurrency and repeat: speedup over the baseline's run of the
    same repeat (measured beside it), and the cost model."""
    rows = []
    for variant, level in levels(results):
        if variant["name"] == "baseline" or not variant.get("k"):
            continue
        c, repeat = level["concurrency"], level.get("repeat", 1)
        client, server = level["client"], level.get("server") or {}
        base = _level_at(results, "baseline", c, repeat)
        base_client = base["client"] if base else {}
        # Per-token costs from the engine's own clock when the server reports them (robust to a
        # client or API server that is short of CPU and delivers chunks late), else the client's.
        tpot, source = _tpot_s(level), "server"
        base_tpot = _tpot_s(base) if base else None
        if tpot is None or base_tpot is None:
            tpot, source = _tpot_s(level, client_side=True), "client"
            base_tpot = _tpot_s(base, client_side=True) if base else None
        row: dict[str, Any] = {"variant": variant["name"], "concurrency": c, "repeat": repeat,
                               "per_token_source": source}
        if base and level.get("sequence") and base.get("sequence"):
            row["went_first"] = level["sequence"] < base["sequence"]
        row.update(stats.speculation_analysis(
            server.get("acceptance_rate"), server.get("mean_accepted_length"), variant["k"], tpot, base_tpot))
        if base_client.get("output_tokens_per_s"):
            row["speedup"] = client["output_tokens_per_s"] / base_client["output_tokens_per_s"]
        bench, base_bench = level.get("vllm_bench") or {}, (base or {}).get("vllm_bench") or {}
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


def summarize_speedups(results: dict[str, Any]) -> list[dict[str, Any]]:
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
    """What the content check says about the outputs behind one verdict (none: they are text)."""
    out = []
    for key, whose in (("content", "speculation's"), ("baseline_content", "the baseline's"),
                       ("vllm_bench_content", "vLLM's benchmark's")):
        text = content.warning(entry.get(key))
        if text:
            label = content.label(entry.get(key))
            out.append(f"batch {entry['concurrency']}, {entry['variant']}: {label}: {whose} output {text}")
    return out


def headline(results: dict[str, Any]) -> list[str]:
    """The report's first lines: output that is no text first (`content_warnings`), then per batch
    size, whether speculation pays and by how much."""
    entries = sorted(summarize_speedups(results), key=lambda e: (e["concurrency"], e["variant"]))
    settings = results.get("settings") or {}
    lines = traffic.describe(settings) if settings.get("workload") else []  # which traffic ran, first
    lines += [w for e in entries for w in content_warnings(e)]
    # Grouped sweeps (one server start per variant) pair runs by repeat, not by time.
    grouped = ((results.get("plan") or {}).get("order") == "grouped")
    paired = "each paired with the baseline's run of the same repeat" if grouped else "each beside a baseline run"
    for e in entries:
        parts = []
        for key, name in SPEEDUPS.items():
            m = e.get(key) or {}
            if m.get("mean") is None:
                continue
            spread = f" (95% interval {m['low']:.2f}-{m['high']:.2f})" if m.get("low") is not None else ""
            parts.append(f"{m['mean']:.2f}x {name}{spread}")
        accept = (e.get("acceptance_rate") or {}).get("mean")
        order = e.get("speedup_by_order")
        valid = (e.get("valid_speedup") or {}).get("mean")
        said = f"speculation {e['verdict']}: " + "; ".join(parts) + "; " if parts else f"{e['verdict']}; "
        lines.append(f"batch {e['concurrency']}, {e['variant']}: {said}"
                     + (f"acceptance {accept:.0%}" if accept is not None else "")
                     + (f"; {valid:.2f}x {VALID_SPEEDUP}" if valid is not None else "")
                     + f"{'; ' if accept is not None else ''}{content.describe(e.get('content'))}"
                     + (f"; Locust {order['first']:.2f}x in runs before the baseline's, {order['second']:.2f}x "
                        "in runs after it" if order else "")
                     + f" ({e['runs']} run{'s' if e['runs'] != 1 else ''}{', ' + paired if parts else ''})")
    return lines + [vllm_bench.describe_systematic(e) for e in vllm_bench.systematic_by_level(results)] \
        + slo_lines(results)


def slo_lines(results: dict[str, Any]) -> list[str]:
    """Per variant: the highest concurrency at which every run met every service target."""
    targets = (results.get("settings") or {}).get("slo")
    if not targets:
        return []
    described = ", ".join(t.describe() for t in slo.parse_targets(targets))
    lines = []
    for variant in results.get("variants", []):
        at_rates = [lv for lv in variant.get("levels", []) if lv.get("slo") and "rate" in lv]
        if at_rates:
            met = [lv["rate"] for lv in at_rates if lv["slo"].get("met")
                   and all(x["slo"].get("met") for x in at_rates if x["rate"] == lv["rate"])]
            lines.append(f"service targets ({described}), {variant['name']}: "
                         + (f"met up to {max(met):g} requests/s (open loop)" if met else "not met at any measured rate"))
        measured = [lv for lv in variant.get("levels", []) if lv.get("slo") and "rate" not in lv]
        if not measured:
            continue
        best = slo.highest_concurrency(measured)
        at_best = [lv["slo"]["goodput_tokens_per_s"] for lv in measured
                   if lv["concurrency"] == best and lv["slo"].get("goodput_tokens_per_s") is not None]
        lines.append(f"service targets ({described}), {variant['name']}: "
                     + (f"met up to batch {best}, goodput {sum(at_best) / len(at_best):.0f} tok/s there"
                        if best is not None and at_best else "not met at any measured batch size"))
    return lines


def _tpot_s(level: dict[str, Any], client_side: bool = False) -> float | None:
    """Mean per-token latency of a level in seconds: the server's histogram, or the client's records."""
    if client_side:
        ms = ((level.get("client") or {}).get("per_token_latency_ms") or {}).get("mean")
        return ms / 1000 if ms else None
    hist = ((level.get("server") or {}).get("histograms") or {}).get("per_token_latency_s") or {}
    return hist.get("mean") or None


# ---------------------------------------------------------------------------------- tables
def compare_rows(results: dict[str, Any], concurrencies: list[int] | None = None) -> list[dict[str, Any]]:
    derived = {(r["variant"], r["concurrency"], r["repeat"]): r for r in derive(results)}
    wanted = concurrencies or sorted({lv["concurrency"] for _, lv in levels(results)})
    repeats = sorted({lv.get("repeat", 1) for v in results.get("variants", []) for lv in v.get("levels", [])})
    rows = []
    for c in wanted:
        for repeat in repeats:
            for variant in results.get("variants", []):
                level = next((lv for lv in variant.get("levels", [])
                              if lv.get("concurrency") == c and lv.get("repeat", 1) == repeat), None)
                if level is not None:
                    rows.append(_compare_row(variant, level, derived.get((variant["name"], c, repeat), {})))
    return rows


def _compare_row(variant: dict[str, Any], level: dict[str, Any], d: dict[str, Any]) -> dict[str, Any]:
    client = level.get("client") or {}
    server = level.get("server") or {}
    bench = level.get("vllm_bench") or {}
    return {
                "concurrency": level["concurrency"], "repeat": level.get("repeat", 1), "variant": variant["name"],
                "status": level["status"],
                "requests": f"{client.get('ok', 0)}/{client.get('requests', 0)}",
                "system_tps": client.get("output_tokens_per_s"),
                "user_tps": (client.get("per_user_tokens_per_s") or {}).get("p50"),
                "ttft_p50": _with_engine((client.get("ttft_ms") or {}).get("p50"), server, "ttft_s"),
                "tpot_p50": _with_engine((client.get("per_token_latency_ms") or {}).get("p50"), server,
                                         "per_token_latency_s", 2),
                "k": _k_cell(level.get("configured_k", variant.get("k")), server.get("effective_k")),
                "acceptance": server.get("acceptance_rate"),
                "accepted_length": server.get("mean_accepted_length"),
                "speedup": d.get("speedup"),
                "bench_tps": bench.get("output_tokens_per_s"),
                "bench_agrees": (level.get("vllm_bench_agreement") or {}).get("agrees"),
                "server_agrees": (level.get("consistency") or {}).get("ok"),
                "degenerate": (client.get("content") or {}).get("degenerate_share"),
    }


def _k_cell(configured: int | None, effective: float | None) -> str:
    """Configured K, and in brackets the K that ran (draft tokens per drafting step); `-` without speculation."""
    if configured is None and effective is None:
        return "-"
    return f"{figure(configured, 0)} ({figure(effective, 2)})"


def _with_engine(client_ms: float | None, server: dict[str, Any], hist: str, digits: int = 1) -> str:
    """Client percentile, and in brackets the engine's own mean (free of delivery delays)."""
    engine_s = ((server.get("histograms") or {}).get(hist) or {}).get("mean")
    text = figure(client_ms, digits)
    return f"{text} ({figure(engine_s * 1000, digits)})" if engine_s is not None else text


COMPARE_COLUMNS = [
    ("concurrency", "batch"), ("variant", "variant"), ("repeat", "run"), ("requests", "ok/req"),
    ("system_tps", "tok/s system"), ("bench_tps", "vLLM bench tok/s"),
    ("user_tps", "tok/s per user"), ("ttft_p50", "TTFT p50 (engine) ms"),
    ("tpot_p50", "per-token p50 (engine) ms"),
    ("k", "K (effective)"), ("acceptance", "acceptance"), ("accepted_length", "tokens/step"), ("speedup", "speedup"),
    ("degenerate", "degenerate"), ("bench_agrees", "bench agrees"), ("server_agrees", "counters agree"),
    ("status", "status"),
]


def _cell(key: str, value: Any) -> str:
    if key in ("acceptance", "degenerate"):
        return figure(value, pct=True)
    if key in ("accepted_length",):
        return figure(value, 2)
    if key == "speedup":
        return "-" if value is None else f"{value:.2f}x"
    if key in ("server_agrees", "bench_agrees"):
        return "-" if value is None else ("yes" if value else "NO")
    if key in ("concurrency", "repeat"):
        return str(value)
    return figure(value, 1)


def compare_table(results: dict[str, Any], concurrencies: list[int] | None = None) -> str:
    """Plain-text table for the terminal."""
    from loadtest.reports.sweep_summary import lead

    said = lead(results)  # what the run is, where it is not a complete measurement: before any verdict
    if any(True for _ in rate_levels(results)):
        return "\n".join([said] if said else []) + ("\n" if said else "") + _rate_table_text(results)
    rows = compare_rows(results, concurrencies)
    top = ([said] if said else []) + [line for line in headline(results) if not concurrencies
                                      or not line.startswith("batch ")
                                      or int(line.split(",")[0].removeprefix("batch ")) in concurrencies]
    header = [title for _, title in COMPARE_COLUMNS]
    body = [[_cell(k, r[k]) for k, _ in COMPARE_COLUMNS] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]
    lines = [*top, *([""] if top else [])]
    lines.append("  ".join(h.rjust(w) if i > 1 else h.ljust(w) for i, (h, w) in enumerate(zip(header, widths))))
    lines.append("  ".join("-" * w for w in widths))
    previous = None
    for r, b in zip(rows, body):
        if previous is not None and r["concurrency"] != previous:
            lines.append("")
        previous = r["concurrency"]
        lines.append("  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(b, widths))))
    notes = [f"{v['name']} c={lv['concurrency']} run {lv.get('repeat', 1)}: {n}" for v in results.get("variants", [])
             for lv in v.get("levels", []) if "concurrency" in lv and (not concurrencies or lv["concurrency"] in concurrencies)
             for n in (lv.get("problems") or []) + (lv.get("notes") or [])]
    if notes:
        lines += ["", *[f"note: {n}" for n in notes]]
    return "\n".join(lines)


def _rate_table_text(results: dict[str, Any]) -> str:
    """The open-loop levels' table for the terminal, with their headline and notes."""
    top = rate_headline(results) + slo_lines(results)
    body = rate_table_rows(results)
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(RATE_COLUMNS)]
    lines = [*top, *([""] if top else [])]
    lines.append("  ".join(h.ljust(w) for h, w in zip(RATE_COLUMNS, widths)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    notes = [f"{v['name']} {level_name(lv)} run {lv.get('repeat', 1)}: {n}" for v, lv in rate_levels(results)
             for n in (lv.get("problems") or []) + (lv.get("notes") or [])]
    return "\n".join(lines + (["", *[f"note: {n}" for n in notes]] if notes else []))


def _latency_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "batch", "run", "TTFT p50/p95/p99 ms", "per-token p50/p95/p99 ms", "chunk gap p50/p99 ms",
              "tokens/chunk mean", "e2e p50/p99 ms", "req/s", "peak tok/s"]
    rows = []
    for variant, level in levels(results):
        c = level["client"]

        def trio(key: str, ps: tuple[int, ...] = (50, 95, 99)) -> str:
            d = c.get(key) or {}
            return " / ".join(figure(d.get(f"p{p}")) for p in ps)

        rows.append([variant["name"], str(level["concurrency"]), str(level.get("repeat", 1)), trio("ttft_ms"),
                     trio("per_token_latency_ms"),
                     trio("chunk_gap_ms", (50, 99)), figure((c.get("tokens_per_chunk") or {}).get("mean"), 2),
                     trio("e2e_ms", (50, 99)), figure(c.get("request_throughput"), 2),
                     figure(c.get("peak_output_tokens_per_s"), 0)])
    return header, rows


def _spec_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "batch", "run", "K", "per-token costs from", "acceptance rate alpha", "E(alpha,K)",
              "measured tokens/step L", "implied per-token a", "per-position acceptance", "step cost r",
              "break-even alpha*", "break-even a*", "pays (L > r)", "per-token speedup (engine)",
              "throughput speedup"]
    rows = []
    for d in derive(results):
        level = _level_at(results, d["variant"], d["concurrency"], d["repeat"]) or {}
        per_pos = (level.get("server") or {}).get("per_position_acceptance") or []
        costed = "step_cost_ratio" in d

        def never(key: str) -> str:
            return "never" if costed and d.get(key) is None else figure(d.get(key), 3)

        rows.append([d["variant"], str(d["concurrency"]), str(d["repeat"]), str(d["k"]), d.get("per_token_source", "-"),
                     figure(d.get("acceptance_rate"), 3), figure(d.get("expected_tokens_per_step"), 2),
                     figure(d.get("mean_accepted_length"), 2), figure(d.get("implied_per_token_acceptance"), 3),
                     " ".join(f"{p:.2f}" for p in per_pos) or "-", figure(d.get("step_cost_ratio"), 2),
                     never("break_even_acceptance_rate"), never("break_even_per_token_acceptance"),
                     "-" if not costed else ("yes" if d.get("pays") else "no"),
                     figure(d.get("measured_speedup"), 2), figure(d.get("speedup"), 2)])
    return header, rows


def _content_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "batch", "run", "client", "checked", "degenerate", "distinct 4-grams", "reference",
              "loop share", "acceptance (valid / degenerate)", "tok/s per request (valid / degenerate)"]
    rows = []
    for variant, level in levels(results):
        for client, summary in (("Locust", level["client"].get("content")),
                                ("vLLM bench", (level.get("vllm_bench") or {}).get("content"))):
            if not summary or not summary.get("checked"):
                continue
            ref = summary.get("reference") or {}
            rows.append([variant["name"], str(level["concurrency"]), str(level.get("repeat", 1)), client,
                         str(summary["checked"]), f"{summary['degenerate']} ({summary['degenerate_share']:.0%})",
                         figure(summary.get("distinct_4"), 2),
                         f"{ref['distinct_4']:.2f} ({ref['source']})" if ref else "none",
                         figure(summary.get("loop_share"), pct=True),
                         f"{figure(summary.get('acceptance_valid'), pct=True)} / "
                         f"{figure(summary.get('acceptance_degenerate'), pct=True)}",
                         f"{figure(summary.get('tokens_per_s_valid'), 1)} / {figure(summary.get('tokens_per_s_degenerate'), 1)}"])
    return header, rows


def _trust_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "batch", "run", "status", "client tokens", "server tokens", "difference", "client tok/s",
              "server tok/s", "TTFT mean client/server ms", "e2e mean client/server ms", "per-token mean client/server ms",
              "problems and notes"]
    rows = []
    for variant in results.get("variants", []):
        for level in variant.get("levels", []):
            c, s, k = level.get("client") or {}, level.get("server") or {}, level.get("consistency") or {}
            h = s.get("histograms") or {}

            def pair(ckey: str, skey: str) -> str:
                mine = (c.get(ckey) or {}).get("mean")
                theirs = (h.get(skey) or {}).get("mean")
                return f"{figure(mine)} / {figure(theirs * 1000 if theirs is not None else None)}"

            diff = k.get("relative_error")
            rows.append([variant["name"], level_name(level), str(level.get("repeat", 1)), level["status"],
                         figure(k.get("client_output_tokens"), 0), figure(k.get("server_generation_tokens"), 0),
                         "-" if diff is None else f"{100 * diff:.2f}%" + ("" if k.get("ok") else " FLAG"),
                         figure(c.get("output_tokens_per_s")), figure(s.get("output_tokens_per_s")),
                         pair("ttft_ms", "ttft_s"), pair("e2e_ms", "e2e_s"),
                         pair("per_token_latency_ms", "per_token_latency_s"),
                         "; ".join((level.get("problems") or []) + (level.get("notes") or [])) or "none"])
    return header, rows


def _slo_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    targets = slo.parse_targets((results.get("settings") or {}).get("slo") or "") \
        if (results.get("settings") or {}).get("slo") else []
    header = ["variant", "batch", "run", *[f"{t.describe()}: value ms, nearest rank (share within)" for t in targets],
              "goodput tok/s", "tok/s", "all met"]
    rows = []
    for variant, level in levels(results):
        r = level.get("slo")
        if not r:
            continue
        cells = []
        for t in targets:
            v = r["targets"].get(t.name) or {}
            share = v.get("share_within")
            cells.append(f"{figure(v.get('value_ms'))} ({'-' if share is None else f'{100 * share:.1f}%'})"
                         + ("" if v.get("met") else " MISSED"))
        rows.append([variant["name"], str(level["concurrency"]), str(level.get("repeat", 1)), *cells,
                     figure(r.get("goodput_tokens_per_s")), figure(level["client"].get("output_tokens_per_s")),
                     "yes" if r.get("met") else "no"])
    return header, rows


def _lag_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "batch", "run", "send lag p50/p99 ms", "loop lag p50/p99/max ms", "loop stalls > 50 ms",
              "Locust CPU (cores)"]
    rows = []
    for variant, level in levels(results):
        lag = level.get("load_generator") or {}
        send, loop = lag.get("send_lag_ms") or {}, lag.get("loop_lag_ms") or {}
        loc = level.get("locust") or {}
        cpu = loc["cpu_s"] / loc["wall_s"] if loc.get("wall_s") else None
        rows.append([variant["name"], str(level["concurrency"]), str(level.get("repeat", 1)),
                     f"{figure(send.get('p50'), 2)} / {figure(send.get('p99'), 2)}",
                     f"{figure(loop.get('p50'), 2)} / {figure(loop.get('p99'), 2)} / {figure(loop.get('max'), 1)}",
                     figure(loop.get("over_50ms"), 0), figure(cpu, 2)])
    return header, rows


def _bench_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "batch", "run", "output tok/s Locust / vLLM bench", "TTFT p50 ms Locust / vLLM bench",
              "per-token p50 ms Locust / vLLM bench", "TTFT, per-token request by request",
              "engine drift tok/s, TTFT, per-token", "difference, drift taken out", "agrees",
              "engine TTFT / per-token mean ms", "engine acceptance"]
    rows = []
    for variant, level in levels(results):
        a = level.get("vllm_bench_agreement")
        if not a:
            error = (level.get("vllm_bench") or {}).get("error")
            if error:
                rows.append([variant["name"], str(level["concurrency"]), str(level.get("repeat", 1)), "-", "-", "-",
                             "-", "-", "-", error, "-", "-"])
            continue

        def pair(key: str, digits: int = 1) -> str:
            v = a[key]
            diff = "" if v["difference"] is None else f" ({100 * v['difference']:+.1f}%)"
            return f"{figure(v['locust'], digits)} / {figure(v['vllm_bench'], digits)}{diff}"

        def pct(field: str, keys: tuple[str, ...] = tuple(vllm_bench.AGREEMENT)) -> str:
            return ", ".join("-" if a[k].get(field) is None else f"{100 * a[k][field]:+.1f}%" for k in keys)

        h = (level.get("server") or {}).get("histograms") or {}
        engine = " / ".join(figure((h.get(k) or {}).get("mean") and 1000 * h[k]["mean"], 2)
                            for k in ("ttft_s", "per_token_latency_s"))
        accept = " / ".join(figure((w or {}).get("acceptance_rate"), pct=True)
                            for w in (level.get("server"), level.get("vllm_bench_server")))
        off = [k for k, v in a.items() if isinstance(v, dict) and v["agrees"] is False]
        rows.append([variant["name"], str(level["concurrency"]), str(level.get("repeat", 1)), pair("output_tokens_per_s"),
                     pair("ttft_p50_ms"), pair("per_token_p50_ms", 2),
                     pct("matched_difference", ("ttft_p50_ms", "per_token_p50_ms")), pct("engine_drift"),
                     pct("difference_adjusted"),
                     "yes" if a["agrees"] else ("NO: " + ", ".join(off) if a["agrees"] is False else "-"), engine,
                     accept])
    return header, rows


# ---------------------------------------------------------------------------------- plots
def _averaged(rows: list[dict[str, Any]], keys: tuple[str, ...], by: str = "concurrency") -> list[dict[str, Any]]:
    """Rows of one series averaged over repeats: one row per value of `by` (the concurrency, or an
    open loop's rate), the mean of each key."""
    by_c: dict[float, list[dict[str, Any]]] = {}
    for row in rows:
        by_c.setdefault(row[by], []).append(row)
    out = []
    for c, group in sorted(by_c.items()):
        mean = {by: c}
        for key in keys:
            values = [r[key] for r in group if r.get(key) is not None]
            mean[key] = sum(values) / len(values) if values else None
        out.append(mean)
    return out


def plot(results: dict[str, Any], out: Path) -> list[Path]:
    """PNG plots against concurrency (means over repeats); only those with data are written."""
    plt = plots.pyplot()
    from matplotlib.ticker import FuncFormatter, NullLocator

    client_rows: dict[str, list[dict[str, Any]]] = {}
    for variant, level in levels(results):
        c = level["client"]
        row = {"concurrency": level["concurrency"], "tps": c["output_tokens_per_s"],
               "user_tps": c["per_user_tokens_per_s"]["p50"]}
        for key in ("ttft_ms", "per_token_latency_ms"):
            row.update({f"{key}_p{p}": c[key][f"p{p}"] for p in (50, 95, 99)})
        client_rows.setdefault(variant["name"], []).append(row)
    series = {name: _averaged(rows, tuple(k for k in rows[0] if k != "concurrency"))
              for name, rows in client_rows.items()}
    derived = derive(results)
    concurrencies = sorted({r["concurrency"] for rows in series.values() for r in rows})
    written = []

    def axis(ax: Any, title: str, ylabel: str) -> None:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (users, closed loop)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.set_xticks(concurrencies)  # the levels measured, as plain integers
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.legend(fontsize=8)

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        plots.save(fig, out / name, dpi=110)
        written.append(out / name)

    if series:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for name, rows in series.items():
            xs = [r["concurrency"] for r in rows]
            axes[0].plot(xs, [r["tps"] for r in rows], "o-", label=name)
            axes[1].plot(xs, [r["user_tps"] for r in rows], "o-", label=name)
        axis(axes[0], "System output throughput", "output tokens/s")
        axis(axes[1], "Per-user throughput (median request)", "output tokens/s per user")
        save(fig, "throughput.png")

        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for i, (key, title) in enumerate((("ttft_ms", "Time to first token"),
                                          ("per_token_latency_ms", "Per-token latency (after the first)"))):
            for j, (name, rows) in enumerate(series.items()):
                xs = [r["concurrency"] for r in rows]
                for p, style in ((50, "o-"), (95, "s--"), (99, "^:")):
                    axes[i].plot(xs, [r[f"{key}_p{p}"] for r in rows], style, color=f"C{j}", label=f"{name} p{p}")
            axis(axes[i], title, "ms")
        save(fig, "latency.png")

    spec = [d for d in derived if d.get("acceptance_rate") is not None]
    if spec:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        keys = ("acceptance_rate", "break_even_acceptance_rate", "mean_accepted_length", "expected_tokens_per_step",
                "step_cost_ratio")
        for j, name in enumerate(dict.fromkeys(d["variant"] for d in spec)):
            rows = _averaged([d for d in spec if d["variant"] == name], keys)
            xs = [d["concurrency"] for d in rows]
            axes[0].plot(xs, [d["acceptance_rate"] for d in rows], "o-", color=f"C{j}",
                         label=f"{name} acceptance rate alpha")
            be = [(d["concurrency"], d["break_even_acceptance_rate"]) for d in rows
                  if d.get("break_even_acceptance_rate") is not None]
            if be:
                axes[0].plot(*zip(*be), "x--", color=f"C{j}", label=f"{name} break-even alpha*")
            axes[1].plot(xs, [d["mean_accepted_length"] for d in rows], "o-", color=f"C{j}",
                         label=f"{name} measured L")
            axes[1].plot(xs, [d["expected_tokens_per_step"] for d in rows], "x--", color=f"C{j}",
                         label=f"{name} E(alpha,K)")
            costs = [(d["concurrency"], d["step_cost_ratio"]) for d in rows if d.get("step_cost_ratio")]
            if costs:
                axes[1].plot(*zip(*costs), "s:", color=f"C{j}", label=f"{name} step cost r (break-even L)")
        axes[0].set_ylim(0, 1)
        axis(axes[0], "Acceptance rate", "accepted / drafted tokens")
        axis(axes[1], "Tokens per verification step", "tokens (cost: target steps)")
        save(fig, "acceptance.png")

    speed = [e for e in summarize_speedups(results) if (e.get("speedup") or {}).get("mean") is not None]
    if speed:
        save(speedup_figure(speed, concurrencies), ANSWER)

    rate_rows = [r for r in derive_rates(results) if r["output_tokens_per_s"] is not None]
    if rate_rows:
        save(_rates_figure(plt, rate_rows), "rates.png")
        if not speed and any(r.get("tpot_p50_speedup") for r in rate_rows):
            save(rate_speedup_figure(rate_rows), ANSWER)
    return written


def speedup_figure(speed: list[dict[str, Any]], concurrencies: list[int]) -> Any:
    """Speedup by batch size, each of the three readings with its 95% interval, and the 1.0 line;
    Locust's mean written beside its point."""
    fig, ax = plots.speedup_axes()
    styles = {"speedup": ("o-", 7), "vllm_bench_speedup": ("d--", 5), "measured_speedup": ("x:", 5)}
    names = list(dict.fromkeys(e["variant"] for e in speed))
    for j, name in enumerate(names):
        rows = sorted((e for e in speed if e["variant"] == name), key=lambda e: e["concurrency"])
        for key, label in SPEEDUPS.items():
            pts = [(e["concurrency"], e[key]) for e in rows if (e.get(key) or {}).get("mean") is not None]
            if not pts:
                continue
            xs, ms = [c for c, _ in pts], [m["mean"] for _, m in pts]
            err = [[m["mean"] - m["low"] if m.get("low") is not None else 0 for _, m in pts],
                   [m["high"] - m["mean"] if m.get("high") is not None else 0 for _, m in pts]]
            fmt, size = styles[key]
            ax.errorbar(xs, ms, yerr=err, fmt=fmt, color=f"C{j}", capsize=4, ms=size,
                        lw=2 if key == "speedup" else 1, alpha=1 if key == "speedup" else 0.7,
                        label=(f"{name}: " if len(names) > 1 else "") + label)
            if key == "speedup":
                for x, m in zip(xs, ms):
                    ax.annotate(f"{m:.2f}x", (x, m), textcoords="offset points", xytext=(8, 6), fontsize=10,
                                color=f"C{j}", fontweight="bold")
    intervals = any((e.get("speedup") or {}).get("low") is not None for e in speed)
    plots.finish_speedup_axes(ax, concurrencies or sorted({e["concurrency"] for e in speed}),
                              "batch size (concurrent requests)", "Speedup of speculation over the baseline "
                              + ("(95% intervals)" if intervals else "(one run: no interval)"))
    return fig


def rate_speedup_figure(rows: list[dict[str, Any]]) -> Any:
    """Open loop: speedup a user sees by arrival rate (per-token p50, end-to-end mean), 95% intervals."""
    fig, ax = plots.speedup_axes()
    spec = [r for r in rows if r["variant"] != "baseline"]
    names = list(dict.fromkeys(r["variant"] for r in spec))
    intervals = False
    for j, name in enumerate(names):
        for key, fmt, label in (("tpot_p50_speedup", "o-", "per token (TPOT p50)"),
                                ("e2e_mean_speedup", "d--", "end to end (mean)")):
            by_rate: dict[float, list[float]] = {}
            for r in spec:
                if r["variant"] == name and r.get(key):
                    by_rate.setdefault(r["rate"], []).append(r[key])
            if not by_rate:
                continue
            ms = [(rate, stats.mean_interval(v)) for rate, v in sorted(by_rate.items())]
            intervals = intervals or any(m.get("low") is not None for _, m in ms)
            err = [[m["mean"] - m["low"] if m.get("low") is not None else 0 for _, m in ms],
                   [m["high"] - m["mean"] if m.get("high") is not None else 0 for _, m in ms]]
            ax.errorbar([r for r, _ in ms], [m["mean"] for _, m in ms], yerr=err, fmt=fmt, color=f"C{j}", capsize=4,
                        lw=2 if key == "tpot_p50_speedup" else 1, label=(f"{name}: " if len(names) > 1 else "") + label)
    plots.finish_speedup_axes(ax, sorted({r["rate"] for r in rows}), "arrival rate, req/s (Poisson, open loop)",
                              "Speedup a user sees, same arrivals " + ("(95% intervals)" if intervals else "(one run: no interval)"))
    return fig


def _rates_figure(plt: Any, rows: list[dict[str, Any]]) -> Any:
    """Open-loop levels against the arrival rate asked (means over repeats): TTFT p95 and per-token
    p50 per variant, and speculation's speedups over the baseline at the same arrivals."""
    from matplotlib.ticker import FuncFormatter, NullLocator

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    keys = ("ttft_p95", "tpot_p50", "tpot_p50_speedup", "e2e_mean_speedup")
    flat = [{"variant": r["variant"], "rate": r["rate"], "ttft_p95": r["ttft_ms"].get("p95"),
             "tpot_p50": r["tpot_ms"].get("p50"), "tpot_p50_speedup": r.get("tpot_p50_speedup"),
             "e2e_mean_speedup": r.get("e2e_mean_speedup")} for r in rows]
    for j, variant in enumerate(dict.fromkeys(r["variant"] for r in flat)):
        means = _averaged([r for r in flat if r["variant"] == variant], keys, by="rate")
        for ax, key, style, label in ((axes[0], "ttft_p95", "o-", variant), (axes[1], "tpot_p50", "o-", variant),
                                      (axes[2], "tpot_p50_speedup", "o-", f"{variant}: per-token p50"),
                                      (axes[2], "e2e_mean_speedup", "d--", f"{variant}: e2e mean")):
            pts = [(m["rate"], m[key]) for m in means if m[key] is not None]
            if pts:
                ax.plot(*zip(*pts), style, color=f"C{j}", label=label)
    axes[2].axhline(1.0, color="grey", lw=1)
    rates = sorted({r["rate"] for r in rows})
    for ax, title, ylabel in ((axes[0], "Time to first token p95", "ms"),
                              (axes[1], "Per-token latency p50", "ms"),
                              (axes[2], "Speedup over the baseline, same arrivals", "x baseline")):
        ax.set_xscale("log")
        ax.set_xticks(rates)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("arrival rate asked, req/s (Poisson, open loop)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    axes[0].set_yscale("log")
    fig.suptitle("Open loop: latency and speedup against the arrival rate")
    return fig


# ---------------------------------------------------------------------------------- documents
def _setup_details(results: dict[str, Any]) -> str:
    """The run's settings in full (the first screen's setup paragraph is the short form)."""
    s = results.get("settings", {})
    per_level = {lv["concurrency"]: lv["requests"] for v in results.get("variants", []) for lv in v.get("levels", [])
                 if lv.get("requests") and "concurrency" in lv}
    per_rate = {lv["rate"]: lv["requests"] for _, lv in rate_levels(results) if lv.get("requests")}
    load = ("measured requests per run: " + ", ".join(f"{n} at {r:g}/s" for r, n in sorted(per_rate.items()))
            if per_rate else f"{s.get('duration_s')} s a run" if s.get("duration_s") else
            "measured requests per run: " + ", ".join(f"{n} at batch {c}" for c, n in sorted(per_level.items())))
    load += f", {s.get('repeat', 1)} run(s) of each"
    if s.get("vllm_bench"):
        load += ", each followed by vLLM's serving benchmark on the same server (same prompts, length and concurrency)"
    intro = (f"Config `{results.get('config')}`, status **{results.get('status')}**. Workload `{s.get('workload')}`, "
             f"{s.get('max_tokens')} output tokens per request"
             f"{' (fixed: ignore_eos)' if s.get('fixed_length') else _free_lengths(results)}, "
             f"temperature {s.get('temperature')}, "
             + (f"open loop at rates {', '.join(f'{r:g}' for r in s['rates'])} requests/s (Poisson arrivals, the same "
                f"for every variant of a repeat)" if s.get("rates") else
                f"closed loop at concurrency {s.get('users')}"
                + (f" (users start {1000 * s['arrival_gap_s']:.0f} ms apart)" if s.get("arrival_gap_s") else ""))
             + f", {load}, {s.get('warmup')} warm-up request(s) per user "
             f"excluded, Locust workers: {s.get('workers') or 'none (one process)'}. "
             f"Machine: {results.get('machine', {}).get('cpus')} CPUs, vLLM {results.get('machine', {}).get('vllm')}, "
             f"Locust {results.get('machine', {}).get('locust')}.")
    plan = results.get("plan")
    if plan and plan.get("order"):
        intro += (f" Order: {plan['order']} ({plan.get('why')}); {plan.get('server_starts')} server start(s)"
                  + (f", estimated {plan['estimated_s'] / 60:.0f} min beforehand." if plan.get("estimated_s") else "."))
    return intro


def _table(table: tuple[list[str], list[list[str]]] | None) -> str:
    return "\n\n" + markdown.table(*table) if table and table[1] else "\n\n(nothing measured)"


def evidence(results: dict[str, Any], plots: list[Path], sources: Mapping[str, str], out: Path | None) -> list[Section]:
    """The sections below the first screen, each a caption, its method's link and its table."""
    from loadtest.reports.page import method_link

    def how(anchor: str) -> str:
        return f" Method: {method_link(anchor, out)}."

    s = results.get("settings", {})
    problems = results.get("problems") or []
    variants = [[v["name"], v.get("label", ""), v["status"],
                 v.get("url") or " / ".join(figure(t, 0) for t in v.get("startup_s") or []) or "-",
                 json.dumps(v.get("speculative_config")) if v.get("speculative_config") else "off",
                 v.get("error") or ""] for v in results.get("variants", [])]
    cmp_rows = compare_rows(results)
    compare = ([t for _, t in COMPARE_COLUMNS], [[_cell(k, r[k]) for k, _ in COMPARE_COLUMNS] for r in cmp_rows])
    lines = headline(results) + rate_headline(results)
    out_sections: list[Section] = []
    if lines:
        out_sections.append(Section("findings", "Every finding in full",
                                    "\n".join(f"- {line}" for line in lines)))
    if cmp_rows:
        out_sections.append(Section("batch-comparison", "Batch comparison: every run",
                                    "Per run: throughput, latency (the engine's means in brackets), K, acceptance, "
                                    "speedup over the baseline's run of the same repeat, and whether the second "
                                    "opinion and the server's counters agree." + how("batch-comparison")
                                    + _table(compare)))
    if any(True for _ in rate_levels(results)):
        out_sections.append(Section("open-loop", "Open loop: each variant at each arrival rate",
                                    "Per run: the rate asked and achieved, how requests ended, latencies, "
                                    "speedups at the same arrivals, vLLM's benchmark beside." + how("open-loop-table")
                                    + _table((RATE_COLUMNS, rate_table_rows(results)))))
    out_sections += [
        Section("content", "Content: is the output text?",
                "Per run and client: degenerate requests, distinct 4-grams against the reference, and acceptance "
                "and speed over the content-valid requests alone." + how("the-content-check")
                + _table(_content_rows(results))),
        Section("second-opinion", "Second opinion: Locust against vLLM's serving benchmark",
                "The same prompts, length, temperature and concurrency through vLLM's own benchmark right after "
                "each Locust run; differences judged with the engine's drift taken out." + how("second-opinion")
                + "".join(f"\n\n- {vllm_bench.describe_systematic(e)}" for e in vllm_bench.systematic_by_level(results))
                + _table(_bench_rows(results))),
        Section("latency", "Latency", "TTFT, per-token latency, chunk gaps and end-to-end latency per run."
                + how("latency-and-chunks") + _table(_latency_rows(results))),
        Section("speculation", "Speculation: acceptance, expected tokens and break-even",
                "Acceptance, tokens per step against the model E(alpha, K), the step cost r and the break-even "
                "acceptance per run." + how("the-cost-model") + _table(_spec_rows(results))),
        Section("slo", "Service targets", "Per run: each target's percentile with the share of requests within "
                "its bound, and the goodput." + how("service-targets-slo---slo") + _table(_slo_rows(results))),
        Section("lag", "The load generator's own lag", "Send lag, the event loop's stalls and Locust's CPU per run."
                + how("the-load-generators-own-lag") + _table(_lag_rows(results))),
        Section("trust", "Trust: client numbers against the server's counters",
                f"Client output tokens against `vllm:generation_tokens_total` over the same run (flagged beyond "
                f"{100 * s.get('tolerance', 0.05):.0f}%), the server's means beside the client's, and every run's "
                "problems and notes." + how("can-the-figures-be-trusted") + _table(_trust_rows(results))),
        Section("variants", "Variants and setup", _setup_details(results)
                + ("\n\nProblems:\n\n" + "\n".join(f"- {p}" for p in problems) if problems else "")
                + _table((["variant", "label", "status", "start-up s or address", "speculative_config", "error"],
                          variants))),
    ]
    others = [p for p in plots if p.name != ANSWER]
    if others:
        out_sections.append(Section("plots", "Plots: throughput, latency, acceptance" + (", rates" if any(
            p.name == "rates.png" for p in others) else ""), "\n\n".join(
            f"![{p.stem}]({sources.get(p.name, p.name)})" for p in others)))
    links = _locust_links(results)
    if links:
        out_sections.append(Section("locust", "Locust's own reports",
                                    "\n".join(f"- [{n}]({h}) (CSV beside it)" for n, h in links)))
    return out_sections


ANSWER = "speedup.png"
"""The plot that answers the question, shown beside the verdicts."""


def first_page(results: dict[str, Any], plots: list[Path], sources: Mapping[str, str] | None = None,
               out: Path | None = None) -> Page:
    """The report as a `loadtest.reports.page.Page`: verdicts, the speedup picture and the setup first."""
    from loadtest.reports import sweep_summary
    from loadtest.reports.page import method_link

    sources = sources or {}
    answer = ANSWER if any(p.name == ANSWER for p in plots) else None
    return Page(title=f"Load test: {results.get('config')}", lead=sweep_summary.lead(results),
                lines=sweep_summary.verdict_lines(results), notes=sweep_summary.notes(results),
                picture=answer, picture_alt="Speedup of speculation over the baseline, 95% intervals",
                setup=sweep_summary.setup(results, method_link("reading-the-report", out)),
                badges=sweep_summary.badges(results), sections=evidence(results, plots, sources, out))


def _free_lengths(results: dict[str, Any]) -> str:
    """Without a fixed length: how long the outputs came out (each request ended at the model's end
    of text or at max_tokens)."""
    lengths = [(lv["client"].get("output_tokens_per_request") or {}) for _, lv in levels(results)]
    lengths += [(lv.get("client") or {}).get("output_tokens_per_request") or {} for _, lv in rate_levels(results)]
    lengths = [d for d in lengths if d.get("n")]
    if not lengths:
        return " at most (not fixed: each ends at the model's end of text)"
    return (f" at most (not fixed: each ends at the model's end of text; output lengths p50 "
            f"{statistics.median(d['p50'] for d in lengths):.0f}, from {min(d['min'] for d in lengths):.0f} to "
            f"{max(d['max'] for d in lengths):.0f})")


def _locust_links(results: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for variant in results.get("variants", []):
        for level in variant.get("levels", []):
            loc = level.get("locust")
            if loc:
                out.append((f"{variant['name']} " + (level_name(level) if "rate" in level else f"c={level['concurrency']}"),
                            loc["html"]))
    return out


def report_markdown(results: dict[str, Any], plots: list[Path], sources: Mapping[str, str] | None = None,
                    out: Path | None = None) -> str:
    """report.md: the first screen (verdicts, picture, setup, badges), then the evidence. `sources`
    maps a plot's file name to the address its image link gives (default: the PNG beside report.md)."""
    from loadtest.reports import page

    return page.markdown(first_page(results, plots, sources, out), sources)


def write_markdown(results: dict[str, Any], out: Path, plots: list[Path]) -> Path:
    path = out / "report.md"
    write_atomic(path, report_markdown(results, plots, out=out))
    return path


def embedded(plots: list[Path]) -> dict[str, str]:
    """Plots as data URIs: the page can be mailed or attached alone."""
    return {p.name: "data:image/png;base64," + base64.b64encode(p.read_bytes()).decode() for p in plots}


def write_html(results: dict[str, Any], out: Path, plots: list[Path]) -> Path:
    from loadtest.reports import page

    sources = embedded(plots)
    return write_atomic(out / "report.html", page.html(first_page(results, plots, sources, out), sources))


def write_report(results: dict[str, Any], out: Path) -> dict[str, Path]:
    """results.json (with derived comparisons), report.md, report.html and the PNG plots, each
    written atomically (loadtest.files)."""
    out.mkdir(parents=True, exist_ok=True)
    # A copy: the sweep's own results (what Sweep.save keeps) stay as measured.
    results = {**results, "comparisons": derive(results)}
    if any(True for _ in rate_levels(results)):
        results["rate_comparisons"] = derive_rates(results)
    write_json(out / "results.json", results)
    plots = plot(results, out)
    return {"json": out / "results.json", "markdown": write_markdown(results, out, plots),
            "html": write_html(results, out, plots), **{p.stem: p for p in plots}}


def load_results(report: Path) -> dict[str, Any]:
    path = report / "results.json" if report.is_dir() else report
    return json.loads(path.read_text())


FOLDER_TIME = re.compile(r"(\d{8}-\d{6})$")  # default_out_dir's suffix, local time


def created_at(results: Any, folder: Path) -> float | None:
    """When a sweep was created (seconds since the epoch): its results' `created`, else the time in
    its folder's name; None when neither says."""
    created = results.get("created") if isinstance(results, dict) else None
    if isinstance(created, str):
        try:
            return datetime.strptime(created, CREATED_FORMAT).timestamp()
        except ValueError:
            pass
    match = FOLDER_TIME.search(folder.name)
    if match:
        try:
            return datetime.strptime(match.group(1), "%Y%m%d-%H%M%S").timestamp()
        except ValueError:
            pass
    return None


def newest_report(root: Path = Path("reports")) -> Path | None:
    """The report folder under `root` whose sweep was created last, by the time its results.json
    records (a folder's modification time moves when it is copied or its report re-rendered);
    folders that say no time come last, by name. Files that are not JSON are skipped."""
    found = []
    for path in root.glob("*/results.json"):
        try:
            results = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        when = created_at(results, path.parent)
        found.append((when is not None, when or 0.0, path.parent.name, path.parent))
    return max(found)[-1] if found else None
