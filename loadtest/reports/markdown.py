"""Markdown tables for every report: one builder, so each escapes its cells and aligns its columns
the same way (tuning/ and distill/ use it too)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loadtest.measurement.figures import Interval


def cell(text: object) -> str:
    """A table cell as Markdown: a raw `|` would end the cell and a line break the row (error
    messages have both); a backslash is doubled so that it cannot escape what follows it."""
    return " ".join(str(text).replace("\\", "\\\\").replace("|", "\\|").split())


def table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """A Markdown table. `align` has one letter a column, `l` (the default for columns it does not
    reach) or `r` for figures, e.g. "lrr"."""
    marks = ["---:" if i < len(align) and align[i] == "r" else "---" for i in range(len(header))]
    lines = [_row(header), "|" + "|".join(marks) + "|"]
    lines += [_row(r) for r in rows]
    return "\n".join(lines)


def _row(cells: Sequence[object]) -> str:
    return "|" + "|".join(f" {text} " if text else " " for text in map(cell, cells)) + "|"


def speedup(value: float | None) -> str:
    """`1.23x`, or "-" when there is none."""
    return "-" if value is None else f"{value:.2f}x"


def interval_text(m: Interval | None, label: str = "") -> str:
    """`1.23x (1.10-1.31)`: a mean speedup and its 95% interval (after `label`, e.g. "95% ") where it
    has one; `-` without a mean."""
    if not m or m.mean is None:
        return "-"
    return f"{m.mean:.2f}x" + (f" ({label}{m.low:.2f}-{m.high:.2f})" if m.low is not None else "")


def figure(value: Any, digits: int = 1, pct: bool = False) -> str:
    """A figure for a table cell: "-" when there is none, thousands separated, or a whole percent."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if pct:
        return f"{100 * value:.0f}%"
    return f"{value:,.{digits}f}"
