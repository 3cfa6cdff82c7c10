"""End to end on the real vLLM CPU engine serving the embedded default, over HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests

from conftest import port_still_held
from deploy import free_port
from deploy.launcher import port_is_free

ROOT = Path(__file__).resolve().parent.parent


def make(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "-s", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=timeout)


def test_dry_run_prints_the_command_and_starts_nothing() -> None:
    port = free_port()
    result = make("serve", "DRY_RUN=1", f"SET=server.port={port} speculation.num_speculative_tokens=3")
    assert result.returncode == 0, result.stderr
    assert "vllm.entrypoints.openai.api_server" in result.stdout
    assert '"num_speculative_tokens":3' in result.stdout and f"--port {port}" in result.stdout
    assert port_is_free("127.0.0.1", port)


def test_bad_config_exits_nonzero_with_a_readable_message_and_no_engine(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ntarget:\n  model: embedded:target\nspeculation:\n  drafter: small_model\n"
                   "  model: embedded:draft\n  num_speculative_tokns: 4\n")
    started = time.monotonic()
    result = make("serve", f"CONFIG={bad}")
    assert result.returncode != 0
    assert "speculation.num_speculative_tokns: unknown key" in result.stderr
    assert "did you mean 'num_speculative_tokens'" in result.stderr
    assert "vLLM command" not in result.stdout, "an engine command was issued for a bad config"
    assert time.monotonic() - started < 60


@pytest.mark.engine
def test_engine_start_failure_exits_nonzero_with_the_engines_error_line() -> None:
    # Valid for specdeploy, refused by vLLM itself: longer than the model's 2048 positions.
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "deploy", "serve", "--no-spec", "--set", "target.max_model_len=100000",
         "--set", f"server.port={port}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1
    last_error = [ln for ln in result.stderr.splitlines() if "ERROR" in ln][-1]
    assert "vLLM exited with code" in last_error and "max_model_len" in last_error, result.stderr[-3000:]
    assert not port_still_held(port)


def _gone(processes: list[psutil.Process], within_s: float) -> list[int]:
    """The pids still running after up to `within_s` seconds."""
    def running(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + within_s
    while True:
        alive = [p.pid for p in processes if running(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def _await_ready(proc: subprocess.Popen[str], within_s: float = 600) -> None:
    """Read `make serve`'s output until it says it is ready; an exit before that fails the tests."""
    assert proc.stdout is not None
    deadline = time.monotonic() + within_s
    for line in proc.stdout:
        if line.startswith("ready after"):
            return
        if time.monotonic() > deadline:
            pytest.fail("server did not become ready")
    pytest.fail(f"serve exited before ready with code {proc.wait()}")


STOPS = ["SIGHUP", "two SIGINTs", "SIGKILL"]
SERVED = "embedded-code"
"""What the stop tests serve: the code pair starts in a fraction of the default's time, and how a
server stops does not depend on its model."""


@pytest.fixture(scope="module")
def serving() -> Iterator[dict[str, tuple[subprocess.Popen[str], int]]]:
    """One `make serve` (its Python entry) per way of stopping it, started together: their
    start-ups, mostly single-threaded imports, overlap on the machine's cores."""
    ports: list[int] = []
    while len(ports) < len(STOPS):
        if (port := free_port()) not in ports:
            ports.append(port)
    started = {how: (subprocess.Popen([sys.executable, "-m", "deploy", "serve", SERVED, "--no-spec", "--set",
                                       f"server.port={port}"], cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True), port)
               for how, port in zip(STOPS, ports)}
    try:
        # All three ready before any test sends a request: an engine still starting beside a serving
        # one takes the cores its first forward pass waits for (seen: a request of 8 tokens unanswered
        # for two minutes on 2 cores).
        for proc, _ in started.values():
            _await_ready(proc)
        yield started
    finally:
        for proc, _ in started.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for child in psutil.Process().children(recursive=True):  # never leak an engine into later tests
            try:
                if "api_server" in " ".join(child.cmdline()):
                    child.kill()
            except psutil.Error:
                pass  # gone, or a zombie


@pytest.mark.engine
@pytest.mark.parametrize("how", STOPS)
def test_serve_leaves_nothing_running_however_it_is_stopped(how: str, serving) -> None:
    """A closed terminal (SIGHUP) stops cleanly; a second Ctrl-C during the stop still ends it;
    a launcher killed outright (SIGKILL, the OOM killer) takes its engine with it. While it
    serves, a second server on the same port is one line and exit 2, not a traceback."""
    proc, port = serving[how]
    try:
        assert proc.poll() is None, f"serve exited with code {proc.returncode}"
        model = requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=60).json()["data"][0]["id"]
        reply = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120, json={
            "model": model, "prompt": "def f(", "max_tokens": 8, "temperature": 0})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 8
        engine = psutil.Process(proc.pid).children(recursive=True)
        assert engine, "no engine processes under the server"
        if how == "SIGHUP":
            busy = subprocess.run([sys.executable, "-m", "deploy", "serve", SERVED, "--no-spec", "--set", f"server.port={port}"],
                                  cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert busy.returncode == 2 and "already in use" in busy.stderr, busy.stderr[-2000:]
            assert "Traceback" not in busy.stderr + busy.stdout
            proc.send_signal(signal.SIGHUP)
            assert proc.wait(timeout=60) == 128 + signal.SIGHUP
        elif how == "two SIGINTs":
            proc.send_signal(signal.SIGINT)
            time.sleep(0.3)  # inside the graceful stop
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=20) == 128 + signal.SIGINT
        else:
            proc.kill()
            proc.wait(timeout=10)
        leftovers = _gone(engine, within_s=60)
        assert not leftovers, f"engine processes left running after {how}: {leftovers}"
        held = port_still_held(port)
        assert not held, f"the engine kept port {port} 30 s after {how}: held by {held}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
