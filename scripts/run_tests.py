"""`make test`: the suite in two lanes side by side, each a pytest session of its own.

- The engine lane: every test that serves a vLLM engine (`tests/conftest.py`'s `serves`), one at a
  time as before: an engine starting beside a serving one starves it on 2 cores.
- The light lane: the rest (reports, plans, configs, Locust against small fake servers). It starts
  no engine (a test that does fails there and says so), and mostly keeps one core busy while the
  engine lane waits on imports and engine starts.

The engine lane prints as it goes; the light lane's output is kept in its log folder
(`logs/tests-light/pytest.txt`; `$SPECDEPLOY_TEST_LOGS` moves both lanes' folders) and printed after it. The exit code is the first failing lane's, else 0 (a lane that found no test,
where the arguments pick tests of the other lane only, does not fail the run).

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


def main(args: list[str]) -> int:
    # Each lane its own log folder (the light lane's test that an engine started reads its own engine-start
    # log) and its own cache (`--lf` and `--ff` keep both lanes' failures).
    logs = Path(os.environ.get("SPECDEPLOY_TEST_LOGS", "logs/tests")).absolute()
    folders = {"engine": logs, "light": logs.with_name(logs.name + "-light")}

    def lane(name: str, **streams: Any) -> subprocess.Popen[bytes]:
        env = {**os.environ, "SPECDEPLOY_TEST_LANE": name, "SPECDEPLOY_TEST_LOGS": str(folders[name])}
        return subprocess.Popen([sys.executable, "-m", "pytest", "-o", f"cache_dir=.pytest_cache/{name}", *args],
                                env=env, **streams)

    light_output = folders["light"] / "pytest.txt"
    light_output.parent.mkdir(parents=True, exist_ok=True)
    with open(light_output, "w", encoding="utf-8") as sink:
        light = lane("light", stdout=sink, stderr=subprocess.STDOUT)
        engine = lane("engine")

        def forward(signum: int, frame: object) -> None:  # a CI cancel or `timeout` reaches both sessions
            for proc in (engine, light):
                if proc.poll() is None:
                    proc.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        codes = {"engine": _wait(engine)}
        codes["light"] = _wait(light)
    print(f"\n{'=' * 30} light lane (no engine): {light_output} {'=' * 30}", flush=True)
    print(light_output.read_text(encoding="utf-8", errors="replace"), end="", flush=True)
    print(f"\nlanes: engine exit {codes['engine']}, light exit {codes['light']}", flush=True)
    failed = [code for code in codes.values() if code not in (0, NO_TESTS)]
    if failed:
        return failed[0]
    return NO_TESTS if all(code == NO_TESTS for code in codes.values()) else 0


def _wait(proc: subprocess.Popen[bytes]) -> int:
    """The lane's exit code; Ctrl-C reaches both sessions from the terminal, each tears down its servers."""
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            continue


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
