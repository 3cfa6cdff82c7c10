"""capacity.json into what people read: capacity.md and report.html (plots embedded), and the PNG
plots: the Pareto view (latency against throughput) and the speedup against arrival rate."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.measurement import capacity_figures as cap
from loadtest.measurement import content
from loadtest.measurement.derive import verdict_rule
from loadtest.measurement.capacity_figures import MemoryPeaks, SearchRequest
from loadtest.measurement.figures import ContentSummary, FigureAgreement, Interval
from loadtest.measurement.records import OUTCOMES
from loadtest.measurement.results import CapacityLevel, CapacityResults, LevelResult
from loadtest.reports import markdown
from loadtest.reports import page
from loadtest.reports import plots
from loadtest.measurement import slo
from loadtest.measurement import stats
from loadtest.reports import sweep_summary
from loadtest.files import write_atomic
from loadtest.reports.markdown import figure
from loadtest.reports.page import Badge, Line, Page, Section, how, method_link, table
from loadtest.reports.report import embedded
from loadtest.reports.sweep_plots import error_bars

PARETO = "pareto.png"
SPEEDUP = "capacity-speedup.png"
PARETO_FIGURES = ((cap.ttft_p95, "TTFT p95", "ttft_p95"), (cap.tpot_p50, "per-token latency p50", "tpot_p50"),
                  (cap.tpot_p95, "per-token latency p95", "tpot_p95"))
"""(the latency, its title, the service target on it)."""


def _tokens_per_s(level: LevelResult) -> float | None:
    return level.client.output_tokens_per_s if level.client else None


# ---------------------------------------------------------------------------------- plots
def plot(result: CapacityResults, out: Path) -> list[Path]:
    """The Pareto view and the speedup plot; only those with data are written."""
    written = []
    levels = [lv for lv in result.levels if lv.phase in ("search", "scan", "second opinion") and lv.ok_client]
    if levels:
        bounds = {t.name: 1000 * t.bound_s for t in slo.parse_targets(result.slo)}
        written.append(plots.save(_pareto_figure(result, levels, bounds), out / PARETO, dpi=110))
    points = rate_speedups(result)
    if points:
        written.append(plots.save(_speedup_figure(result, points), out / SPEEDUP))
    return written


def _pareto_figure(result: CapacityResults, levels: list[CapacityLevel], bounds: dict[str, float]) -> Any:
    """Each `PARETO_FIGURES` latency against throughput, one point per run (filled: it met every
    target), and the target's bound (`bounds`: ms by target name)."""
    fig, axes = plots.pyplot().subplots(1, 3, figsize=(15, 4.5))
    for j, variant in enumerate(result.variants):
        mine = sorted((lv for lv in levels if lv.variant == variant), key=lambda lv: _tokens_per_s(lv) or 0)
        if not mine:
            continue
        for ax, (latency, _, _) in zip(axes, PARETO_FIGURES):
            pts = [(_tokens_per_s(lv), latency(lv), lv.meets_targets) for lv in mine]
            pts = [p for p in pts if p[0] is not None and p[1] is not None]
            if not pts:
                continue
            ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], "-", color=f"C{j}", alpha=0.5)
            ax.scatter([x for x, _, ok in pts if ok], [y for _, y, ok in pts if ok], color=f"C{j}",
                       label=f"{variant}: meets targets")
            ax.scatter([x for x, _, ok in pts if not ok], [y for _, y, ok in pts if not ok], facecolors="none",
                       edgecolors=f"C{j}", label=f"{variant}: misses them")
    for ax, (_, title, target) in zip(axes, PARETO_FIGURES):
        bound = bounds.get(target)
        if bound is not None:
            ax.axhline(bound, color="red", lw=1, ls="--", label=f"target {bound:g} ms")
        ax.set_yscale("log")
        _plain_ticks(ax.yaxis)
        ax.set_xlabel("output tokens/s (achieved)")
        ax.set_ylabel(f"{title}, ms")
        ax.set_title(f"{title} against throughput")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Latency against throughput, one point per run (filled: met every target)")
    fig.tight_layout()
    return fig


def _speedup_figure(result: CapacityResults, points: list[RatePairs]) -> Any:
    """The speedup a user sees against the arrival rate (`rate_speedups`), with the crossover and
    each variant's capacity marked."""
    fig, ax = plots.speedup_axes()
    for e2e, style, lw, label in ((False, "o-", 2, "per token (TPOT p50)"), (True, "d--", 1, "end to end (mean)")):
        pts = [(p.rate, p.e2e_speedup if e2e else p.speedup) for p in points]
        pts = [(r, m) for r, m in pts if m.mean is not None]
        if not pts:
            continue
        ax.errorbar([r for r, _ in pts], [m.mean for _, m in pts], yerr=error_bars([m for _, m in pts]), fmt=style,
                    capsize=4, lw=lw, label=label)
    cross = result.crossover
    if cross and cross.rate:
        ax.axvline(cross.rate, color="red", ls=":", lw=1.5, label=f"crossover {cross.rate:.3g} req/s ({cross.kind})")
    for j, (variant, c) in enumerate(cap.effective_capacity(result).items()):
        if c.capacity is not None:
            ax.axvline(c.capacity, color=("C2", "C4", "C5")[j % 3], ls="--", lw=1,
                       label=f"{variant} capacity {c.capacity:g}" + (" (revised)" if c.status == "revised" else ""))
    ax.set_xscale("log")
    _plain_ticks(ax.xaxis)
    low, high = ax.get_ylim()
    ax.set_ylim(min(low, 0.8), max(high, 1.2))
    ax.set_xlabel("arrival rate, req/s (Poisson)", fontsize=11)
    ax.set_ylabel("speedup (x the baseline)", fontsize=11)
    intervals = any(m.low is not None for p in points for m in (p.speedup, p.e2e_speedup))
    ax.set_title("Speedup a user sees, same arrivals " + ("(95% intervals)" if intervals else "(no repeats: no "
                                                                                               "interval)"),
                 fontsize=12)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _plain_ticks(axis: Any) -> None:
    """A log axis labelled 0.5, 1, 2 instead of 5x10^-1."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    # Minor ticks sit at 2..9 x each power of ten: label 2-5 (0.5, 3, 4...), the rest would crowd.
    axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "2345" else ""))


# ---------------------------------------------------------------------------------- tables
def _capacity_rows(result: CapacityResults) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "capacity req/s", "highest passing", "lowest failing", "search ended", "rates asked",
              "runs (rate: met? per run)"]
    rows = []
    for variant, c in result.capacity.items():
        lo, hi = c.interval
        runs = "; ".join(f"{rate}: {' '.join('yes' if r else 'no' for r in v)}" for rate, v in c.runs.items())
        rows.append([variant, cap.capacity_text(c), cap.rate_text(lo), cap.rate_text(hi),
                     c.status + (f" ({c.stopped})" if c.stopped else ""), str(c.steps), runs])
    return header, rows


def _speedup_rows(result: CapacityResults) -> tuple[list[str], list[list[str]]]:
    header = ["rate req/s", "pairs", "per-token p50 speedup", "end-to-end mean speedup"]
    return header, [[f"{p.rate:g}", str(p.pairs), markdown.speedup(p.speedup), markdown.speedup(p.e2e_speedup)] for p in result.speedups or []]


LEVEL_HEADER = ["#", "variant", "phase", "rate asked", "run", "achieved req/s", "behind",
                "served / refused / timed out / failed / unsent", "TTFT p95 ms", "per-token p50 ms",
                "per-token p95 ms", "e2e mean ms", "output tok/s", "acceptance", "meets targets", "why"]


def _level_rows(result: CapacityResults) -> tuple[list[str], list[list[str]]]:
    rows = []
    for lv in result.levels:
        ol = lv.open_loop
        outcomes = ol.outcomes if ol else {}
        rows.append(["" if lv.sequence is None else str(lv.sequence), lv.variant, lv.phase, f"{lv.rate:g}",
                     str(lv.repeat), figure(ol.achieved_rate if ol else None, 3),
                     "-" if ol is None else ("YES" if ol.behind else "no"),
                     " / ".join(figure(outcomes.get(k), 0) for k in OUTCOMES),
                     figure(cap.ttft_p95(lv)), figure(cap.tpot_p50(lv), 2), figure(cap.tpot_p95(lv), 2),
                     figure(cap.e2e_mean(lv)), figure(_tokens_per_s(lv)), figure(_acceptance(lv), pct=True),
                     "yes" if lv.meets_targets else "no", lv.why])
    return LEVEL_HEADER, rows


SECOND_OPINION_FIGURES = (("output_tokens_per_s", "tok/s"), ("ttft_p50_ms", "TTFT p50 ms"),
                          ("per_token_p50_ms", "per-token p50 ms"))


def _second_opinion_rows(result: CapacityResults) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "rate req/s", "share of capacity"]
    for _, name in SECOND_OPINION_FIGURES:
        header += [f"{name} Locust / vLLM bench", "agrees"]
    header.append("agrees overall")
    rows = []
    for r in result.second_opinion:
        row = [r.variant, f"{r.rate:g}", f"{100 * r.share:.0f}%"]
        for key, _ in SECOND_OPINION_FIGURES:
            f = r.figures.get(key) or FigureAgreement()
            row += [f"{figure(f.locust, 2)} / {figure(f.vllm_bench, 2)}{_diff(f)}", _yes(f.agrees)]
        row.append(_yes(r.agrees) + (f": {r.error}" if r.error else ""))
        rows.append(row)
    return header, rows


def _diff(f: FigureAgreement, form: str = " ({})") -> str:
    return form.format(f"{100 * f.difference:+.1f}%") if f.difference is not None else ""


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def _overload_rows(result: CapacityResults) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "rate req/s", "seconds", "achieved req/s", "sent", "served", "refused", "timed out", "failed",
              "unsent", "all accounted for", "server up after", "peak RSS MiB: this process / Locust (all) / largest "
              "Locust process", "problems"]
    rows = []
    for variant, o in result.overload.items():
        if o.skipped is not None:
            rows.append([variant, *["-"] * 12, f"skipped: {o.skipped}"])
            continue
        m = o.memory or MemoryPeaks()
        rows.append([variant, f"{o.rate:g}", f"{o.duration_s:g}", figure(o.achieved_rate, 3), figure(o.sent, 0),
                     *(figure((o.outcomes or {}).get(k), 0) for k in OUTCOMES),
                     "yes" if o.accounted else "NO", "yes" if o.server_up_after else "NO",
                     f"{figure(m.self_peak_mib, 0)} / {figure(m.locust_peak_mib, 0)} / "
                     f"{figure(m.locust_process_peak_mib, 0)}", "; ".join(o.problems or []) or "none"])
    return header, rows


# ---------------------------------------------------------------------------------- first screen
@dataclass(frozen=True)
class RatePairs:
    """Speculation against the baseline at one rate, over its pairs (`rate_speedups`): the speedups'
    means and 95% intervals, speculation's mean acceptance and outputs, whether every run of each
    variant met the targets."""

    rate: float
    pairs: int
    speedup: Interval
    e2e_speedup: Interval
    acceptance: float | None
    spec_met: bool
    base_met: bool
    content: ContentSummary | None


def rate_speedups(result: CapacityResults) -> list[RatePairs]:
    """Per rate measured on both variants, its pairs as one `RatePairs`."""
    return [RatePairs(rate=rate, pairs=len(pairs), speedup=stats.mean_interval(cap.speedups(pairs, cap.tpot_p50)),
                      e2e_speedup=stats.mean_interval(cap.speedups(pairs, cap.e2e_mean)),
                      acceptance=cap.mean([a for s, _ in pairs if (a := _acceptance(s)) is not None]),
                      spec_met=all(s.meets_targets for s, _ in pairs), base_met=all(b.meets_targets for _, b in pairs),
                      content=content.merge([s.client.content if s.client else None for s, _ in pairs]))
            for rate, pairs in cap.pairs_by_rate(result.levels, result.spec_variant or "").items()]


def _acceptance(level: LevelResult) -> float | None:
    return level.server.acceptance_rate if level.server else None


def _met_words(row: RatePairs) -> str:
    return {(True, True): "both meet the targets", (True, False): "only speculation meets the targets",
            (False, True): "only the baseline meets the targets", (False, False): "neither meets the targets"}[
        (row.spec_met, row.base_met)]


def _lines(result: CapacityResults) -> list[Line]:
    caps = cap.effective_capacity(result)
    spec = result.spec_variant
    base, mine = caps.get(cap.BASELINE), caps.get(spec) if spec else None
    lines = []
    if base is not None and mine is not None:
        a, b = base.capacity, mine.capacity
        if a is not None and b is not None and a > 0:
            change = (b - a) / a
            word = ("raises capacity" if b > a else "lowers capacity" if b < a else "leaves capacity unchanged")
            tone = "good" if b > a else "bad" if b < a else "even"
            lines.append(Line("capacity", f"speculation {word}" + (f" {100 * change:+.0f}%" if b != a else ""),
                              f"baseline {cap.capacity_text(base)} → speculation {cap.capacity_text(mine)} req/s "
                              f"at {cap.describe_targets(result.slo)}"
                              + "".join(" (revised)" for c in (base, mine) if c.status == "revised"), tone))
        else:
            lines.append(Line("capacity", "no capacity to compare",
                              f"baseline {cap.capacity_text(base)}; speculation {cap.capacity_text(mine)} req/s"))
    else:
        only = mine or base
        lines.append(Line("capacity", "no comparison", (f"{'speculation' if only is mine else 'the baseline'}: "
                                                         f"{cap.capacity_text(only)} req/s; the other variant was "
                                                         "not measured") if only else "nothing measured"))
    for row in rate_speedups(result):
        m = row.speedup
        if m.mean is None:
            continue
        word, tone = sweep_summary.verdict_word(verdict_rule(m), row.content)
        spread = f" (95% {m.low:.2f}-{m.high:.2f})" if m.low is not None else ""
        figures = [f"{m.mean:.2f}x per token{spread}"]
        if row.e2e_speedup.mean is not None:
            figures.append(f"{row.e2e_speedup.mean:.2f}x end to end")
        if row.acceptance is not None:
            figures.append(f"acceptance {row.acceptance:.0%}")
        figures += [_met_words(row), f"{row.pairs} pair{'s' if row.pairs != 1 else ''}"]
        lines.append(Line(f"{row.rate:g} req/s", word, " · ".join(figures), tone))
    return lines


def lead(result: CapacityResults) -> str:
    runs = len([lv for lv in result.levels if lv.ok_client])
    missing = [v for v in result.variants if v not in cap.measured_variants(result)]
    tail = (f"; not measured: {', '.join(missing)}: no comparison" if missing else "") + "."
    if result.status == "interrupted":
        return f"Interrupted after {runs} run{'s' if runs != 1 else ''}" + tail
    stopped = [v for v, c in result.capacity.items() if c.status == "stopped"]
    if stopped:
        return f"Incomplete: the search of {', '.join(stopped)} stopped ({result.capacity[stopped[0]].stopped})" + tail
    if missing:
        return "Incomplete" + tail
    return ""


def badges(result: CapacityResults) -> list[Badge]:
    out = [Badge(label, line.replace(f": {label}:", ":")[:90], "levels") for line in cap.variant_content_warnings(result)
           for label in ["NOISE" if ": NOISE:" in line else "CONTENT"]]
    for v, c in cap.effective_capacity(result).items():
        if c.status == "revised" and c.missed:
            out.append(Badge("REVISED", f"{v}: capacity {cap.rate_text(c.was)} → {cap.capacity_text(c)} req/s: "
                             f"a run at {c.missed[0].rate:g} req/s missed", "levels"))
    off: dict[str, list[str]] = {}  # a figure the benchmark disagrees on: where
    for r in result.second_opinion:
        where = f"{r.rate:g} req/s {r.variant}"
        for key, name in SECOND_OPINION_FIGURES:
            f = r.figures.get(key) or FigureAgreement()
            if f.agrees is False:
                off.setdefault(name, []).append(where + _diff(f, " {}"))
        if r.error:
            out.append(Badge("FLAG", f"{where}: vLLM bench failed", "second-opinion"))
    for name, wheres in off.items():
        out.append(Badge("FLAG", f"vLLM bench {name} differs from Locust: " + (
            wheres[0] if len(wheres) == 1 else f"{len(wheres)} runs ({wheres[0]}, ...)"), "second-opinion"))
    for v, o in result.overload.items():
        for problem in o.problems or []:
            out.append(Badge("OVERLOAD", f"{v}: {problem}"[:90], "overload"))
    behind = [lv for lv in result.levels if lv.open_loop and lv.open_loop.behind]
    if behind:
        out.append(Badge("BEHIND", f"{len(behind)} run{'s' if len(behind) != 1 else ''}: the load generator fell "
                         "behind its schedule", "levels"))
    untrusted = [lv for lv in result.levels if _untrusted(lv)]
    if untrusted:
        out.append(Badge("UNTRUSTED", f"{len(untrusted)} run(s): client tokens vs server counter", "levels"))
    out += [Badge("PROBLEM", p[:90], "settings") for p in result.problems
            if not p.startswith("interrupted")]
    return out


def _untrusted(level: LevelResult) -> bool:
    """The client's token count disagrees with the server's counter."""
    return level.consistency is not None and not level.consistency.ok


def setup(result: CapacityResults, method: str) -> str:
    s, req, m = result.settings, result.request or SearchRequest(), result.machine or {}
    machine = (f" Machine: {m.get('cpus')} CPUs, vLLM {m.get('vllm')}" + (f", commit {m['commit']}" if m.get("commit")
                                                                          else "") + ".") if m else ""
    return (f"**Setup.** Config `{result.config or ''}`: speculation (`{result.spec_variant}`) against "
            f"the baseline at the same Poisson arrivals, targets {cap.describe_targets(result.slo)}. Workload "
            f"`{req.workload}`, {req.max_tokens} output tokens, temperature {req.temperature}; "
            f"search from {s.start_rate} req/s, at most {s.max_steps} rates a variant, each boundary "
            f"rate {s.repeat} times.{machine} Status **{result.status}**. Method: {method}.")


# ---------------------------------------------------------------------------------- documents
def _run_text(result: CapacityResults) -> str:
    s = result.settings
    run_text = (f"Status **{result.status}**. Open-loop Poisson arrivals; a rate passes when every run at it "
                f"meets every target, with the load generator on schedule and every request served. Search from "
                f"{s.start_rate} req/s" + (f", at most {s.max_rate} req/s" if s.max_rate else "")
                + f", doubling or halving to a bracket, then bisection to within {100 * (s.precision or 0):.0f}% "
                f"(at most {s.max_steps} rates a variant); each boundary rate measured {s.repeat} "
                f"times; both variants measured at every rate visited, with the same arrivals.")
    scan = result.scan
    if scan:
        run_text += (" Then a scan above the search's rates while speculation still paid: "
                     + (", ".join(f"{r:g}" for r in scan.rates) + " req/s" if scan.rates else "no rate")
                     + f" (ended: {scan.ended}).")
    if result.request:
        run_text += " Requests: " + ", ".join(f"{k} {v}" for k, v in result.request.to_json().items()) + "."
    problems = result.problems
    return run_text + ("\n\nProblems:\n\n" + "\n".join(f"- {p}" for p in problems) if problems else "")


def first_page(result: CapacityResults, plots: list[Path], sources: Mapping[str, str] | None = None,
               out: Path | None = None) -> Page:
    sources = sources or {}
    sections = [
        Section("findings", "Every finding in full", "\n".join(f"- {line}" for line in [*(result.traffic or []),
                                                                                      *cap.headline(result)])),
        Section("capacity", "Capacity by variant", "The highest rate at which every run met every target, below "
                "the lowest at which one did not." + how("capacity-at-a-service-target-make-capacity", out)
                + table(_capacity_rows(result))),
        Section("speedup", "Speedup by rate", "Speculation against the baseline at the same arrivals, per rate."
                + how("capacity-at-a-service-target-make-capacity", out) + table(_speedup_rows(result))),
        Section("levels", "Every level measured", "In the order measured; behind: the load asked was not the load "
                "served." + table(_level_rows(result))),
        Section("second-opinion", "Second opinion: Locust against vLLM's benchmark",
                "Below the smaller capacity, vLLM's serving benchmark beside Locust on the same server and arrivals."
                + how("second-opinion", out) + table(_second_opinion_rows(result))),
        Section("overload", "Overload", "Each variant at twice its capacity: the server must survive and every "
                "request end." + table(_overload_rows(result))),
    ]
    others = [p for p in plots if p.name != SPEEDUP]
    if others:
        sections.append(Section("plots", "Latency against throughput (Pareto)",
                                "\n\n".join(f"![{p.stem}]({sources.get(p.name, p.name)})" for p in others)))
    sections.append(Section("settings", "How the search ran", _run_text(result)))
    notes = [cap.headline(result)[-1]]  # the crossover
    return Page(title=f"Capacity at a service target: {result.config or ''}", lead=lead(result),
                lines=_lines(result), notes=notes, compact_from=1,
                picture=SPEEDUP if any(p.name == SPEEDUP for p in plots) else None,
                picture_alt="Speedup of speculation against the arrival rate", badges=badges(result),
                setup=setup(result, method_link("capacity-at-a-service-target-make-capacity", out)), sections=sections)


def exit_code(result: CapacityResults) -> int:
    """0: every rate the search asked for measured (flags in the report); 3: a search stopped (a
    server died) or a level could not run; 4: a run's token count disagrees with the server's;
    130: interrupted. The codes of `loadtest.reports.sweep_summary`."""
    if result.status == "interrupted":
        return sweep_summary.INTERRUPTED
    if not cap.measured_variants(result):
        return sweep_summary.USAGE
    if result.status == "failed" or any(lv.status in ("failed", "skipped") for lv in result.levels):
        return sweep_summary.INCOMPLETE
    if any(_untrusted(lv) for lv in result.levels):
        return sweep_summary.UNTRUSTED
    return sweep_summary.OK


def write(result: CapacityResults, out: Path) -> dict[str, Path]:
    """capacity.md, report.html (self-contained: plots as data URIs) and the plots."""
    out.mkdir(parents=True, exist_ok=True)
    plots = plot(result, out)
    md = write_atomic(out / "capacity.md", page.markdown(first_page(result, plots, out=out)))
    sources = embedded(plots)
    html_page = write_atomic(out / "report.html", page.html(first_page(result, plots, sources, out), sources))
    return {"markdown": md, "html": html_page, **{p.stem: p for p in plots}}
