"""Render stored results with this code, to prove a refactor leaves every report as it was.

    python scripts/render_proof.py OUT FOLDER...

For each report folder (a sweep's results.json, a capacity search's capacity.json, a soak's
soak.json, a pay map's paymap.json), copies what it reads into OUT/<folder name>, renders its
report there with the code on PYTHONPATH, and writes OUT/digests.txt: one line per rendered text
file (its path and SHA-256; links to the kit's docs normalised). Run it with the old code and the new into two
folders, then `diff old/digests.txt new/digests.txt` (and `diff -r` the folders for what differs).
`render_proof.py --digest OUT` writes OUT/digests.txt again from what OUT holds."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

TEXT = (".md", ".html", ".txt")
DOC_LINK = re.compile(r"(\.\./)+([\w.-]+/)*docs/")
"""A report's links to the kit's docs are relative to where the checkout is: compared without it."""


def render(folder: Path, out: Path) -> None:
    if (folder / "results.json").is_file():
        from loadtest.measurement.results import SweepResults
        from loadtest.reports.report import write_report

        shutil.copy(folder / "results.json", out / "results.json")
        write_report(SweepResults.load(out), out)
    if (folder / "capacity.json").is_file():
        from loadtest.measurement.results import CapacityResults
        from loadtest.reports import capacity_report

        shutil.copy(folder / "capacity.json", out / "capacity.json")
        capacity_report.write(CapacityResults.load(out), out)
    if (folder / "soak.json").is_file():
        from tuning import soak_report

        soak_report.write(json.loads((folder / "soak.json").read_text()), out)
    if (folder / "paymap.json").is_file():
        from tuning import paymap

        (out / "paymap.md").write_text(paymap.describe(json.loads((folder / "paymap.json").read_text())))


def digests(out_root: Path, out: Path) -> list[str]:
    """One line per rendered text file under `out`: its path and its SHA-256, paths normalised."""
    lines = []
    for path in sorted(p for p in out.rglob("*") if p.suffix in TEXT):
        text = DOC_LINK.sub("<repo>/docs/", path.read_text(encoding="utf-8").replace(str(out), "<out>"))
        lines.append(f"{path.relative_to(out_root)} {hashlib.sha256(text.encode()).hexdigest()[:16]}")
    return lines


def main(argv: list[str]) -> int:
    if argv[0] == "--digest":  # digests.txt again from a folder rendered before (refusals kept)
        out_root = Path(argv[1])
        kept = [line for line in (out_root / "digests.txt").read_text().splitlines() if " refused: " in line]
        lines = kept + [line for out in sorted(p for p in out_root.iterdir() if p.is_dir())
                        for line in digests(out_root, out)]
        (out_root / "digests.txt").write_text("\n".join(sorted(lines)) + "\n")
        return 0
    out_root, folders = Path(argv[0]), [Path(a) for a in argv[1:]]
    lines = []
    for folder in folders:
        out = out_root / folder.name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        try:
            render(folder, out)
        except Exception as exc:  # noqa: BLE001 - a file the code refuses is a result too, compared as one
            lines.append(f"{folder.name} refused: {type(exc).__name__}: {str(exc).replace(str(out), '<out>')[:200]}")
        lines += digests(out_root, out)
    (out_root / "digests.txt").write_text("\n".join(sorted(lines)) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
