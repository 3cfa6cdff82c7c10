"""The sweep report's PNG plots: throughput, latency and acceptance against concurrency, the speedup
picture of the first screen (`ANSWER`), and the open loop's latency and speedup against the arrival rate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadtest.measurement import stats
from loadtest.measurement.derive import SPEEDUPS, derive, derive_rates, levels, summarize_speedups
from loadtest.measurement.results import SweepResults
from loadtest.reports import plots

ANSWER = "speedup.png"
"""The plot that answers the question, shown beside the verdicts."""


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


def plot(results: SweepResults, out: Path) -> list[Path]:
    """PNG plots against concurrency (means over repeats); only those with data are written."""
    plt = plots.pyplot()
    series = _client_series(results)
    derived = derive(results)
    concurrencies = sorted({r["concurrency"] for rows in series.values() for r in rows})
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        plots.save(fig, out / name, dpi=110)
        written.append(out / name)

    if series:
        save(_throughput_figure(plt, series, concurrencies), "throughput.png")
        save(_latency_figure(plt, series, concurrencies), "latency.png")

    spec = [d for d in derived if d.get("acceptance_rate") is not None]
    if spec:
        save(_acceptance_figure(plt, spec, concurrencies), "acceptance.png")

    speed = [e for e in summarize_speedups(results) if (e.get("speedup") or {}).get("mean") is not None]
    if speed:
        save(speedup_figure(speed, concurrencies), ANSWER)

    rate_rows = [r for r in derive_rates(results) if r["output_tokens_per_s"] is not None]
    if rate_rows:
        save(_rates_figure(plt, rate_rows), "rates.png")
        if not speed and any(r.get("tpot_p50_speedup") for r in rate_rows):
            save(rate_speedup_figure(rate_rows), ANSWER)
    return written


def _client_series(results: SweepResults) -> dict[str, list[dict[str, Any]]]:
    """Per variant: the client's throughput and latency percentiles at each concurrency, means over repeats."""
    client_rows: dict[str, list[dict[str, Any]]] = {}
    for variant, level in levels(results):
        c = level.client
        row = {"concurrency": level.concurrency, "tps": c["output_tokens_per_s"],
               "user_tps": c["per_user_tokens_per_s"]["p50"]}
        for key in ("ttft_ms", "per_token_latency_ms"):
            row.update({f"{key}_p{p}": c[key][f"p{p}"] for p in (50, 95, 99)})
        client_rows.setdefault(variant.name, []).append(row)
    return {name: _averaged(rows, tuple(k for k in rows[0] if k != "concurrency"))
            for name, rows in client_rows.items()}


def _axis(ax: Any, title: str, ylabel: str, concurrencies: list[int]) -> None:
    """A concurrency axis (log 2, the levels measured as its ticks), its title, grid and legend."""
    from matplotlib.ticker import FuncFormatter, NullLocator

    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency (users, closed loop)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.set_xticks(concurrencies)  # the levels measured, as plain integers
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.legend(fontsize=8)


def _throughput_figure(plt: Any, series: dict[str, list[dict[str, Any]]], concurrencies: list[int]) -> Any:
    """System and per-user output throughput against concurrency, one line per variant."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, rows in series.items():
        xs = [r["concurrency"] for r in rows]
        axes[0].plot(xs, [r["tps"] for r in rows], "o-", label=name)
        axes[1].plot(xs, [r["user_tps"] for r in rows], "o-", label=name)
    _axis(axes[0], "System output throughput", "output tokens/s", concurrencies)
    _axis(axes[1], "Per-user throughput (median request)", "output tokens/s per user", concurrencies)
    return fig


def _latency_figure(plt: Any, series: dict[str, list[dict[str, Any]]], concurrencies: list[int]) -> Any:
    """TTFT and per-token latency p50/p95/p99 against concurrency, one colour per variant."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (key, title) in enumerate((("ttft_ms", "Time to first token"),
                                      ("per_token_latency_ms", "Per-token latency (after the first)"))):
        for j, (name, rows) in enumerate(series.items()):
            xs = [r["concurrency"] for r in rows]
            for p, style in ((50, "o-"), (95, "s--"), (99, "^:")):
                axes[i].plot(xs, [r[f"{key}_p{p}"] for r in rows], style, color=f"C{j}", label=f"{name} p{p}")
        _axis(axes[i], title, "ms", concurrencies)
    return fig


def _acceptance_figure(plt: Any, spec: list[dict[str, Any]], concurrencies: list[int]) -> Any:
    """Acceptance against its break-even, and tokens per step (measured, modelled, break-even) by concurrency."""
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
    _axis(axes[0], "Acceptance rate", "accepted / drafted tokens", concurrencies)
    _axis(axes[1], "Tokens per verification step", "tokens (cost: target steps)", concurrencies)
    return fig


def speedup_figure(speed: list[dict[str, Any]], concurrencies: list[int]) -> Any:
    """Speedup by batch size, each of the three readings with its 95% interval, and the 1.0 line;
    Locust's mean written beside its point."""
    fig, ax = plots.speedup_axes()
    styles = {"speedup": ("o-", 7), "vllm_bench_speedup": ("d--", 5), "measured_speedup": ("x:", 5)}
    names = list(dict.fromkeys(e["variant"] for e in speed))
    # Several drafters: one line each (the client's reading); three readings per drafter would hide them.
    readings = SPEEDUPS if len(names) <= 2 else {"speedup": SPEEDUPS["speedup"]}
    for j, name in enumerate(names):
        rows = sorted((e for e in speed if e["variant"] == name), key=lambda e: e["concurrency"])
        for key, label in readings.items():
            pts = [(e["concurrency"], e[key]) for e in rows if (e.get(key) or {}).get("mean") is not None]
            if not pts:
                continue
            xs, ms = [c for c, _ in pts], [m["mean"] for _, m in pts]
            err = [[m["mean"] - m["low"] if m.get("low") is not None else 0 for _, m in pts],
                   [m["high"] - m["mean"] if m.get("high") is not None else 0 for _, m in pts]]
            fmt, size = styles[key]
            ax.errorbar(xs, ms, yerr=err, fmt=fmt, color=f"C{j}", capsize=4, ms=size,
                        lw=2 if key == "speedup" else 1, alpha=1 if key == "speedup" else 0.7,
                        label=(name if len(readings) == 1 else (f"{name}: " if len(names) > 1 else "") + label))
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
