"""capacity.json into what people read: capacity.md and report.html (plots embedded), and the PNG
plots: the Pareto view (latency against throughput) and the speedup against arrival rate."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loadtest import capacity as cap
from loadtest import slo
from loadtest.files import write_atomic
from loadtest.report import HTML_STYLE, _fmt, _md_table, render_html

PARETO = "pareto.png"
SPEEDUP = "capacity-speedup.png"
PARETO_FIGURES = (("ttft_ms", "p95", "TTFT p95"), ("per_token_latency_ms", "p50", "per-token latency p50"),
                  ("per_token_latency_ms", "p95", "per-token latency p95"))
TARGET_OF = {("ttft_ms", "p95"): "ttft_p95", ("per_token_latency_ms", "p50"): "tpot_p50",
             ("per_token_latency_ms", "p95"): "tpot_p95"}


def _client(level: dict[str, Any], key: str, stat: str) -> float | None:
    return ((level.get("client") or {}).get(key) or {}).get(stat)


def _measured(result: dict[str, Any], phases: tuple[str, ...] = ("search", "scan", "second opinion")
              ) -> list[dict[str, Any]]:
    return [lv for lv in result.get("levels", []) if lv.get("phase") in phases and (lv.get("client") or {}).get("ok")]


# ---------------------------------------------------------------------------------- plots
def plot(result: dict[str, Any], out: Path) -> list[Path]:
    """The Pareto view and the speedup plot; only those with data are written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    levels = _measured(result)
    bounds = {t.name: 1000 * t.bound_s for t in slo.parse_targets(result["slo"])}
    if levels:
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
        for j, variant in enumerate(result["variants"]):
            mine = sorted((lv for lv in levels if lv["variant"] == variant),
                          key=lambda lv: lv["client"].get("output_tokens_per_s") or 0)
            if not mine:
                continue
            for ax, (key, stat, title) in zip(axes, PARETO_FIGURES):
                pts = [(lv["client"].get("output_tokens_per_s"), _client(lv, key, stat), lv["meets_targets"])
                       for lv in mine]
                pts = [p for p in pts if p[0] is not None and p[1] is not None]
                if not pts:
                    continue
                ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], "-", color=f"C{j}", alpha=0.5)
                ax.scatter([x for x, _, ok in pts if ok], [y for _, y, ok in pts if ok], color=f"C{j}",
                           label=f"{variant}: meets targets")
                ax.scatter([x for x, _, ok in pts if not ok], [y for _, y, ok in pts if not ok], facecolors="none",
                           edgecolors=f"C{j}", label=f"{variant}: misses them")
        for ax, (key, stat, title) in zip(axes, PARETO_FIGURES):
            bound = bounds.get(TARGET_OF[(key, stat)])
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
        fig.savefig(out / PARETO, dpi=110)
        plt.close(fig)
        written.append(out / PARETO)

    points = result.get("speedups") or []
    if points:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for key, style, label in (("speedup", "o-", "per-token latency p50 (baseline / speculation)"),
                                  ("e2e_speedup", "d--", "end-to-end latency mean (baseline / speculation)")):
            pts = [(p["rate"], p[key]) for p in points if p.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), style, label=label)
        ax.axhline(1.0, color="grey", lw=1)
        cross = result.get("crossover") or {}
        if cross.get("rate"):
            ax.axvline(cross["rate"], color="red", ls=":", lw=1.5,
                       label=f"crossover {cross['rate']:.3g} req/s ({cross['kind']})")
        for j, (variant, c) in enumerate((result.get("capacity") or {}).items()):
            if c.get("capacity") is not None:
                ax.axvline(c["capacity"], color=("C2", "C4", "C5")[j % 3], ls="--", lw=1, label=f"{variant} capacity {c['capacity']:g}")
        ax.set_xscale("log")
        _plain_ticks(ax.xaxis)
        ax.set_xlabel("arrival rate asked, req/s (Poisson)")
        ax.set_ylabel("speedup (x baseline)")
        ax.set_title("Speculation against the baseline at the same arrivals")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / SPEEDUP, dpi=110)
        plt.close(fig)
        written.append(out / SPEEDUP)
    return written


def _plain_ticks(axis: Any) -> None:
    """A log axis labelled 0.5, 1, 2 instead of 5x10^-1."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    # Minor ticks sit at 2..9 x each power of ten: label 2-5 (0.5, 3, 4...), the rest would crowd.
    axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "2345" else ""))


# ---------------------------------------------------------------------------------- tables
def _capacity_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "capacity req/s", "highest passing", "lowest failing", "search ended", "rates asked",
              "runs (rate: met? per run)"]
    rows = []
    for variant, c in (result.get("capacity") or {}).items():
        lo, hi = c["interval"]
        runs = "; ".join(f"{rate}: {' '.join('yes' if r else 'no' for r in v)}" for rate, v in c.get("runs", {}).items())
        rows.append([variant, cap._capacity_text(c), cap._rate(lo), cap._rate(hi),
                     c["status"] + (f" ({c['stopped']})" if c.get("stopped") else ""), str(c.get("steps", 0)), runs])
    return header, rows


def _speedup_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["rate req/s", "pairs", "per-token p50 speedup", "end-to-end mean speedup"]
    return header, [[f"{p['rate']:g}", str(p["pairs"]), _x(p.get("speedup")), _x(p.get("e2e_speedup"))]
                    for p in result.get("speedups") or []]


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


LEVEL_HEADER = ["#", "variant", "phase", "rate asked", "run", "achieved req/s", "behind",
                "served / refused / timed out / failed / unsent", "TTFT p95 ms", "per-token p50 ms",
                "per-token p95 ms", "e2e mean ms", "output tok/s", "acceptance", "meets targets", "why"]


def _level_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    rows = []
    for lv in result.get("levels", []):
        ol = lv.get("open_loop") or {}
        outcomes = ol.get("outcomes") or {}
        acceptance = (lv.get("server") or {}).get("acceptance_rate")
        rows.append([str(lv.get("sequence", "")), lv["variant"], lv["phase"], f"{lv['rate']:g}", str(lv["repeat"]),
                     _fmt(ol.get("achieved_rate"), 3), "-" if ol.get("behind") is None else
                     ("YES" if ol["behind"] else "no"),
                     " / ".join(_fmt(outcomes.get(k), 0) for k in (*cap.OUTCOMES, "unsent")),
                     _fmt(_client(lv, "ttft_ms", "p95")), _fmt(_client(lv, "per_token_latency_ms", "p50"), 2),
                     _fmt(_client(lv, "per_token_latency_ms", "p95"), 2), _fmt(_client(lv, "e2e_ms", "mean")),
                     _fmt((lv.get("client") or {}).get("output_tokens_per_s")), _fmt(acceptance, pct=True),
                     "yes" if lv.get("meets_targets") else "no", lv.get("why", "")])
    return LEVEL_HEADER, rows


SECOND_OPINION_FIGURES = (("output_tokens_per_s", "tok/s"), ("ttft_p50_ms", "TTFT p50 ms"),
                          ("per_token_p50_ms", "per-token p50 ms"))


def _second_opinion_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "rate req/s", "share of capacity"]
    for _, name in SECOND_OPINION_FIGURES:
        header += [f"{name} Locust / vLLM bench", "agrees"]
    header.append("agrees overall")
    rows = []
    for r in result.get("second_opinion") or []:
        row = [r["variant"], f"{r['rate']:g}", f"{100 * r['share']:.0f}%"]
        for key, _ in SECOND_OPINION_FIGURES:
            f = r["figures"].get(key) or {}
            diff = f" ({100 * f['difference']:+.1f}%)" if f.get("difference") is not None else ""
            row += [f"{_fmt(f.get('locust'), 2)} / {_fmt(f.get('vllm_bench'), 2)}{diff}", _yes(f.get("agrees"))]
        row.append(_yes(r.get("agrees")) + (f": {r['error']}" if r.get("error") else ""))
        rows.append(row)
    return header, rows


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def _overload_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "rate req/s", "seconds", "achieved req/s", "sent", "served", "refused", "timed out", "failed",
              "unsent", "all accounted for", "server up after", "peak RSS MiB: this process / Locust (all) / largest "
              "Locust process", "problems"]
    rows = []
    for variant, o in (result.get("overload") or {}).items():
        if "skipped" in o:
            rows.append([variant, "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", f"skipped: {o['skipped']}"])
            continue
        m = o.get("memory") or {}
        rows.append([variant, f"{o['rate']:g}", f"{o['duration_s']:g}", _fmt(o.get("achieved_rate"), 3),
                     _fmt(o.get("sent"), 0), *(_fmt(o["outcomes"].get(k), 0) for k in (*cap.OUTCOMES, "unsent")),
                     "yes" if o.get("accounted") else "NO", "yes" if o.get("server_up_after") else "NO",
                     f"{_fmt(m.get('self_peak_mib'), 0)} / {_fmt(m.get('locust_peak_mib'), 0)} / "
                     f"{_fmt(m.get('locust_process_peak_mib'), 0)}",
                     "; ".join(o.get("problems") or []) or "none"])
    return header, rows


# ---------------------------------------------------------------------------------- documents
def report_markdown(result: dict[str, Any], plots: list[Path], sources: Mapping[str, str] | None = None) -> str:
    sources = sources or {}
    s = result.get("settings") or {}
    said = result.get("traffic") or []  # which traffic ran, first
    lines = [*said, *cap.headline(result)]
    bold = len(said) + len(cap.content_warnings(result))  # the warnings, then the capacity line
    parts = [f"# Capacity at a service target: {result.get('config', '')}\n",
             "\n\n".join(f"**{line}**" if len(said) <= n <= bold else line for n, line in enumerate(lines)) + "\n"]
    problems = result.get("problems") or []
    run_text = (f"Status **{result.get('status')}**. Open-loop Poisson arrivals; a rate passes when every run at it "
                f"meets every target, with the load generator on schedule and every request served. Search from "
                f"{s.get('start_rate')} req/s" + (f", at most {s.get('max_rate')} req/s" if s.get("max_rate") else "")
                + f", doubling or halving to a bracket, then bisection to within {100 * s.get('precision', 0):.0f}% "
                f"(at most {s.get('max_steps')} rates a variant); each boundary rate measured {s.get('repeat')} "
                f"times; both variants measured at every rate visited, with the same arrivals.")
    scan = result.get("scan")
    if scan:
        run_text += (" Then a scan above the search's rates while speculation still paid: "
                     + (", ".join(f"{r:g}" for r in scan["rates"]) + " req/s" if scan["rates"] else "no rate")
                     + f" (ended: {scan['ended']}).")
    if result.get("request"):
        run_text += " Requests: " + ", ".join(f"{k} {v}" for k, v in result["request"].items()) + "."
    parts.append(run_text + ("\n\nProblems: " + "; ".join(problems) if problems else "") + "\n")
    sections = [
        ("Capacity", "Capacity: the highest rate at which every run met every target, below the lowest rate at "
         "which one did not (the interval). 'found': the interval is within the precision; 'budget': the step "
         "budget ran out first; 'at least': it passed at --max-rate; 'none passing': it failed down to the lowest "
         "rate tried.", _capacity_rows(result)),
        ("Speedup by rate", "Speculation against the baseline, paired at each rate and run (the same arrivals): "
         "per-token latency p50 and end-to-end latency mean, baseline over speculation (above 1: speculation is "
         "faster), averaged over the rate's pairs. The crossover is interpolated between the rates around it on a "
         "log scale.", _speedup_rows(result)),
        ("Every level measured", "In the order measured. Achieved req/s: requests sent over the level's time; "
         "behind: the load generator could not keep its schedule (the load asked was not the load served).",
         _level_rows(result)),
        ("Second opinion: Locust against vLLM's benchmark",
         "Below the smaller capacity, each variant with vLLM's serving benchmark run beside Locust's level on the "
         "same server, arrivals and prompts; they agree within 5% on tokens/s and 10% on TTFT and per-token p50. "
         "The difference in brackets is the one judged, as in a sweep's second opinion: latencies request by "
         "request (the median ratio of the same request in both clients), with the engine's own drift between the "
         "two windows taken out, so it can differ from the ratio of the two p50s beside it.",
         _second_opinion_rows(result)),
        ("Overload", "Each variant at twice its capacity: the server must still answer its health check "
         "afterwards, and every request sent must have ended served, refused, timed out or failed. Peak resident "
         "memory of the kit's own processes over the level (sampled every 0.5 s).", _overload_rows(result)),
    ]
    for title, prose, table in sections:
        parts.append(f"## {title}\n\n{prose}\n")
        if table and table[1]:
            parts.append(_md_table(*table) + "\n")
    if plots:
        parts.append("## Plots\n\n" + "\n".join(f"![{p.stem}]({sources.get(p.name, p.name)})" for p in plots) + "\n")
    return "\n".join(parts)


def write(result: dict[str, Any], out: Path) -> dict[str, Path]:
    """capacity.md, report.html (self-contained: plots as data URIs) and the plots."""
    out.mkdir(parents=True, exist_ok=True)
    plots = plot(result, out)
    md = write_atomic(out / "capacity.md", report_markdown(result, plots))
    sources = {p.name: "data:image/png;base64," + base64.b64encode(p.read_bytes()).decode() for p in plots}
    page = write_atomic(out / "report.html",
                        f"<!doctype html><html><head><meta charset='utf-8'><title>Capacity "
                        f"{html.escape(str(result.get('config', '')))}</title><style>{HTML_STYLE}</style></head><body>\n"
                        + render_html(report_markdown(result, plots, sources)) + "\n</body></html>\n")
    return {"markdown": md, "html": page, **{p.stem: p for p in plots}}
