"""A progress bar over a Locust run: the sweep's levels and the soak's phases count the request
records as the Locust processes write them."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from tqdm import tqdm


class Progress:
    """A tqdm bar fed by counting request records as the Locust processes write them."""

    def __init__(self, title: str, total: int | None, records_dir: Path, duration_s: float | None = None):
        self.records_dir = records_dir
        self.started = time.monotonic()
        self.bar = tqdm(total=total or (int(duration_s) if duration_s else None), desc=title,
                        unit="req" if total else "s", file=sys.stderr, dynamic_ncols=True, leave=True, mininterval=1.0,
                        disable=os.environ.get("SPECDEPLOY_NO_PROGRESS") == "1")
        self.by_time = not total

    def tick(self) -> None:
        lines, failed = 0, 0
        for path in self.records_dir.glob("records-*.jsonl"):
            text = path.read_text(encoding="utf-8", errors="replace")
            lines += text.count("\n")
            failed += text.count('"ok": false')
        # Postfix first, without its own refresh: the bar redraws (at most once a second) on update.
        self.bar.set_postfix_str(f"{failed} failed", refresh=False)
        if self.by_time:
            elapsed = int(time.monotonic() - self.started)
            self.bar.update(max(0, min(elapsed, self.bar.total or elapsed) - self.bar.n))
        else:
            self.bar.update(lines - self.bar.n)

    def __enter__(self) -> Progress:
        if self.records_dir.exists():
            shutil.rmtree(self.records_dir)  # a re-run into the same folder starts clean
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()
