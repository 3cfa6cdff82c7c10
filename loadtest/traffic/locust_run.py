"""Run Locust headless as subprocesses: one local process, or a master plus N workers.

Locust writes its own CSV and HTML reports; our user writes one JSON line per request into
`records_dir`, which is what the progress bar counts and what the report is built from.
Everything is bounded: a hard deadline, a `should_abort` check (e.g. the server died), and
the whole process group of every Locust process is killed on the way out.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import singledispatch
from pathlib import Path

from deploy import free_port
from deploy.processes import die_with_parent, stop_group
from loadtest.measurement.results import Closed, Load, Open
from loadtest.traffic.request_settings import RequestSettings

log = logging.getLogger("specdeploy.loadtest")
LOCUSTFILE = Path(__file__).with_name("locustfile.py")


@dataclass
class LocustJob:
    host: str
    load: Load
    """Closed(users): each user waits for its response; Open(rate): requests arrive by a Poisson
    process at that many a second, whatever is in flight (needs `requests`)."""
    records_dir: Path
    model: str
    request: RequestSettings = field(default_factory=RequestSettings)
    requests: int = 0
    """Requests in all, shared by the users (0: run for `duration_s` instead)."""
    duration_s: float | None = None
    workers: int = 0
    csv_prefix: Path | None = None
    html: Path | None = None
    log_path: Path | None = None
    api_key_env: str = ""
    seed: int = 0
    """Open loop: seed of the arrival times; the same seed gives the same schedule (`loadtest.traffic.arrivals`)."""
    repeat_head: int = 0
    """Open loop: the last this many arrivals repeat the first's gaps and prompts (a soak's windows)."""


@singledispatch
def pacing(load: Load, job: LocustJob) -> tuple[int, list[str]]:
    """The users Locust starts for `load`, and our locustfile's options that pace them."""
    raise TypeError(f"not a load: {load!r}")


@pacing.register
def _(load: Closed, job: LocustJob) -> tuple[int, list[str]]:
    return load.users, []


@pacing.register
def _(load: Open, job: LocustJob) -> tuple[int, list[str]]:
    if job.requests <= 0:
        raise ValueError("an open-loop Locust job needs a request count")
    # One dispatcher per Locust process sends that process's share of the schedule.
    options = ["--rate", repr(float(load.rate)), "--seed", str(job.seed)]
    return max(1, job.workers), options + (["--repeat-head", str(job.repeat_head)] if job.repeat_head else [])


@dataclass
class LocustOutcome:
    exit_code: int | None
    aborted: str | None = None
    """Why we stopped Locust early (deadline, server gone), else None."""
    log_tail: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    """CPU time of all Locust processes: near wall_s x processes, the load generator is the bottleneck."""


def _user_args(job: LocustJob, paced: list[str]) -> list[str]:
    """Our locustfile's own options, `paced` (the load's) last (the master's reach the workers too;
    each takes its share)."""
    args = ["--model", job.model, *job.request.as_options(), "--requests", str(job.requests),
            "--worker-count", str(max(0, job.workers)), "--records-dir", str(job.records_dir)]
    if job.api_key_env:
        args += ["--api-key-env", job.api_key_env]
    return args + paced


def commands(job: LocustJob, deadline_s: float) -> list[list[str]]:
    """The Locust command lines: [main] or [master, worker, worker, ...]."""
    base = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE)]
    # Safety net: Locust stops itself at the deadline even if nobody tells it to.
    run_time = job.duration_s if job.duration_s else deadline_s
    users, paced = pacing(job.load, job)
    main = [*base, "--headless", "-H", job.host, "-u", str(users), "-r", str(min(max(users, 1) * 10, 100)),
            "--run-time", f"{max(1, int(run_time))}s", "--stop-timeout", str(int(job.request.request_timeout_s)),
            "--only-summary", "--loglevel", "INFO", "--exit-code-on-error", "0"]
    if job.csv_prefix:
        main += ["--csv", str(job.csv_prefix)]
    if job.html:
        main += ["--html", str(job.html)]
    main += _user_args(job, paced)
    if job.workers <= 0:
        return [main]
    port = free_port()
    master = [*main, "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
              "--expect-workers", str(job.workers), "--expect-workers-max-wait", "120"]
    worker = [*base, "--worker", "--master-host", "127.0.0.1", "--master-port", str(port), "-H", job.host,
              "--loglevel", "INFO"]
    return [master, *[[*worker, *_user_args(job, paced)] for _ in range(job.workers)]]


def run_locust(job: LocustJob, deadline_s: float, should_abort: Callable[[], str | None] = lambda: None,
               on_tick: Callable[[], None] = lambda: None) -> LocustOutcome:
    """Run the job to its end, the deadline, or until `should_abort()` returns a reason."""
    job.records_dir.mkdir(parents=True, exist_ok=True)
    log_path = job.log_path or job.records_dir / "locust.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    started = time.monotonic()
    # Children's CPU time is counted once they are reaped; ours are reaped in _stop().
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    aborted: str | None = None
    with open(log_path, "ab") as sink:
        try:
            for argv in commands(job, deadline_s):
                # Own process group each, so a stop reaches anything Locust spawned.
                procs.append(subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                              preexec_fn=die_with_parent()))
            main = procs[0]
            # Locust's own --run-time plus its --stop-timeout should end it; this is the backstop.
            hard_s = (job.duration_s or deadline_s) + job.request.request_timeout_s + 60
            while main.poll() is None:
                on_tick()
                aborted = should_abort() or _dead_worker(procs[1:])
                if aborted is None and time.monotonic() - started > hard_s:
                    aborted = f"Locust still running {hard_s:.0f} s after start"
                if aborted:
                    log.warning("stopping Locust: %s", aborted)
                    _stop(main)
                    break
                time.sleep(0.5)
            on_tick()
        finally:
            for proc in procs:
                _stop(proc, grace_s=10 if proc is procs[0] else 5)
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    tail = log_path.read_text(errors="replace").splitlines()[-30:] if log_path.exists() else []
    code = procs[0].returncode if procs else None
    if aborted is None and code:
        # Our locustfile exits 3 when a user crashed (see _stop_on_user_error there).
        reason = next((ln.strip() for ln in reversed(tail) if "Error" in ln or "error" in ln), None)
        aborted = f"Locust exited with code {code}" + (f": {reason[-300:]}" if reason else f" (log {log_path})")
    return LocustOutcome(code, aborted, tail, time.monotonic() - started, cpu_s)


def _dead_worker(workers: list[subprocess.Popen[bytes]]) -> str | None:
    """A worker that crashed or was killed: its users' share of the requests would never be sent.
    (Workers exit 0 when the master ends the run, possibly just before the master does.)"""
    for n, proc in enumerate(workers, 1):
        if proc.poll():
            return f"Locust worker {n} of {len(workers)} died (exit code {proc.returncode})"
    return None


def _stop(proc: subprocess.Popen[bytes], grace_s: float = 15) -> None:
    """SIGINT first (Locust then writes its CSV/HTML reports), SIGKILL the group if it lingers."""
    stop_group(proc, signal.SIGINT, grace_s, "Locust")
