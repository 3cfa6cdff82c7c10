"""`make test`: the suite in three lanes, each a pytest session of its own (`tests/conftest.py`'s `lane`).

- The engine lane: the tests that share the session's servers (the pool, started in the background
  as the first tests run), one at a time as before.
- The light lane: the tests that start no engine (reports, plans, configs, Locust against small fake
  servers); a test there that starts one fails and says so.
- The own lane: the tests that start engines of their own (`make serve`'s stops, a sweep that starts
  its servers), started when the light lane ends.

An engine serves on one thread, so the engine lane keeps about one of 2 cores busy; the light lane
and then the own lane use the other. The engine lane prints as it goes; the others' output is kept
in their log folders (`logs/tests-light/pytest.txt`, `logs/tests-own/pytest.txt`;
`$SPECDEPLOY_TEST_LOGS` moves every lane's folder) and printed after it. The exit code is the first
failing lane's, else 0 (a lane that found no test, where the arguments pick tests of other lanes
only, does not fail the run).

usage: python scripts/run_tests.py [pytest arguments]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

NO_TESTS = 5  # pytest's exit code when its selection is empty
INTERRUPTED = 2  # ... and when Ctrl-C or a signal stopped it
LANES = ("engine", "light", "own")


def main(args: list[str]) -> int:
    # Each lane its own log folder (the light lane's test that an engine started reads its own engine-start
    # log) and its own cache (`--lf` and `--ff` keep every lane's failures).
    logs = Path(os.environ.get("SPECDEPLOY_TEST_LOGS", "logs/tests")).absolute()
    folders = {name: logs if name == "engine" else logs.with_name(f"{logs.name}-{name}") for name in LANES}
    running: list[subprocess.Popen[bytes]] = []

    def lane(name: str, **streams: Any) -> subprocess.Popen[bytes]:
        env = {**os.environ, "SPECDEPLOY_TEST_LANE": name, "SPECDEPLOY_TEST_LOGS": str(folders[name])}
        running.append(subprocess.Popen([sys.executable, "-m", "pytest", "-o", f"cache_dir=.pytest_cache/{name}",
                                         *args], env=env, **streams))
        return running[-1]

    def forward(signum: int, frame: object) -> None:  # a CI cancel or `timeout` reaches every session
        for proc in running:
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    outputs = {name: folders[name] / "pytest.txt" for name in ("light", "own")}
    for output in outputs.values():
        output.parent.mkdir(parents=True, exist_ok=True)
    with open(outputs["light"], "wb") as light_sink, open(outputs["own"], "wb") as own_sink:
        light = lane("light", stdout=light_sink, stderr=subprocess.STDOUT)
        engine = lane("engine")
        codes = {"light": _wait(light)}
        # Not after Ctrl-C or a signal, which stopped the light lane too.
        codes["own"] = INTERRUPTED if codes["light"] == INTERRUPTED else \
            _wait(lane("own", stdout=own_sink, stderr=subprocess.STDOUT))
        codes["engine"] = _wait(engine)
    for name, output in outputs.items():
        print(f"\n{'=' * 30} {name} lane: {output} {'=' * 30}", flush=True)
        print(output.read_text(encoding="utf-8", errors="replace"), end="", flush=True)
    print("\nlanes: " + ", ".join(f"{name} exit {codes[name]}" for name in LANES), flush=True)
    failed = [codes[name] for name in LANES if codes[name] not in (0, NO_TESTS)]
    if failed:
        return failed[0]
    return NO_TESTS if all(code == NO_TESTS for code in codes.values()) else 0


def _wait(proc: subprocess.Popen[bytes]) -> int:
    """The lane's exit code; Ctrl-C reaches every session from the terminal, each tears down its servers."""
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            continue


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
