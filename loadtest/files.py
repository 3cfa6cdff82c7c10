"""Writing result files so that a crash or a full disk never costs what was already measured."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_atomic(path: Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file and a rename: a reader sees the old file
    or the new one, never half of one, and a failed write (disk full) leaves the old one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json(path: Path, data: Any) -> Path:
    """`data` as indented JSON; a typed result inside it as its own JSON (`to_json`), paths as text."""
    return write_atomic(path, json.dumps(data, indent=2, default=_as_json) + "\n")


def _as_json(value: Any) -> Any:
    return value.to_json() if hasattr(value, "to_json") else str(value)


def write_result(out: Path, stem: str, data: dict[str, Any], text: str) -> None:
    """A command's result as `<stem>.json` (for programs) and `<stem>.md` (for people) in `out`."""
    write_json(out / f"{stem}.json", data)
    write_atomic(out / f"{stem}.md", text)


def bullet_sections(result: object, titles: dict[str, str]) -> list[str]:
    """Markdown lines: for each field named in `titles` that the result has items in, its title and
    its items as bullets."""
    lines: list[str] = []
    for name, title in titles.items():
        items = getattr(result, name, None)
        if items:
            lines += ["", title, "", *[f"- {item}" for item in items]]
    return lines
