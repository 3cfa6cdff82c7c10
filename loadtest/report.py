"""Turn results.json into what people read: report.md, report.html (plots embedded), PNG plots,
and the batch-1 vs batch-32 table that `python -m loadtest compare` prints.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loadtest import stats

PLOTS = ("throughput.png", "latency.png", "acceptance.png", "speedup.png")
COST_MODEL = stats.__doc__.strip().split("\n", 1)[1].strip() if stats.__doc__ else ""


# ---------------------------------------------------------------------------------- derived numbers
def levels(results: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(variant, level) pairs that have client numbers."""
    for variant in results.get("variants", []):
        for level in variant.get("levels", []):
            if level.get("client", {}).get("ok"):
                yield variant, level


def _level_at(results: dict[str, Any], variant_name: str, concurrency: int) -> dict[str, Any] | None:
    for variant, level in levels(results):
        if variant["name"] == variant_name and level["concurrency"] == concurrency:
            return level
    return None


def derive(results: dict[str, Any]) -> list[dict[str, Any]]:
    """For each speculative variant and concurrency: speedup over the baseline and the cost model."""
    rows = []
    for variant, level in levels(results):
        if variant["name"] == "baseline" or not variant.get("k"):
            continue
        c = level["concurrency"]
        client, server = level["client"], level.get("server") or {}
        base = _level_at(results, "baseline", c)
        base_client = base["client"] if base else {}
        # Per-token costs from the engine's own clock when the server reports them (robust to a
        # client or API server that is short of CPU and delivers chunks late), else the client's.
        tpot, source = _tpot_s(level), "server"
        base_tpot = _tpot_s(base) if base else None
        if tpot is None or base_tpot is None:
            tpot, source = _tpot_s(level, client_side=True), "client"
            base_tpot = _tpot_s(base, client_side=True) if base else None
        row: dict[str, Any] = {"variant": variant["name"], "concurrency": c, "per_token_source": source}
        row.update(stats.speculation_analysis(
            server.get("acceptance_rate"), server.get("mean_accepted_length"), variant["k"], tpot, base_tpot))
        if base_client.get("output_tokens_per_s"):
            row["speedup"] = client["output_tokens_per_s"] / base_client["output_tokens_per_s"]
        rows.append(row)
    return rows


def _tpot_s(level: dict[str, Any], client_side: bool = False) -> float | None:
    """Mean per-token latency of a level in seconds: the server's histogram, or the client's records."""
    if client_side:
        ms = ((level.get("client") or {}).get("per_token_latency_ms") or {}).get("mean")
        return ms / 1000 if ms else None
    hist = ((level.get("server") or {}).get("histograms") or {}).get("per_token_latency_s") or {}
    return hist.get("mean") or None


# ---------------------------------------------------------------------------------- tables
def _fmt(value: Any, digits: int = 1, pct: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if pct:
        return f"{100 * value:.0f}%"
    return f"{value:,.{digits}f}"


def compare_rows(results: dict[str, Any], concurrencies: list[int] | None = None) -> list[dict[str, Any]]:
    derived = {(r["variant"], r["concurrency"]): r for r in derive(results)}
    wanted = concurrencies or sorted({lv["concurrency"] for _, lv in levels(results)})
    rows = []
    for c in wanted:
        for variant in results.get("variants", []):
            level = next((lv for lv in variant.get("levels", []) if lv["concurrency"] == c), None)
            if level is None:
                continue
            client = level.get("client") or {}
            server = level.get("server") or {}
            d = derived.get((variant["name"], c), {})
            rows.append({
                "concurrency": c, "variant": variant["name"], "status": level["status"],
                "requests": f"{client.get('ok', 0)}/{client.get('requests', 0)}",
                "system_tps": client.get("output_tokens_per_s"),
                "user_tps": (client.get("per_user_tokens_per_s") or {}).get("p50"),
                "ttft_p50": _with_engine((client.get("ttft_ms") or {}).get("p50"), server, "ttft_s"),
                "tpot_p50": _with_engine((client.get("per_token_latency_ms") or {}).get("p50"), server,
                                         "per_token_latency_s", 2),
                "acceptance": server.get("acceptance_rate"),
                "accepted_length": server.get("mean_accepted_length"),
                "speedup": d.get("speedup"),
                "server_agrees": (level.get("consistency") or {}).get("ok"),
            })
    return rows


def _with_engine(client_ms: float | None, server: dict[str, Any], hist: str, digits: int = 1) -> str:
    """Client percentile, and in brackets the engine's own mean (free of delivery delays)."""
    engine_s = ((server.get("histograms") or {}).get(hist) or {}).get("mean")
    text = _fmt(client_ms, digits)
    return f"{text} ({_fmt(engine_s * 1000, digits)})" if engine_s is not None else text


COMPARE_COLUMNS = [
    ("concurrency", "batch"), ("variant", "variant"), ("requests", "ok/req"), ("system_tps", "tok/s system"),
    ("user_tps", "tok/s per user"), ("ttft_p50", "TTFT p50 (engine) ms"),
    ("tpot_p50", "per-token p50 (engine) ms"),
    ("acceptance", "acceptance"), ("accepted_length", "tokens/step"), ("speedup", "speedup"),
    ("server_agrees", "counters agree"), ("status", "status"),
]


def _cell(key: str, value: Any) -> str:
    if key == "acceptance":
        return _fmt(value, pct=True)
    if key in ("accepted_length",):
        return _fmt(value, 2)
    if key == "speedup":
        return "-" if value is None else f"{value:.2f}x"
    if key == "server_agrees":
        return "-" if value is None else ("yes" if value else "NO")
    if key in ("concurrency",):
        return str(value)
    return _fmt(value, 1)


def compare_table(results: dict[str, Any], concurrencies: list[int] | None = None) -> str:
    """Plain-text table for the terminal."""
    rows = compare_rows(results, concurrencies)
    header = [title for _, title in COMPARE_COLUMNS]
    body = [[_cell(k, r[k]) for k, _ in COMPARE_COLUMNS] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) if i > 1 else h.ljust(w) for i, (h, w) in enumerate(zip(header, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    previous = None
    for r, b in zip(rows, body):
        if previous is not None and r["concurrency"] != previous:
            lines.append("")
        previous = r["concurrency"]
        lines.append("  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(b, widths))))
    notes = [f"{v['name']} c={lv['concurrency']}: {n}" for v in results.get("variants", [])
             for lv in v.get("levels", []) if not concurrencies or lv["concurrency"] in concurrencies
             for n in (lv.get("problems") or []) + (lv.get("notes") or [])]
    if notes:
        lines += ["", *[f"note: {n}" for n in notes]]
    return "\n".join(lines)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _latency_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "batch", "TTFT p50/p95/p99 ms", "per-token p50/p95/p99 ms", "chunk gap p50/p99 ms",
              "tokens/chunk mean", "e2e p50/p99 ms", "req/s", "peak tok/s"]
    rows = []
    for variant, level in levels(results):
        c = level["client"]

        def trio(key: str, ps: tuple[int, ...] = (50, 95, 99)) -> str:
            d = c.get(key) or {}
            return " / ".join(_fmt(d.get(f"p{p}")) for p in ps)

        rows.append([variant["name"], str(level["concurrency"]), trio("ttft_ms"), trio("per_token_latency_ms"),
                     trio("chunk_gap_ms", (50, 99)), _fmt((c.get("tokens_per_chunk") or {}).get("mean"), 2),
                     trio("e2e_ms", (50, 99)), _fmt(c.get("request_throughput"), 2),
                     _fmt(c.get("peak_output_tokens_per_s"), 0)])
    return header, rows


def _spec_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "batch", "K", "per-token costs from", "acceptance rate alpha", "E(alpha,K)",
              "measured tokens/step L", "implied per-token a", "per-position acceptance", "step cost r",
              "break-even alpha*", "break-even a*", "pays (L > r)", "per-token speedup (engine)",
              "throughput speedup"]
    rows = []
    for d in derive(results):
        level = _level_at(results, d["variant"], d["concurrency"]) or {}
        per_pos = (level.get("server") or {}).get("per_position_acceptance") or []
        costed = "step_cost_ratio" in d

        def never(key: str) -> str:
            return "never" if costed and d.get(key) is None else _fmt(d.get(key), 3)

        rows.append([d["variant"], str(d["concurrency"]), str(d["k"]), d.get("per_token_source", "-"),
                     _fmt(d.get("acceptance_rate"), 3), _fmt(d.get("expected_tokens_per_step"), 2),
                     _fmt(d.get("mean_accepted_length"), 2), _fmt(d.get("implied_per_token_acceptance"), 3),
                     " ".join(f"{p:.2f}" for p in per_pos) or "-", _fmt(d.get("step_cost_ratio"), 2),
                     never("break_even_acceptance_rate"), never("break_even_per_token_acceptance"),
                     "-" if not costed else ("yes" if d.get("pays") else "no"),
                     _fmt(d.get("measured_speedup"), 2), _fmt(d.get("speedup"), 2)])
    return header, rows


def _trust_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "batch", "status", "client tokens", "server tokens", "difference", "client tok/s",
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
                return f"{_fmt(mine)} / {_fmt(theirs * 1000 if theirs is not None else None)}"

            diff = k.get("relative_error")
            rows.append([variant["name"], str(level["concurrency"]), level["status"],
                         _fmt(k.get("client_output_tokens"), 0), _fmt(k.get("server_generation_tokens"), 0),
                         "-" if diff is None else f"{100 * diff:.2f}%" + ("" if k.get("ok") else " FLAG"),
                         _fmt(c.get("output_tokens_per_s")), _fmt(s.get("output_tokens_per_s")),
                         pair("ttft_ms", "ttft_s"), pair("e2e_ms", "e2e_s"),
                         pair("per_token_latency_ms", "per_token_latency_s"),
                         "; ".join((level.get("problems") or []) + (level.get("notes") or [])) or "none"])
    return header, rows


# ---------------------------------------------------------------------------------- plots
def plot(results: dict[str, Any], out: Path) -> list[Path]:
    """PNG plots against concurrency; only those with data are written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for variant, level in levels(results):
        series.setdefault(variant["name"], []).append((level["concurrency"], level))
    derived = derive(results)
    concurrencies = sorted({c for pts in series.values() for c, _ in pts})
    written = []

    def axis(ax: Any, title: str, ylabel: str) -> None:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (users, closed loop)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.set_xticks(concurrencies)  # the levels measured, as plain integers
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.legend(fontsize=8)

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(out / name)

    if series:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for name, pts in series.items():
            pts.sort(key=lambda p: p[0])
            xs = [c for c, _ in pts]
            axes[0].plot(xs, [lv["client"]["output_tokens_per_s"] for _, lv in pts], "o-", label=name)
            axes[1].plot(xs, [lv["client"]["per_user_tokens_per_s"]["p50"] for _, lv in pts], "o-", label=name)
        axis(axes[0], "System output throughput", "output tokens/s")
        axis(axes[1], "Per-user throughput (median request)", "output tokens/s per user")
        save(fig, "throughput.png")

        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for i, (key, title) in enumerate((("ttft_ms", "Time to first token"),
                                          ("per_token_latency_ms", "Per-token latency (after the first)"))):
            for j, (name, pts) in enumerate(series.items()):
                xs = [c for c, _ in pts]
                color = f"C{j}"
                for p, style in ((50, "o-"), (95, "s--"), (99, "^:")):
                    axes[i].plot(xs, [lv["client"][key][f"p{p}"] for _, lv in pts], style, color=color,
                                 label=f"{name} p{p}")
            axis(axes[i], title, "ms")
        save(fig, "latency.png")

    spec = [d for d in derived if d.get("acceptance_rate") is not None]
    if spec:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for j, name in enumerate(dict.fromkeys(d["variant"] for d in spec)):
            rows = sorted((d for d in spec if d["variant"] == name), key=lambda d: d["concurrency"])
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

    speed = [d for d in derived if d.get("speedup") is not None]
    if speed:
        fig, ax = plt.subplots(figsize=(6, 4))
        for j, name in enumerate(dict.fromkeys(d["variant"] for d in speed)):
            rows = sorted((d for d in speed if d["variant"] == name), key=lambda d: d["concurrency"])
            ax.plot([d["concurrency"] for d in rows], [d["speedup"] for d in rows], "o-", color=f"C{j}",
                    label=f"{name} system output tokens/s")
            engine = [(d["concurrency"], d["measured_speedup"]) for d in rows if d.get("measured_speedup")]
            if engine:
                ax.plot(*zip(*engine), "x--", color=f"C{j}", label=f"{name} per-token latency (engine)")
        ax.axhline(1.0, color="grey", lw=1)
        axis(ax, "Speedup of speculation over the baseline", "x baseline")
        save(fig, "speedup.png")
    return written


# ---------------------------------------------------------------------------------- documents
Section = tuple[str, str, "tuple[list[str], list[list[str]]] | None"]
PREFORMATTED = "Speculation: acceptance, expected tokens and break-even"  # its prose is the model, verbatim


def _sections(results: dict[str, Any]) -> list[Section]:
    """(title, prose, table) for both Markdown and HTML."""
    s = results.get("settings", {})
    per_level = {lv["concurrency"]: lv["requests_per_user"] * lv["concurrency"]
                 for v in results.get("variants", []) for lv in v.get("levels", []) if lv.get("requests_per_user")}
    load = (f"{s.get('duration_s')} s a level" if s.get("duration_s") else
            "measured requests per level: " + ", ".join(f"{n} at batch {c}" for c, n in sorted(per_level.items())))
    intro = (f"Config `{results.get('config')}`, status **{results.get('status')}**. Workload `{s.get('workload')}`, "
             f"{s.get('max_tokens')} output tokens per request"
             f"{' (fixed: ignore_eos)' if s.get('fixed_length') else ''}, temperature {s.get('temperature')}, "
             f"closed loop at concurrency {s.get('users')}, {load}, {s.get('warmup')} warm-up request(s) per user "
             f"excluded, Locust workers: {s.get('workers') or 'none (one process)'}. "
             f"Machine: {results.get('machine', {}).get('cpus')} CPUs, vLLM {results.get('machine', {}).get('vllm')}, "
             f"Locust {results.get('machine', {}).get('locust')}.")
    findings = [
        f"- batch {d['concurrency']}: {d['variant']} makes {_fmt(d.get('speedup'), 2)}x the baseline's output "
        f"tokens/s; per token on the engine {_fmt(d.get('measured_speedup'), 2)}x; acceptance "
        f"{_fmt(d.get('acceptance_rate'), pct=True)}, {_fmt(d.get('mean_accepted_length'), 2)} tokens a step "
        f"against a break-even of {_fmt(d.get('step_cost_ratio'), 2)}"
        for d in derive(results) if d.get("speedup") is not None]
    if findings:
        intro += "\n\n" + "\n".join(findings)
    problems = results.get("problems") or []
    variants = [[v["name"], v.get("label", ""), v["status"], _fmt(v.get("startup_s"), 0),
                 json.dumps(v.get("speculative_config")) if v.get("speculative_config") else "off",
                 v.get("error") or ""] for v in results.get("variants", [])]
    cmp_rows = compare_rows(results)
    compare = ([t for _, t in COMPARE_COLUMNS], [[_cell(k, r[k]) for k, _ in COMPARE_COLUMNS] for r in cmp_rows])
    return [
        ("Summary", intro + ("\n\nProblems: " + "; ".join(problems) if problems else ""), None),
        ("Variants", "Each variant ran on its own freshly started server.",
         (["variant", "label", "status", "start-up s", "speculative_config", "error"], variants)),
        ("Batch comparison", "tok/s system: output tokens of all successful requests / measured interval. "
         "tok/s per user: median over requests of output tokens / end-to-end latency. Speedup: system tok/s of "
         "the variant / the baseline's at the same concurrency. Acceptance and tokens/step from the server's "
         "/metrics over the same run (as vLLM's benchmark computes them).", compare),
        ("Latency", "Per-token latency = (end-to-end - TTFT) / tokens after the first chunk. Chunk gaps are "
         "the times between streamed chunks; with speculation a chunk carries several tokens, so they are not "
         "per-token latencies.", _latency_rows(results)),
        (PREFORMATTED, COST_MODEL, _spec_rows(results)),
        ("Trust: client numbers against the server's counters",
         "Client output tokens (from each response's usage) against the delta of "
         "`vllm:generation_tokens_total` over the same interval; runs differing by more than "
         f"{100 * s.get('tolerance', 0.05):.0f}% are flagged. Server means come from vLLM's histograms.",
         _trust_rows(results)),
    ]


def _locust_links(results: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for variant in results.get("variants", []):
        for level in variant.get("levels", []):
            loc = level.get("locust")
            if loc:
                out.append((f"{variant['name']} c={level['concurrency']}", loc["html"]))
    return out


def write_markdown(results: dict[str, Any], out: Path, plots: list[Path]) -> Path:
    parts = [f"# Load test report: {results.get('config')}\n"]
    for title, prose, table in _sections(results):
        parts.append(f"## {title}\n\n" + (f"```text\n{prose}\n```\n" if title == PREFORMATTED else f"{prose}\n"))
        if table and table[1]:
            parts.append(_md_table(*table) + "\n")
    if plots:
        parts.append("## Plots\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in plots) + "\n")
    links = _locust_links(results)
    if links:
        parts.append("## Locust's own reports\n\n" + "\n".join(f"- [{n}]({h}) (CSV beside it)" for n, h in links) + "\n")
    path = out / "report.md"
    path.write_text("\n".join(parts))
    return path


def write_html(results: dict[str, Any], out: Path, plots: list[Path]) -> Path:
    esc = html.escape
    body = [f"<h1>Load test report: {esc(str(results.get('config')))}</h1>"]
    for title, prose, table in _sections(results):
        body.append(f"<h2>{esc(title)}</h2>")
        if title == PREFORMATTED:
            body.append(f"<pre>{esc(prose)}</pre>")
        else:
            body.append("".join(f"<p>{esc(p).replace('**', '')}</p>" for p in prose.split("\n\n")))
        if table and table[1]:
            header, rows = table
            body.append("<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"
                        + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
                        + "</table>")
    for p in plots:
        data = base64.b64encode(p.read_bytes()).decode()
        body.append(f'<h3>{esc(p.stem)}</h3><img alt="{esc(p.stem)}" src="data:image/png;base64,{data}">')
    links = _locust_links(results)
    if links:
        body.append("<h2>Locust's own reports</h2><ul>" + "".join(
            f'<li><a href="{esc(h)}">{esc(n)}</a></li>' for n, h in links) + "</ul>")
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;font-size:13px;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#f3f3f3}"
             "img{max-width:100%}p{white-space:pre-wrap}")
    path = out / "report.html"
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>Load test "
                    f"{esc(str(results.get('config')))}</title><style>{style}</style></head><body>"
                    + "\n".join(body) + "</body></html>\n")
    return path


def write_report(results: dict[str, Any], out: Path) -> dict[str, Path]:
    """results.json (with derived comparisons), report.md, report.html and the PNG plots."""
    out.mkdir(parents=True, exist_ok=True)
    results["comparisons"] = derive(results)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    plots = plot(results, out)
    return {"json": out / "results.json", "markdown": write_markdown(results, out, plots),
            "html": write_html(results, out, plots), **{p.stem: p for p in plots}}


def load_results(report: Path) -> dict[str, Any]:
    path = report / "results.json" if report.is_dir() else report
    return json.loads(path.read_text())


def newest_report(root: Path = Path("reports")) -> Path | None:
    found = sorted(root.glob("*/results.json"), key=lambda p: p.stat().st_mtime)
    return found[-1].parent if found else None
