"""The sweep report's PNG plots: throughput, latency and acceptance against concurrency, the speedup
picture of the first screen (`ANSWER`), and the open loop's latency and speedup against the arrival rate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from loadtest.measurement import stats
from loadtest.measurement.derive import SPEEDUPS, derive, derive_rates, levels, summarize_speedups
from loadtest.measurement.derived import Comparison, RateRow, SpeedupSummary
from loadtest.measurement.figures import NO_VALUES, ClientFigures, Interval
from loadtest.measurement.results import LevelResult, SweepResults
from loadtest.reports import plots

ANSWER = "speedup.png"
"""The plot that answers the question, shown beside the verdicts."""

T = TypeVar("T")


def _means(rows: Iterable[T], y: Callable[[T], float | None],
           x: Callable[[T], float | None] = lambda row: row.concurrency) -> tuple[list[float], list[float | None]]:
    """A series averaged over repeats: each value of `x` (the concurrency, or an open loop's rate),
    sorted, and the mean of `y` over the rows there (None where no row has one)."""
    by_x: dict[float, list[float]] = {}
    for row in rows:
        values = by_x.setdefault(x(row) or 0, [])
        if (v := y(row)) is not None:
            values.append(v)
    xs = sorted(by_x)
    return xs, [sum(by_x[k]) / len(by_x[k]) if by_x[k] else None for k in xs]


def _known(xs: list[float], ms: list[float | None]) -> list[tuple[float, float]]:
    """The points of a series that have a value."""
    return [(x, m) for x, m in zip(xs, ms) if m is not None]


def error_bars(ms: list[Interval]) -> list[list[float]]:
    """Matplotlib's `yerr` of mean speedups: each interval's distance below and above its mean (0 without one)."""
    return [[m.mean - m.low if m.mean is not None and m.low is not None else 0 for m in ms],
            [m.high - m.mean if m.mean is not None and m.high is not None else 0 for m in ms]]


def plot(results: SweepResults, out: Path) -> list[Path]:
    """PNG plots against concurrency (means over repeats); only those with data are written."""
    series: dict[str, list[LevelResult]] = {}  # per variant: its closed-loop levels with client numbers
    for variant, level in levels(results):
        series.setdefault(variant.name, []).append(level)
    concurrencies = sorted({lv.concurrency or 0 for lvs in series.values() for lv in lvs})
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        written.append(plots.save(fig, out / name, dpi=110))

    if series:
        save(_throughput_figure(series, concurrencies), "throughput.png")
        save(_latency_figure(series, concurrencies), "latency.png")

    spec = [d for d in derive(results) if d.acceptance_rate is not None]
    if spec:
        save(_acceptance_figure(spec, concurrencies), "acceptance.png")

    speed = [e for e in summarize_speedups(results) if e.speedup.mean is not None]
    if speed:
        save(speedup_figure(speed, concurrencies), ANSWER)

    rate_rows = [r for r in derive_rates(results) if r.output_tokens_per_s is not None]
    if rate_rows:
        save(_rates_figure(rate_rows), "rates.png")
        if not speed and any(r.tpot_p50_speedup for r in rate_rows):
            save(rate_speedup_figure(rate_rows), ANSWER)
    return written


def _client(value: Callable[[ClientFigures], float | None]) -> Callable[[LevelResult], float | None]:
    """A client figure of a level (`levels` gives only levels with client numbers)."""
    return lambda level: value(level.client or ClientFigures())


def _axis(ax: Any, title: str, ylabel: str, xs: list[float], xlabel: str = "concurrency (users, closed loop)",
          base: int = 2) -> None:
    """A log axis with the levels measured (`xs`: concurrencies, or an open loop's rates) as its
    ticks, labelled as plain numbers; its title, grid and legend."""
    from matplotlib.ticker import FuncFormatter, NullLocator

    ax.set_xscale("log", base=base)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.set_xticks(xs)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _throughput_figure(series: dict[str, list[LevelResult]], concurrencies: list[int]) -> Any:
    """System and per-user output throughput against concurrency, one line per variant."""
    fig, axes = plots.pyplot().subplots(1, 2, figsize=(11, 4))
    for name, rows in series.items():
        axes[0].plot(*_means(rows, _client(lambda c: c.output_tokens_per_s)), "o-", label=name)
        axes[1].plot(*_means(rows, _client(lambda c: (c.per_user_tokens_per_s or NO_VALUES).p50)), "o-",
                     label=name)
    _axis(axes[0], "System output throughput", "output tokens/s", concurrencies)
    _axis(axes[1], "Per-user throughput (median request)", "output tokens/s per user", concurrencies)
    return fig


def _latency_figure(series: dict[str, list[LevelResult]], concurrencies: list[int]) -> Any:
    """TTFT and per-token latency p50/p95/p99 against concurrency, one colour per variant."""
    fig, axes = plots.pyplot().subplots(1, 2, figsize=(11, 4))
    for i, (dist, title) in enumerate((((lambda c: c.ttft_ms), "Time to first token"),
                                       ((lambda c: c.per_token_latency_ms), "Per-token latency (after the first)"))):
        for j, (name, rows) in enumerate(series.items()):
            for p, style in ((50, "o-"), (95, "s--"), (99, "^:")):
                value = _client(lambda c, p=p, dist=dist: (dist(c) or NO_VALUES).percentile(f"p{p}"))
                axes[i].plot(*_means(rows, value), style, color=f"C{j}", label=f"{name} p{p}")
        _axis(axes[i], title, "ms", concurrencies)
    return fig


def _acceptance_figure(spec: list[Comparison], concurrencies: list[int]) -> Any:
    """Acceptance against its break-even, and tokens per step (measured, modelled, break-even) by concurrency."""
    fig, axes = plots.pyplot().subplots(1, 2, figsize=(11, 4))
    for j, name in enumerate(dict.fromkeys(d.variant for d in spec)):
        rows = [d for d in spec if d.variant == name]

        axes[0].plot(*_means(rows, lambda d: d.acceptance_rate), "o-", color=f"C{j}", label=f"{name} acceptance rate alpha")
        be = _known(*_means(rows, lambda d: d.break_even_acceptance_rate))
        if be:
            axes[0].plot(*zip(*be), "x--", color=f"C{j}", label=f"{name} break-even alpha*")
        axes[1].plot(*_means(rows, lambda d: d.mean_accepted_length), "o-", color=f"C{j}", label=f"{name} measured L")
        axes[1].plot(*_means(rows, lambda d: d.expected_tokens_per_step), "x--", color=f"C{j}", label=f"{name} E(alpha,K)")
        costs = [(x, m) for x, m in zip(*_means(rows, lambda d: d.step_cost_ratio)) if m]
        if costs:
            axes[1].plot(*zip(*costs), "s:", color=f"C{j}", label=f"{name} step cost r (break-even L)")
    axes[0].set_ylim(0, 1)
    _axis(axes[0], "Acceptance rate", "accepted / drafted tokens", concurrencies)
    _axis(axes[1], "Tokens per verification step", "tokens (cost: target steps)", concurrencies)
    return fig


def speedup_figure(speed: list[SpeedupSummary], concurrencies: list[int]) -> Any:
    """Speedup by batch size, each of the three readings with its 95% interval, and the 1.0 line;
    Locust's mean written beside its point."""
    fig, ax = plots.speedup_axes()
    styles = {"speedup": ("o-", 7), "vllm_bench_speedup": ("d--", 5), "measured_speedup": ("x:", 5)}
    names = list(dict.fromkeys(e.variant for e in speed))
    # Several drafters: one line each (the client's reading); three readings per drafter would hide them.
    readings = list(SPEEDUPS.items())[:3 if len(names) <= 2 else 1]
    for j, name in enumerate(names):
        rows = sorted((e for e in speed if e.variant == name), key=lambda e: e.concurrency)
        for key, label in readings:
            pts = [(e.concurrency, m) for e in rows if (m := getattr(e, key)).mean is not None]
            if not pts:
                continue
            xs, ms = [c for c, _ in pts], [m.mean for _, m in pts]
            fmt, size = styles[key]
            ax.errorbar(xs, ms, yerr=error_bars([m for _, m in pts]), fmt=fmt, color=f"C{j}", capsize=4, ms=size,
                        lw=2 if key == "speedup" else 1, alpha=1 if key == "speedup" else 0.7,
                        label=(name if len(readings) == 1 else (f"{name}: " if len(names) > 1 else "") + label))
            if key == "speedup":
                for x, m in zip(xs, ms):
                    ax.annotate(f"{m:.2f}x", (x, m), textcoords="offset points", xytext=(8, 6), fontsize=10,
                                color=f"C{j}", fontweight="bold")
    intervals = any(e.speedup.low is not None for e in speed)
    plots.finish_speedup_axes(ax, concurrencies or sorted({e.concurrency for e in speed}),
                              "batch size (concurrent requests)", "Speedup of speculation over the baseline "
                              + ("(95% intervals)" if intervals else "(one run: no interval)"))
    return fig


def rate_speedup_figure(rows: list[RateRow]) -> Any:
    """Open loop: speedup a user sees by arrival rate (per-token p50, end-to-end mean), 95% intervals."""
    fig, ax = plots.speedup_axes()
    spec = [r for r in rows if r.variant != "baseline"]
    names = list(dict.fromkeys(r.variant for r in spec))
    intervals = False
    for j, name in enumerate(names):
        for n, (value, fmt, label) in enumerate((((lambda r: r.tpot_p50_speedup), "o-", "per token (TPOT p50)"),
                                                 ((lambda r: r.e2e_mean_speedup), "d--", "end to end (mean)"))):
            by_rate: dict[float, list[float]] = {}
            for r in spec:
                if r.variant == name and (v := value(r)):
                    by_rate.setdefault(r.rate, []).append(v)
            if not by_rate:
                continue
            ms = [(rate, stats.mean_interval(v)) for rate, v in sorted(by_rate.items())]
            intervals = intervals or any(m.low is not None for _, m in ms)
            ax.errorbar([r for r, _ in ms], [m.mean for _, m in ms], yerr=error_bars([m for _, m in ms]), fmt=fmt,
                        color=f"C{j}", capsize=4, lw=2 if n == 0 else 1,
                        label=(f"{name}: " if len(names) > 1 else "") + label)
    plots.finish_speedup_axes(ax, sorted({r.rate for r in rows}), "arrival rate, req/s (Poisson, open loop)",
                              "Speedup a user sees, same arrivals " + ("(95% intervals)" if intervals else "(one run: no interval)"))
    return fig


def _rates_figure(rows: list[RateRow]) -> Any:
    """Open-loop levels against the arrival rate asked (means over repeats): TTFT p95 and per-token
    p50 per variant, and speculation's speedups over the baseline at the same arrivals."""
    fig, axes = plots.pyplot().subplots(1, 3, figsize=(15, 4.2))
    for j, variant in enumerate(dict.fromkeys(r.variant for r in rows)):
        mine = [r for r in rows if r.variant == variant]
        for ax, value, style, label in ((axes[0], lambda r: r.ttft_ms.p95, "o-", variant),
                                        (axes[1], lambda r: r.tpot_ms.p50, "o-", variant),
                                        (axes[2], lambda r: r.tpot_p50_speedup, "o-", f"{variant}: per-token p50"),
                                        (axes[2], lambda r: r.e2e_mean_speedup, "d--", f"{variant}: e2e mean")):
            pts = _known(*_means(mine, value, lambda r: r.rate))
            if pts:
                ax.plot(*zip(*pts), style, color=f"C{j}", label=label)
    axes[2].axhline(1.0, color="grey", lw=1)
    rates = sorted({r.rate for r in rows})
    for ax, title, ylabel in ((axes[0], "Time to first token p95", "ms"),
                              (axes[1], "Per-token latency p50", "ms"),
                              (axes[2], "Speedup over the baseline, same arrivals", "x baseline")):
        _axis(ax, title, ylabel, rates, "arrival rate asked, req/s (Poisson, open loop)", base=10)
    axes[0].set_yscale("log")
    fig.suptitle("Open loop: latency and speedup against the arrival rate")
    return fig
