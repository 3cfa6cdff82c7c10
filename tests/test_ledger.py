"""docs/results.md reads as a page: short rows, each with a detail section, no line over 200 characters."""

from __future__ import annotations

import re
from pathlib import Path

LEDGER = Path(__file__).resolve().parent.parent / "docs" / "results.md"


def test_the_ledger_has_short_lines_and_a_detail_section_per_row() -> None:
    text = LEDGER.read_text()
    assert max(len(line) for line in text.splitlines()) <= 200
    rows = re.findall(r"^\| \[([RS]\d+)\]\(#([rs]\d+)\) \| (\d{4}-\d\d-\d\d)[^|]* \|", text, re.M)
    assert rows and all(rid.lower() == anchor for rid, anchor, _ in rows)
    ids = [rid for rid, _, _ in rows]
    assert len(ids) == len(set(ids)), "a row number used twice"
    sections = re.findall(r"^### ([RS]\d+)$", text, re.M)
    assert sorted(sections) == sorted(ids), "every row has one detail section, and every section a row"
    for rid in ids:
        body = text.split(f"### {rid}\n", 1)[1].split("\n### ", 1)[0]
        for field in ("figure", "value", "commit", "command", "where"):
            assert re.search(rf"^- {field}: ", body, re.M), f"{rid} lacks its {field}"
