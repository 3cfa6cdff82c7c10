"""`make test`'s lanes (`scripts/run_tests.py`): each test in exactly one, and the run's exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _lanes(tmp_path: Path, *args: str, logs: str | None = None) -> subprocess.CompletedProcess[str]:
    # From tmp_path, with the default log folders unless `logs`: the nested sessions' logs and the light
    # lane's output stay out of this session's.
    env = {k: v for k, v in os.environ.items() if k not in ("SPECDEPLOY_TEST_LOGS", "SPECDEPLOY_TEST_LANE")}
    env.update({"SPECDEPLOY_TEST_LOGS": logs} if logs else {})
    return subprocess.run([sys.executable, str(REPO / "scripts" / "run_tests.py"), "-q", "-p", "no:cacheprovider",
                           *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_a_selection_of_one_lane_passes_and_an_empty_one_is_pytests_no_tests(tmp_path: Path) -> None:
    done = _lanes(tmp_path, str(REPO / "tests" / "test_content.py"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "lanes: engine exit 5, light exit 0, own exit 5" in done.stdout  # the content tests start no engine
    assert "7 passed" in (tmp_path / "logs" / "tests-light" / "pytest.txt").read_text()
    assert "7 deselected" in (tmp_path / "logs" / "tests-own" / "pytest.txt").read_text()
    # Log folders given: each lane its own, the others' beside the one named.
    nothing = _lanes(tmp_path, str(REPO / "tests" / "test_content.py"), "-k", "no_test_is_named_so",
                     logs=str(tmp_path / "given"))
    assert nothing.returncode == 5 and "lanes: engine exit 5, light exit 5, own exit 5" in nothing.stdout
    assert "7 deselected" in (tmp_path / "given-light" / "pytest.txt").read_text()
    assert "7 deselected" in (tmp_path / "given-own" / "pytest.txt").read_text()
    assert (tmp_path / "given" / "engine-starts.jsonl").is_file()


def test_a_failing_lane_fails_the_run(tmp_path: Path) -> None:
    (tmp_path / "test_fails.py").write_text("def test_fails():\n    assert 1 == 2\n")
    done = _lanes(tmp_path, str(tmp_path / "test_fails.py"))  # outside tests/: no lanes, each runs it
    assert done.returncode == 1 and "lanes: engine exit 1, light exit 1, own exit 1" in done.stdout, done.stdout[-2000:]
