"""DRY_RUN=1 on every target that starts servers prints a plan and starts nothing; a make variable a
target does not read is refused rather than dropped (issue 45: `make capacity ... DRY_RUN=1` once ran)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from deploy import reference

REPO = Path(__file__).resolve().parent.parent
# The .venv is set up already: STAMP names a file newer than what it is built from, so make never
# installs. (STAMP=Makefile made make remake the Makefile itself, running the installer,
# wherever pyproject.toml was the newer file, as in a fresh clone.)
_STAMP = Path(tempfile.mkdtemp(prefix="specdeploy-stamp-")) / "installed"
_STAMP.touch()
MAKE = ["make", "--no-print-directory", f"STAMP={_STAMP}"]
STARTS_SERVERS = {"serve": [], "loadtest": [], "capacity": ["SLO=ttft_p95=1000ms"], "advise": [], "tune": [],
                  "distill": [], "bench-drafters": [], "soak": []}


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS")}
    return subprocess.run([*MAKE, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("target", sorted(STARTS_SERVERS))
def test_dry_run_reaches_every_target_that_starts_servers(target: str) -> None:
    done = _make("-n", target, "DRY_RUN=1", *STARTS_SERVERS[target])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.replace("\\\n", " ").splitlines()  # a recipe line continued with a backslash
    command = next(line for line in lines if line.startswith(".venv/bin/python -m"))
    assert "--dry-run" in command.split(), command


def test_a_variable_the_target_does_not_take_is_refused() -> None:
    done = _make("-n", "capacity", "SLO=ttft_p95=1000ms", "USERS=1,32")
    assert done.returncode != 0 and "make capacity does not take USERS" in done.stderr, done.stderr
    assert "python" not in done.stdout  # refused before any recipe
    assert _make("-n", "soak", "CONFIG=llama70b-7b.yaml").returncode != 0  # soak serves the embedded default only


def test_each_targets_variables_are_the_ones_its_help_names() -> None:
    text = (REPO / "Makefile").read_text()
    takes = {m[1]: set(m[2].split()) for m in re.finditer(r"^TAKES_([\w-]+) := (.*)$", text, re.M)}
    named: dict[str, set[str]] = {}
    for usage, _ in reference.parse_help(reference.make_help()).commands:
        if usage.startswith("make "):
            named.setdefault(usage.split()[1], set()).update(reference.VARIABLE.findall(usage))
    for target, variables in named.items():
        if target in takes:
            assert takes[target] == variables, f"make {target}: TAKES_ {takes[target]} but help names {variables}"
    assert set(STARTS_SERVERS) <= set(takes)


@pytest.mark.parametrize("argv, heading", [
    (["loadtest", "capacity", "llama70b-7b.yaml", "--slo", "ttft_p95=1000ms", "--dry-run"], "capacity plan (dry run"),
    (["tuning", "advise", "--dry-run"], "advise plan (dry run"),
    (["tuning", "tune", "--dry-run", "--batches", "1,8"], "tune plan (dry run"),
    (["distill", "--dry-run"], "distill plan (dry run"),
    (["loadtest", "run", "--drafters", "all", "--workload", "categories", "--dry-run"], "load-test plan (dry run"),
    (["tuning", "soak", "--dry-run"], "soak plan (dry run"),
])
def test_each_dry_run_prints_its_plan_and_writes_nothing(tmp_path: Path, argv: list[str], heading: str) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("SPECDEPLOY_CACHE", None)
    reports = set((REPO / "reports").glob("*")) if (REPO / "reports").is_dir() else set()
    done = subprocess.run([sys.executable, "-m", *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(heading) and ("estimated" in done.stdout or "server starts" in done.stdout), done.stdout
    assert "started vLLM" not in done.stderr and "Traceback" not in done.stderr
    assert (set((REPO / "reports").glob("*")) if (REPO / "reports").is_dir() else set()) == reports
