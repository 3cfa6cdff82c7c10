"""Turn results.json into what people read: report.md, report.html (plots embedded), PNG plots,
and the batch-1 vs batch-32 table that `python -m loadtest compare` prints. The figures come from
`loadtest.measurement.derive`, the first screen's words from `loadtest.reports.sweep_summary`, the
plots from `loadtest.reports.sweep_plots`; here: the tables, the evidence sections and the files.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from loadtest.measurement import slo
from loadtest.measurement.derive import by_category, costs, derive, derive_rates, level_at, levels, rate_levels, slo_lines
from loadtest.reports import page
from loadtest.reports import sweep_summary
from loadtest.measurement import second_opinion
from loadtest.files import write_atomic, write_json
from loadtest.reports.markdown import figure, interval_text
from loadtest.reports.page import Page, Section, how, method_link, table
from loadtest.reports.sweep_plots import ANSWER, plot
from loadtest.reports.sweep_summary import headline, rate_headline
from loadtest.measurement.derived import CategoryRow, Comparison, CostRow
from loadtest.measurement.figures import (NO_VALUES, ClientFigures, Consistency, Distribution, FigureAgreement,
                                          GeneratorLag, LocustRun, ServerFigures, TargetFigures)
from loadtest.measurement.records import OUTCOMES
from loadtest.measurement.results import CREATED_FORMAT, Closed, LevelResult, SweepResults, VariantResult


# ---------------------------------------------------------------------------------- tables
RATE_COLUMNS = ["rate asked", "variant", "run", "achieved req/s", "in flight max", "served/refused/timed out/failed/unsent",
                "TTFT p50/p95 ms", "TPOT p50/p95 ms", "output tok/s", "acceptance", "TPOT p50 speedup",
                "e2e mean speedup", "vLLM bench tok/s, TTFT p50, TPOT p50", "bench agrees", "status"]


def rate_table_rows(results: SweepResults) -> list[list[str]]:
    out = []
    for r in derive_rates(results):
        b = r.bench
        out.append([f"{r.rate:g}", r.variant, str(r.repeat),
                    figure(r.achieved_rate, 2) + (" BEHIND" if r.behind else ""), figure(r.in_flight_max, 0),
                    "/".join(str(r.outcomes.get(k, 0)) for k in OUTCOMES),
                    f"{figure(r.ttft_ms.p50)} / {figure(r.ttft_ms.p95)}",
                    f"{figure(r.tpot_ms.p50, 2)} / {figure(r.tpot_ms.p95, 2)}",
                    figure(r.output_tokens_per_s), figure(r.acceptance, pct=True),
                    _cell("speedup", r.tpot_p50_speedup), _cell("speedup", r.e2e_mean_speedup),
                    b.error or f"{figure(b.output_tokens_per_s)}, {figure(b.ttft_p50_ms)}, {figure(b.tpot_p50_ms, 2)}",
                    _cell("bench_agrees", b.agrees), str(r.status)])
    return out


def compare_rows(results: SweepResults, concurrencies: list[int] | None = None) -> list[CompareRow]:
    derived = {(r.variant, r.concurrency, r.repeat): r for r in derive(results)}
    wanted = concurrencies or sorted({lv.concurrency for _, lv in levels(results)})
    repeats = sorted({lv.repeat for _, lv in results.levels()})
    rows = []
    for c in wanted:
        for repeat in repeats:
            for variant in results.variants:
                level = next((lv for lv in variant.levels if lv.concurrency == c and lv.repeat == repeat), None)
                if level is not None:
                    rows.append(_compare_row(variant, level, derived.get((variant.name, c, repeat))))
    return rows


@dataclass
class CompareRow:
    """One run in the batch comparison (`compare_rows`), its cells named as `COMPARE_COLUMNS` names them."""

    concurrency: int | None
    repeat: int
    variant: str
    status: str
    requests: str
    system_tps: float | None
    user_tps: float | None
    ttft_p50: str
    tpot_p50: str
    k: str
    acceptance: float | None
    accepted_length: float | None
    speedup: float | None
    bench_tps: float | None
    bench_agrees: bool | None
    server_agrees: bool | None
    degenerate: float | None


def _compare_row(variant: VariantResult, level: LevelResult, d: Comparison | None) -> CompareRow:
    client, server = level.client or ClientFigures(), level.server or ServerFigures()
    configured = level.configured_k if level.configured_k is not None else variant.k
    return CompareRow(
        concurrency=level.concurrency, repeat=level.repeat, variant=variant.name, status=level.status,
        requests=f"{client.ok}/{client.requests}", system_tps=client.output_tokens_per_s,
        user_tps=(client.per_user_tokens_per_s or NO_VALUES).p50,
        ttft_p50=_with_engine((client.ttft_ms or NO_VALUES).p50, server, "ttft_s"),
        tpot_p50=_with_engine((client.per_token_latency_ms or NO_VALUES).p50, server, "per_token_latency_s", 2),
        k=_k_cell(configured, server.effective_k), acceptance=server.acceptance_rate,
        accepted_length=server.mean_accepted_length, speedup=d.speedup if d else None,
        bench_tps=level.vllm_bench.output_tokens_per_s if level.vllm_bench else None,
        bench_agrees=level.vllm_bench_agreement.agrees if level.vllm_bench_agreement else None,
        server_agrees=level.consistency.ok if level.consistency else None,
        degenerate=client.content.degenerate_share if client.content else None)


def _k_cell(configured: int | None, effective: float | None) -> str:
    """Configured K, and in brackets the K that ran (draft tokens per drafting step); `-` without speculation."""
    if configured is None and effective is None:
        return "-"
    return f"{figure(configured, 0)} ({figure(effective, 2)})"


def _with_engine(client_ms: float | None, server: ServerFigures, hist: str, digits: int = 1) -> str:
    """Client percentile, and in brackets the engine's own mean (free of delivery delays)."""
    engine_s = server.histogram(hist).mean
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


def _compare_cells(row: CompareRow) -> list[str]:
    return [_cell(k, getattr(row, k)) for k, _ in COMPARE_COLUMNS]


def _batch_of(line: str) -> int:
    """The batch size a first-screen line starts with: `batch 32, spec-k4: ...` or `batch 32: best drafter ...`."""
    return int(re.match(r"batch (\d+)", line).group(1))  # type: ignore[union-attr]


def compare_table(results: SweepResults, concurrencies: list[int] | None = None) -> str:
    """Plain-text table for the terminal: the findings, a row per run (an open loop's levels where the
    sweep ran one, else the closed loop's at `concurrencies`, default all), the runs' problems and notes."""
    said = [lead] if (lead := sweep_summary.lead(results)) else []  # where the run is not a complete measurement
    if any(True for _ in rate_levels(results)):
        above, top = said, rate_headline(results) + slo_lines(results)  # no blank line under an open loop's lead
        grid = text_table(RATE_COLUMNS, rate_table_rows(results))
        runs = list(rate_levels(results))
    else:
        rows = compare_rows(results, concurrencies)
        above, top = [], said + [line for line in headline(results) if not concurrencies
                                 or not line.startswith("batch ") or _batch_of(line) in concurrencies]
        grid = text_table([title for _, title in COMPARE_COLUMNS], [_compare_cells(r) for r in rows],
                          [r.concurrency for r in rows], right_from=2)
        runs = [(v, lv) for v, lv in results.levels(Closed) if not concurrencies or lv.concurrency in concurrencies]
    notes = [f"note: {v.name} {lv.label} run {lv.repeat}: {n}" for v, lv in runs for n in lv.problems + lv.notes]
    return "\n".join([*above, *top, *([""] if top else []), *grid, *([""] if notes else []), *notes])


def text_table(header: list[str], body: list[list[str]], groups: list[Any] | None = None,
               right_from: int | None = None) -> list[str]:
    """A table for the terminal: each column as wide as its widest cell, right-aligned from column
    `right_from` on, and a blank line between rows where their `groups` (one per row) changes."""
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if right_from is not None and i >= right_from else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    lines = [line(header), "  ".join("-" * w for w in widths)]
    for i, cells in enumerate(body):
        if groups and i and groups[i] != groups[i - 1]:
            lines.append("")
        lines.append(line(cells))
    return lines


def _latency_rows(results: SweepResults) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "batch", "run", "TTFT p50/p95/p99 ms", "per-token p50/p95/p99 ms", "chunk gap p50/p99 ms",
              "tokens/chunk mean", "e2e p50/p99 ms", "req/s", "peak tok/s"]
    rows = []
    for variant, level in levels(results):
        c = level.client or ClientFigures()

        def trio(d: Distribution | None, ps: tuple[int, ...] = (50, 95, 99)) -> str:
            return " / ".join(figure((d or NO_VALUES).percentile(f"p{p}")) for p in ps)

        rows.append([variant.name, str(level.concurrency), str(level.repeat), trio(c.ttft_ms),
                     trio(c.per_token_latency_ms), trio(c.chunk_gap_ms, (50, 99)),
                     figure((c.tokens_per_chunk or NO_VALUES).mean, 2), trio(c.e2e_ms, (50, 99)),
                     figure(c.request_throughput, 2), figure(c.peak_output_tokens_per_s, 0)])
    return header, rows


def _spec_rows(results: SweepResults) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "batch", "run", "K", "per-token costs from", "acceptance rate alpha", "E(alpha,K)",
              "measured tokens/step L", "implied per-token a", "per-position acceptance", "step cost r",
              "break-even alpha*", "break-even a*", "pays (L > r)", "per-token speedup (engine)",
              "throughput speedup"]
    rows = []
    for d in derive(results):
        level = level_at(results, d.variant, d.concurrency, d.repeat)
        per_pos = level.server.per_position_acceptance if level and level.server else []
        costed = d.step_cost_ratio is not None

        def never(value: float | None) -> str:
            return "never" if costed and value is None else figure(value, 3)

        rows.append([d.variant, str(d.concurrency), str(d.repeat), str(d.k), d.per_token_source,
                     figure(d.acceptance_rate, 3), figure(d.expected_tokens_per_step, 2),
                     figure(d.mean_accepted_length, 2), figure(d.implied_per_token_acceptance, 3),
                     " ".join(f"{p:.2f}" for p in per_pos) or "-", figure(d.step_cost_ratio, 2),
                     never(d.break_even_acceptance_rate), never(d.break_even_per_token_acceptance),
                     "-" if not costed else ("yes" if d.pays else "no"),
                     figure(d.measured_speedup, 2), figure(d.speedup, 2)])
    return header, rows


def _content_rows(results: SweepResults) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "batch", "run", "client", "checked", "degenerate", "distinct 4-grams", "reference",
              "loop share", "acceptance (valid / degenerate)", "tok/s per request (valid / degenerate)"]
    rows = []
    for variant, level in levels(results):
        for client, summary in (("Locust", level.client.content if level.client else None),
                                ("vLLM bench", level.vllm_bench.content if level.vllm_bench else None)):
            if not summary or not summary.checked:
                continue
            ref = summary.reference
            rows.append([variant.name, str(level.concurrency), str(level.repeat), client,
                         str(summary.checked), f"{summary.degenerate} ({summary.degenerate_share:.0%})",
                         figure(summary.distinct_4, 2), f"{ref.distinct_4:.2f} ({ref.source})" if ref else "none",
                         figure(summary.loop_share, pct=True),
                         f"{figure(summary.acceptance_valid, pct=True)} / {figure(summary.acceptance_degenerate, pct=True)}",
                         f"{figure(summary.tokens_per_s_valid, 1)} / {figure(summary.tokens_per_s_degenerate, 1)}"])
    return header, rows


def _category_rows(rows: list[CategoryRow]) -> tuple[list[str], list[list[str]]]:
    header = ["batch", "category", "variant", "requests", "acceptance", "tok/s per request", "speedup", "not text"]
    return header, [[str(r.concurrency), r.category, r.variant, str(r.requests), figure(r.acceptance, pct=True),
                     figure(r.tokens_per_s, 1), interval_text(r.speedup), str(r.not_text)] for r in rows]


STEP_PHASES = [("schedule", "schedule"), ("forward", "target forward"), ("sample", "sample + verify"),
               ("propose", "propose (the drafter)"), ("bookkeeping", "bookkeeping"), ("update", "update"),
               ("sample_tokens_other", "runner glue"), ("other", "other"), ("post_step", "post-step")]


def _step_rows(results: SweepResults) -> tuple[list[str], list[list[str]]] | None:
    """Per run: milliseconds per engine step by phase (`plugins.step_profile`), and what a step
    cost beside the target's forward pass (the drafter's cost to the engine, the verification's
    extra tokens included)."""
    rows = []
    for variant, level in levels(results):
        ms = level.step_ms
        if not ms:
            continue
        total = (ms.get("step") or 0) + (ms.get("post_step") or 0)
        rows.append([variant.name, str(level.concurrency), str(level.repeat), f"{ms.get('steps', 0):.0f}",
                     figure(ms.get("step"), 2), *(figure(ms.get(key), 2) for key, _ in STEP_PHASES),
                     figure(total - (ms.get("forward") or 0) if total else None, 2)])
    if not rows:
        return None
    return ["variant", "batch", "run", "steps", "step ms", *(title for _, title in STEP_PHASES),
            "besides the forward"], rows


def _cost_rows(rows: list[CostRow]) -> tuple[list[str], list[list[str]]]:
    batches = sorted({c for r in rows for c in r.cost_per_million_tokens})
    return (["variant", "GPUs", "price per GPU-hour", "GPU-hours", *(f"per M tokens at batch {c}" for c in batches)],
            [[r.variant, str(r.gpus), figure(r.price_per_gpu_hour, 2), figure(r.gpu_hours, 2),
              *(figure(r.cost_per_million_tokens.get(c), 2) for c in batches)] for r in rows])


def _trust_rows(results: SweepResults) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "batch", "run", "status", "client tokens", "server tokens", "difference", "client tok/s",
              "server tok/s", "TTFT mean client/server ms", "e2e mean client/server ms", "per-token mean client/server ms",
              "problems and notes"]
    rows = []
    for variant, level in results.levels():
        c, s, k = level.client or ClientFigures(), level.server or ServerFigures(), level.consistency or Consistency()

        def pair(mine: Distribution | None, hist: str) -> str:
            theirs = s.histogram(hist).mean
            return f"{figure((mine or NO_VALUES).mean)} / {figure(theirs * 1000 if theirs is not None else None)}"

        diff = k.relative_error
        rows.append([variant.name, level.load.name, str(level.repeat), level.status,
                     figure(k.client_output_tokens, 0), figure(k.server_generation_tokens, 0),
                     "-" if diff is None else f"{100 * diff:.2f}%" + ("" if k.ok else " FLAG"),
                     figure(c.output_tokens_per_s), figure(s.output_tokens_per_s),
                     pair(c.ttft_ms, "ttft_s"), pair(c.e2e_ms, "e2e_s"),
                     pair(c.per_token_latency_ms, "per_token_latency_s"),
                     "; ".join(level.problems + level.notes) or "none"])
    return header, rows


def _slo_rows(results: SweepResults) -> tuple[list[str], list[list[str]]]:
    targets = slo.parse_targets(results.settings["slo"]) if results.settings.get("slo") else []
    header = ["variant", "batch", "run", *[f"{t.describe()}: value ms, nearest rank (share within)" for t in targets],
              "goodput tok/s", "tok/s", "all met"]
    rows = []
    for variant, level in levels(results):
        r = level.slo
        if not r:
            continue
        cells = []
        for t in targets:
            v = r.targets.get(t.name) or TargetFigures()
            share = v.share_within
            cells.append(f"{figure(v.value_ms)} ({'-' if share is None else f'{100 * share:.1f}%'})"
                         + ("" if v.met else " MISSED"))
        rows.append([variant.name, str(level.concurrency), str(level.repeat), *cells,
                     figure(r.goodput_tokens_per_s), figure(level.client.output_tokens_per_s if level.client else None),
                     "yes" if r.met else "no"])
    return header, rows


def _lag_rows(results: SweepResults) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "batch", "run", "send lag p50/p99 ms", "loop lag p50/p99/max ms", "loop stalls > 50 ms",
              "Locust CPU (cores)"]
    rows = []
    for variant, level in levels(results):
        lag = level.load_generator or GeneratorLag()
        send, loop = lag.send_lag_ms or NO_VALUES, lag.loop_lag_ms or NO_VALUES
        loc = level.locust or LocustRun()
        cpu = loc.cpu_s / loc.wall_s if loc.wall_s and loc.cpu_s is not None else None
        rows.append([variant.name, str(level.concurrency), str(level.repeat),
                     f"{figure(send.p50, 2)} / {figure(send.p99, 2)}",
                     f"{figure(loop.p50, 2)} / {figure(loop.p99, 2)} / {figure(loop.max, 1)}",
                     figure(loop.over_50ms, 0), figure(cpu, 2)])
    return header, rows


def _bench_rows(results: SweepResults) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "batch", "run", "output tok/s Locust / vLLM bench", "TTFT p50 ms Locust / vLLM bench",
              "per-token p50 ms Locust / vLLM bench", "TTFT, per-token request by request",
              "engine drift tok/s, TTFT, per-token", "difference, drift taken out", "agrees",
              "engine TTFT / per-token mean ms", "engine acceptance"]
    rows = []
    for variant, level in levels(results):
        a = level.vllm_bench_agreement
        if not a:
            error = level.vllm_bench.error if level.vllm_bench else None
            if error:
                rows.append([variant.name, str(level.concurrency), str(level.repeat), "-", "-", "-",
                             "-", "-", "-", error, "-", "-"])
            continue
        figs = (a.output_tokens_per_s, a.ttft_p50_ms, a.per_token_p50_ms)

        def pair(v: FigureAgreement | None, digits: int = 1) -> str:
            v = v or FigureAgreement()
            diff = "" if v.difference is None else f" ({100 * v.difference:+.1f}%)"
            return f"{figure(v.locust, digits)} / {figure(v.vllm_bench, digits)}{diff}"

        def pct(value: Callable[[FigureAgreement], float | None], of: tuple[FigureAgreement | None, ...] = figs) -> str:
            return ", ".join("-" if (x := value(f) if f else None) is None else f"{100 * x:+.1f}%" for f in of)

        server = level.server or ServerFigures()
        engine = " / ".join(figure(h.mean and 1000 * h.mean, 2)
                            for h in (server.histogram("ttft_s"), server.histogram("per_token_latency_s")))
        accept = " / ".join(figure(w.acceptance_rate if w else None, pct=True)
                            for w in (level.server, level.vllm_bench_server))
        off = [k for k, v in a.figures().items() if v.agrees is False]
        rows.append([variant.name, str(level.concurrency), str(level.repeat), pair(a.output_tokens_per_s),
                     pair(a.ttft_p50_ms), pair(a.per_token_p50_ms, 2),
                     pct(lambda v: v.matched_difference, figs[1:]),
                     pct(lambda v: v.engine_drift), pct(lambda v: v.difference_adjusted),
                     "yes" if a.agrees else ("NO: " + ", ".join(off) if a.agrees is False else "-"), engine,
                     accept])
    return header, rows


# ---------------------------------------------------------------------------------- documents
def _setup_details(results: SweepResults) -> str:
    """The run's settings in full (the first screen's setup paragraph is the short form)."""
    s = results.settings
    per_rate = {lv.rate: lv.requests for _, lv in rate_levels(results) if lv.requests}
    per_level = {lv.concurrency: lv.requests for _, lv in results.levels(Closed) if lv.requests}
    counts = ([f"{n} at {r:g}/s" for r, n in sorted(per_rate.items())]
              + [f"{n} at batch {c}" for c, n in sorted(per_level.items())])
    # A closed loop run for a length of time has no request count.
    load = (f"{s.get('duration_s')} s a run" if s.get("duration_s") and not counts
            else "measured requests per run: " + ", ".join(counts))
    load += f", {s.get('repeat', 1)} run(s) of each"
    if s.get("vllm_bench"):
        load += ", each followed by vLLM's serving benchmark on the same server (same prompts, length and concurrency)"
    m = results.machine or {}
    intro = (f"Config `{results.config}`, status **{results.status}**. Workload `{s.get('workload')}`, "
             f"{s.get('max_tokens')} output tokens per request"
             f"{' (fixed: ignore_eos)' if s.get('fixed_length') else _free_lengths(results)}, "
             f"temperature {s.get('temperature')}, "
             + sweep_summary.loop_text(s, full=True)
             + f", {load}, {s.get('warmup')} warm-up request(s) per user "
             f"excluded, Locust workers: {s.get('workers') or 'none (one process)'}. "
             f"Machine: {m.get('cpus')} CPUs, vLLM {m.get('vllm')}, Locust {m.get('locust')}.")
    plan = results.plan
    if plan and plan.get("order"):
        intro += (f" Order: {plan['order']} ({plan.get('why')}); {plan.get('server_starts')} server start(s)"
                  + (f", estimated {plan['estimated_s'] / 60:.0f} min beforehand." if plan.get("estimated_s") else "."))
    return intro


def _finding_sections(results: SweepResults, out: Path | None) -> list[Section]:
    """Every finding in full, then the run-by-run tables of the closed loop and of the open loop."""
    cmp_rows = compare_rows(results)
    compare = ([t for _, t in COMPARE_COLUMNS], [_compare_cells(r) for r in cmp_rows])
    lines = headline(results) + rate_headline(results)
    out_sections: list[Section] = []
    if lines:
        out_sections.append(Section("findings", "Every finding in full",
                                    "\n".join(f"- {line}" for line in lines)))
    if cmp_rows:
        out_sections.append(Section("batch-comparison", "Batch comparison: every run",
                                    "Per run: throughput, latency (the engine's means in brackets), K, acceptance, "
                                    "speedup over the baseline's run of the same repeat, and whether the second "
                                    "opinion and the server's counters agree." + how("batch-comparison", out)
                                    + table(compare)))
    categories = by_category(results)
    if categories:
        out_sections.append(Section("by-category", "By category: acceptance and speedup per prompt category",
                                    "Per batch size, category and variant, over the repeats: requests, acceptance "
                                    "over the category's requests (the server's per-request figures), mean "
                                    "per-request output tokens/s, and its ratio to the baseline's same category in "
                                    "the same repeat." + how("by-category", out) + table(_category_rows(categories))))
    rate_rows = rate_table_rows(results)
    if rate_rows:
        out_sections.append(Section("open-loop", "Open loop: each variant at each arrival rate",
                                    "Per run: the rate asked and achieved, how requests ended, latencies, "
                                    "speedups at the same arrivals, vLLM's benchmark beside."
                                    + how("open-loop-table", out) + table((RATE_COLUMNS, rate_rows))))
    return out_sections


def _table_sections(results: SweepResults, out: Path | None) -> list[Section]:
    """The evidence every sweep has: content, second opinion, latency, speculation, targets, lag, trust, setup."""
    s = results.settings
    problems = results.problems
    variants = [[v.name, v.label, v.status, v.url or " / ".join(figure(t, 0) for t in v.startup_s) or "-",
                 json.dumps(v.speculative_config) if v.speculative_config else "off",
                 v.error or ""] for v in results.variants]
    return [
        Section("content", "Content: is the output text?",
                "Per run and client: degenerate requests, distinct 4-grams against the reference, and acceptance "
                "and speed over the content-valid requests alone." + how("the-content-check", out)
                + table(_content_rows(results))),
        Section("second-opinion", "Second opinion: Locust against vLLM's serving benchmark",
                "The same prompts, length, temperature and concurrency through vLLM's own benchmark right after "
                "each Locust run; differences judged with the engine's drift taken out." + how("second-opinion", out)
                + "".join(f"\n\n- {second_opinion.describe_systematic(e)}" for e in second_opinion.systematic_by_level(results))
                + table(_bench_rows(results))),
        Section("latency", "Latency", "TTFT, per-token latency, chunk gaps and end-to-end latency per run."
                + how("latency-and-chunks", out) + table(_latency_rows(results))),
        Section("speculation", "Speculation: acceptance, expected tokens and break-even",
                "Acceptance, tokens per step against the model E(alpha, K), the step cost r and the break-even "
                "acceptance per run." + how("the-cost-model", out) + table(_spec_rows(results))),
        *([Section("steps", "Where an engine step's time goes",
                   "Per run: milliseconds per engine step in each phase, from timers around vLLM's step phases "
                   "(`plugins/step_profile.py`); besides the forward = step + post-step - target forward, what "
                   "drafting and verifying cost the engine beyond the forward pass." + how("where-a-step-goes", out)
                   + table(steps))] if (steps := _step_rows(results)) else []),
        *([Section("cost", "Cost: GPU-hours and cost per million output tokens",
                   "Per variant whose config names `resources.price_per_gpu_hour`: the GPUs its server used, the "
                   "GPU-hours this sweep took on them (starts and measured runs), and at each batch size the price "
                   "of a million output tokens at the throughput measured there (mean over the repeats)."
                   + table(_cost_rows(priced)))] if (priced := costs(results)) else []),
        Section("slo", "Service targets", "Per run: each target's percentile with the share of requests within "
                "its bound, and the goodput." + how("service-targets-slo---slo", out) + table(_slo_rows(results))),
        Section("lag", "The load generator's own lag", "Send lag, the event loop's stalls and Locust's CPU per run."
                + how("the-load-generators-own-lag", out) + table(_lag_rows(results))),
        Section("trust", "Trust: client numbers against the server's counters",
                f"Client output tokens against `vllm:generation_tokens_total` over the same run (flagged beyond "
                f"{100 * s.get('tolerance', 0.05):.0f}%), the server's means beside the client's, and every run's "
                "problems and notes." + how("can-the-figures-be-trusted", out) + table(_trust_rows(results))),
        Section("variants", "Variants and setup", _setup_details(results)
                + ("\n\nProblems:\n\n" + "\n".join(f"- {p}" for p in problems) if problems else "")
                + table((["variant", "label", "status", "start-up s or address", "speculative_config", "error"],
                         variants))),
    ]


def _file_sections(results: SweepResults, plots: list[Path], sources: Mapping[str, str]) -> list[Section]:
    """The plots other than the first screen's, and Locust's own reports."""
    out_sections: list[Section] = []
    others = [p for p in plots if p.name != ANSWER]
    if others:
        out_sections.append(Section("plots", "Plots: throughput, latency, acceptance" + (", rates" if any(
            p.name == "rates.png" for p in others) else ""), "\n\n".join(
            f"![{p.stem}]({sources.get(p.name, p.name)})" for p in others)))
    links = [(f"{variant.name} {level.label}", level.locust.html) for variant, level in results.levels()
             if level.locust]
    if links:
        out_sections.append(Section("locust", "Locust's own reports",
                                    "\n".join(f"- [{n}]({h}) (CSV beside it)" for n, h in links)))
    return out_sections


def first_page(results: SweepResults, plots: list[Path], sources: Mapping[str, str] | None = None,
               out: Path | None = None) -> Page:
    """The report as a `loadtest.reports.page.Page`: verdicts, the speedup picture and the setup first;
    below them the evidence, each section a caption, its method's link and its table."""
    sources = sources or {}
    answer = ANSWER if any(p.name == ANSWER for p in plots) else None
    return Page(title=f"Load test: {results.config}", lead=sweep_summary.lead(results),
                lines=sweep_summary.verdict_lines(results), notes=sweep_summary.notes(results),
                picture=answer, picture_alt="Speedup of speculation over the baseline, 95% intervals",
                setup=sweep_summary.setup(results, method_link("reading-the-report", out)),
                badges=sweep_summary.badges(results), sections=[
                    *_finding_sections(results, out), *_table_sections(results, out),
                    *_file_sections(results, plots, sources)])


def _free_lengths(results: SweepResults) -> str:
    """Without a fixed length: how long the outputs came out (each request ended at the model's end
    of text or at max_tokens)."""
    lengths = [lv.client.output_tokens_per_request for _, lv in [*levels(results), *rate_levels(results)] if lv.client]
    lengths = [d for d in lengths if d and d.n]
    if not lengths:
        return " at most (not fixed: each ends at the model's end of text)"
    return (f" at most (not fixed: each ends at the model's end of text; output lengths p50 "
            f"{statistics.median(d.p50 for d in lengths):.0f}, from {min(d.min for d in lengths):.0f} to "
            f"{max(d.max for d in lengths):.0f})")


def report_markdown(results: SweepResults, plots: list[Path], sources: Mapping[str, str] | None = None,
                    out: Path | None = None) -> str:
    """report.md: the first screen (verdicts, picture, setup, badges), then the evidence. `sources`
    maps a plot's file name to the address its image link gives (default: the PNG beside report.md)."""
    return page.markdown(first_page(results, plots, sources, out), sources)


def embedded(plots: list[Path]) -> dict[str, str]:
    """Plots as data URIs: the page can be mailed or attached alone."""
    return {p.name: "data:image/png;base64," + base64.b64encode(p.read_bytes()).decode() for p in plots}


def write_report(results: SweepResults, out: Path) -> dict[str, Path]:
    """results.json (with derived comparisons), report.md, report.html and the PNG plots, each
    written atomically (loadtest.files)."""
    out.mkdir(parents=True, exist_ok=True)
    # A copy: the sweep's own results (what Sweep.save keeps) stay as measured.
    results = dataclasses.replace(results, comparisons=derive(results))
    results.rate_comparisons = derive_rates(results) or results.rate_comparisons
    write_json(out / "results.json", results.to_json())
    plots = plot(results, out)
    sources = embedded(plots)
    return {"json": out / "results.json",
            "markdown": write_atomic(out / "report.md", report_markdown(results, plots, out=out)),
            "html": write_atomic(out / "report.html", page.html(first_page(results, plots, sources, out), sources)),
            **{p.stem: p for p in plots}}


FOLDER_TIME = re.compile(r"(\d{8}-\d{6})$")  # default_out_dir's suffix, local time


def created_at(created: Any, folder: Path) -> float | None:
    """When a sweep was created (seconds since the epoch): its results' `created`, else the time in
    its folder's name; None when neither says."""
    match = FOLDER_TIME.search(folder.name)
    for text, form in ((created, CREATED_FORMAT), (match and match.group(1), "%Y%m%d-%H%M%S")):
        if isinstance(text, str):
            try:
                return datetime.strptime(text, form).timestamp()
            except ValueError:
                pass
    return None


def newest_report(root: Path = Path("reports")) -> Path | None:
    """The report folder under `root` whose sweep was created last, by the time its results.json
    records (a folder's modification time moves when it is copied or its report re-rendered);
    folders that say no time come last, by name. Files that are not JSON are skipped."""
    found = []
    for path in root.glob("*/results.json"):
        # Raw JSON, not `SweepResults.load`: only `created` is read, and other JSON still counts (by name).
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        when = created_at(data.get("created") if isinstance(data, dict) else None, path.parent)
        found.append((when is not None, when or 0.0, path.parent.name, path.parent))
    return max(found)[-1] if found else None
