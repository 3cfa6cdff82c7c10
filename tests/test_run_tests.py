"""`make test`'s two lanes (`scripts/run_tests.py`): each test in exactly one, and the run's exit code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _lanes(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # From tmp_path: the nested sessions' logs and the light lane's output stay out of this session's.
    return subprocess.run([sys.executable, str(REPO / "scripts" / "run_tests.py"), "-q", "-p", "no:cacheprovider",
                           *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_a_selection_of_one_lane_passes_and_an_empty_one_is_pytests_no_tests(tmp_path: Path) -> None:
    done = _lanes(tmp_path, str(REPO / "tests" / "test_content.py"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "lanes: engine exit 5, light exit 0" in done.stdout  # the content tests start no engine
    assert "7 passed" in (tmp_path / "logs" / "tests-light" / "pytest.txt").read_text()
    nothing = _lanes(tmp_path, str(REPO / "tests" / "test_content.py"), "-k", "no_test_is_named_so")
    assert nothing.returncode == 5 and "lanes: engine exit 5, light exit 5" in nothing.stdout


def test_a_failing_lane_fails_the_run(tmp_path: Path) -> None:
    (tmp_path / "test_fails.py").write_text("def test_fails():\n    assert 1 == 2\n")
    done = _lanes(tmp_path, str(tmp_path / "test_fails.py"))  # outside tests/: no lanes, both run it
    assert done.returncode == 1 and "lanes: engine exit 1, light exit 1" in done.stdout, done.stdout[-2000:]
