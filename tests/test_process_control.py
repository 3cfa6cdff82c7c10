"""The launcher's process control, on a child that floods its output (no engine needed: the
engine's own stop and orphan behaviour is tested in test_serve_e2e.py)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from deploy import free_port
from deploy.engine_args import LaunchPlan
from deploy.launcher import Server
from deploy.processes import stop_group

FLOOD = "import sys\nfor i in range(40000):\n    print(f'line {i} ' + 'x' * 60)\nprint('the end')\n"


def _plan(code: str) -> LaunchPlan:
    return LaunchPlan(argv=[sys.executable, "-c", code], env={}, host="127.0.0.1", port=free_port(),
                      served_name="flood", speculative_config=None, device="cpu")


def test_a_log_that_cannot_be_written_never_freezes_the_server(caplog) -> None:
    """2.6 MB of output into a full disk (/dev/full): the reader must keep draining the pipe, or
    the child blocks on its next line once the pipe's 64 KiB fill, as vLLM would."""
    server = Server(_plan(FLOOD), log_path=Path("/dev/full"))
    with caplog.at_level(logging.WARNING, logger="specdeploy"):
        server.start()
        try:
            assert server.process is not None
            assert server.process.wait(timeout=60) == 0, "the child froze on a full pipe"
        finally:
            server.stop()
    assert server.tail[-1] == "the end"
    assert server.log_error and "No space left on device" in server.log_error
    assert any("cannot write the server log /dev/full" in r.getMessage() for r in caplog.records)


def test_stop_group_kills_children_that_ignore_the_polite_signal() -> None:
    """A group whose leader and child ignore SIGTERM (issue 13 saw a vLLM server do it): stop_group
    escalates to SIGKILL for the whole group after its grace period."""
    code = ("import signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
            "print('up', flush=True)\n"
            "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    started = time.monotonic()
    assert stop_group(proc, signal.SIGTERM, grace_s=1) == -signal.SIGKILL
    assert time.monotonic() - started < 10
    deadline = time.monotonic() + 5
    while True:  # a killed child is a zombie until init reaps it: count only the living
        alive = [p.pid for p in psutil.process_iter(["status"]) if _group_of(p.pid) == proc.pid
                 and p.info["status"] != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not alive, f"left in the group: {alive}"


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
