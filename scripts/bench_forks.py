"""What a run of vLLM's benchmark costs before it sends a request: started as a process of its own
(`python -m loadtest.traffic.vllm_bench`, as every level once did) against forked from the process
that imported it once (`vllm_bench.Forks`). Each run parses `--help` and exits, so the time is the
start alone; the two ways take turns, so the machine's load falls on both.

usage: python scripts/bench_forks.py [RUNS] [OUT.json]   (default 5 runs each, printed as JSON)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loadtest.traffic.vllm_bench import Forks


def main(runs: int = 5, out: Path | None = None) -> dict:
    forks, env = Forks(), dict(os.environ)
    seconds: dict[str, list[float]] = {"process": [], "forked": []}
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        assert forks.run(["--help"], Path(tmp) / "first.log", env, 600) == 0
        first = time.monotonic() - started  # the fork server's own import, paid once a process
        for _ in range(runs):
            started = time.monotonic()
            subprocess.run([sys.executable, "-m", "loadtest.traffic.vllm_bench", "--help"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            seconds["process"].append(time.monotonic() - started)
            started = time.monotonic()
            assert forks.run(["--help"], Path(tmp) / "run.log", env, 600) == 0
            seconds["forked"].append(time.monotonic() - started)
    figures = {way: {"median_s": round(statistics.median(s), 3), "min_s": round(min(s), 3),
                     "max_s": round(max(s), 3)} for way, s in seconds.items()}
    figures["fork_server_first_run_s"] = round(first, 3)
    figures["runs"] = runs
    figures["saved_per_run_s"] = round(figures["process"]["median_s"] - figures["forked"]["median_s"], 3)
    if out:
        out.write_text(json.dumps(figures, indent=2) + "\n")
    return figures


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(main(int(args[0]) if args else 5, Path(args[1]) if len(args) > 1 else None), indent=2))
