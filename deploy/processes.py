"""Child process groups that cannot outlive the kit: die with their parent, stop as one.

vLLM's API server spawns an engine core and workers; Locust may spawn workers. Each is started
as the leader of its own process group (`start_new_session=True`) so one signal reaches all of
it, and with Linux's parent-death signal so that if the kit itself is killed (SIGKILL, the OOM
killer) the leader gets SIGTERM and takes its own children down, instead of holding the port,
the memory and the GPU.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable

log = logging.getLogger("specdeploy")

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child receive `sig` when this process dies (Linux only).

    The kernel sends it when the *thread* that started the child exits, so start long-lived
    children from the main thread (the kit does)."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def arm() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send `sig` to the process group `proc` leads (nothing if it is already gone)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(proc: subprocess.Popen, first: int = signal.SIGTERM, grace_s: float = 30,
               name: str = "process") -> int:
    """`first` to the group, SIGKILL to whatever is left after `grace_s`; returns the exit code.

    The SIGKILL always goes out, also when an exception (a second Ctrl-C) interrupts the wait,
    because children (vLLM's workers) can outlive the leader."""
    try:
        if proc.poll() is None:
            signal_group(proc, first)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0f s of %s; killing it", name, grace_s,
                            signal.Signals(first).name)
    finally:
        signal_group(proc, signal.SIGKILL)
        proc.wait()
    return proc.returncode
