"""Plots for the reports: matplotlib without a display, and a figure saved and released in one call
(tuning/ uses it too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend: reports are written on servers and in CI, with no display.
    Imported when a plot is drawn, so that the commands that draw none start without it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path, dpi: float | None = None) -> Path:
    """Write the figure (at `dpi`, else the figure's own) and release it: pyplot keeps every open figure."""
    fig.savefig(path, dpi=dpi if dpi is not None else "figure")
    pyplot().close(fig)
    return path


def speedup_axes() -> tuple[Any, Any]:
    """A speedup picture for a report's first screen, with its 1.0 line: 600 px wide on the page, its
    text readable at that size."""
    fig, ax = pyplot().subplots(figsize=(6.4, 4.3), dpi=100)
    ax.axhline(1.0, color="black", lw=1.2, zorder=1)
    ax.text(0.01, 1.0, "1.0x: no gain", transform=ax.get_yaxis_transform(), va="bottom", ha="left", fontsize=9,
            color="#444")
    ax.grid(True, alpha=0.3)
    return fig, ax


def finish_speedup_axes(ax: Any, xs: list[float], xlabel: str, title: str) -> None:
    """Batch sizes or rates on a log axis labelled as plain numbers, room for the labels, titles."""
    from matplotlib.ticker import FuncFormatter, NullLocator

    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(xs) / 1.6, max(xs) * 2.4)  # room for the label beside the last point
    low, high = ax.get_ylim()
    low, high = min(low, 0.8), max(high, 1.2)
    ax.set_ylim(low, high + 0.08 * (high - low))  # headroom: the top point's label stays off the title
    ax.set_xlabel(xlabel, fontsize=11)
    ax.set_ylabel("speedup (x the baseline)", fontsize=11)
    ax.set_title(title, fontsize=12)
    ax.tick_params(labelsize=10)
    ax.legend(fontsize=9, loc="best")
