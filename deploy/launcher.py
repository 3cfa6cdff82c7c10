"""Start, watch and stop a vLLM OpenAI-compatible server from a launch plan.

`Server` is the Python API the load tests use: start it, wait until `/health` answers, stop
it whatever happened in between (it is a context manager, and it kills the whole process
group, engine workers included). Start-up failures raise `ServerStartError` carrying the
engine's own error line and the tail of its log.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import requests

from deploy.engine_args import LaunchPlan
from deploy.processes import die_with_parent, signal_group, stop_group

log = logging.getLogger("specdeploy")
START_LOG_ENV = "SPECDEPLOY_START_LOG"

# Lines that carry the reason a vLLM start-up failed, most specific first.
_ERROR_LINE = re.compile(r"(\w+(Error|Exception)\b.*|.*\bERROR\b.*|.*error: .*)")
_NOISE = re.compile(r"Traceback|^\s*File |^\s*\^+\s*$|raise |EngineCore failed to start|Engine core initialization failed|WorkerProc initialization failed")


def answers_health(base_url: str, timeout_s: float = 5) -> bool:
    """Whether the vLLM server at `base_url` answers `/health` with 200 within `timeout_s` (no API key:
    the kit leaves `/health` open). Mid-run, a server busy with a batch can take seconds to answer."""
    try:
        return requests.get(f"{base_url}/health", timeout=timeout_s).status_code == 200
    except requests.RequestException:
        return False


class ServerStartError(RuntimeError):
    """The server exited or never became healthy."""

    def __init__(self, message: str, log_tail: list[str], log_path: Path | None):
        self.reason = message
        self.log_tail = log_tail
        self.log_path = log_path
        where = f" (full log: {log_path})" if log_path else ""
        super().__init__(f"{message}{where}")


def engine_error_line(lines: list[str]) -> str | None:
    """The most telling error line of a failed start: the last `...Error: ...` that is not noise,
    with its first detail line when the error puts its reason below (pydantic does)."""
    candidates = [i for i, ln in enumerate(lines) if _ERROR_LINE.search(ln) and not _NOISE.search(ln)]
    with_message = [i for i in candidates if re.search(r"(Error|Exception): \S", lines[i])]
    if not (with_message or candidates):
        return None
    index = (with_message or candidates)[-1]
    line = lines[index].strip()
    if "validation error" in line:
        detail = next((d.strip() for d in lines[index + 1:index + 4]
                       if d.strip() and not d.strip().startswith("For further information")
                       and not _ERROR_LINE.fullmatch(d.strip())), None)
        if detail:
            line = f"{line}: {detail.removeprefix('Value error, ')[:400]}"
    return line


def _close_quietly(sink: Any) -> None:
    try:
        sink.close()
    except (OSError, ValueError):
        pass


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could bind `host:port` (IPv4 or IPv6; `""` is every interface)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host or "0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class Server:
    """One vLLM server process (and its engine workers)."""

    def __init__(self, plan: LaunchPlan, log_path: Path | None = None, echo: bool = False):
        self.plan = plan
        self.log_path = log_path
        self.echo = echo
        """Also copy the engine's output to this process's stdout."""
        self.process: subprocess.Popen[bytes] | None = None
        self.launched_at = 0.0
        """When `start` launched the process (monotonic clock): a start is timed from here."""
        self.tail: collections.deque[str] = collections.deque(maxlen=400)
        self._reader: threading.Thread | None = None
        self.log_error: str | None = None
        """Why the log file stopped being written (disk full, unwritable folder), if it did."""

    @property
    def base_url(self) -> str:
        return self.plan.base_url

    def start(self) -> Server:
        if self.process is not None:
            raise RuntimeError("server already started")
        if not self.plan.headless and not port_is_free(self.plan.host, self.plan.port):
            raise ServerStartError(
                f"port {self.plan.port} on {self.plan.host} is already in use; stop what listens there or pick "
                f"another port (--set server.port=N)", [], None)
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.plan.env, "PYTHONUNBUFFERED": "1"}
        # Its own process group, so stop() reaches the engine core and workers it spawns; and it
        # dies with us, so a killed launcher leaves no engine holding the port (deploy.processes).
        self.process = subprocess.Popen(self.plan.argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True,
                                        preexec_fn=die_with_parent())
        self.launched_at = time.monotonic()
        self._reader = threading.Thread(target=self._read_output, name="vllm-log", daemon=True)
        self._reader.start()
        log.info("started vLLM server (pid %d) on %s; log: %s", self.process.pid, self.base_url,
                 self.log_path or "(memory)")
        return self

    def _read_output(self) -> None:
        """Drain the engine's output whatever happens to the log: a reader that dies leaves the
        pipe to fill, and vLLM then blocks on its next log line (a frozen server)."""
        assert self.process and self.process.stdout
        sink = None
        if self.log_path:
            try:
                sink = open(self.log_path, "a", encoding="utf-8")
            except OSError as exc:
                self._log_failed(exc)
        for raw in self.process.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.tail.append(line)
            if sink:
                try:
                    sink.write(line + "\n")
                    sink.flush()
                except (OSError, ValueError) as exc:
                    self._log_failed(exc)
                    sink = _close_quietly(sink)
            if self.echo:
                try:
                    print(line, flush=True)
                except (OSError, ValueError):
                    self.echo = False  # our stdout is gone (closed terminal); keep draining
        if sink:
            _close_quietly(sink)

    def _log_failed(self, exc: BaseException) -> None:
        self.log_error = f"cannot write the server log {self.log_path}: {exc}"
        log.warning("%s; the server keeps running, its last %d lines are kept in memory",
                    self.log_error, self.tail.maxlen)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_reason(self) -> str:
        code = self.process.returncode if self.process else "?"
        return f"server process exited (code {code}) mid-run"

    def healthy(self) -> bool:
        return answers_health(self.base_url, timeout_s=2)  # polled every second while it starts

    def wait_healthy(self, timeout_s: float = 900, progress: bool = True) -> float:
        """Block until `/health` answers 200; return the seconds since the launch (servers launched
        together and awaited one after the other are each timed whole, and each gets `timeout_s`
        from its own launch)."""
        assert self.process is not None, "start() first"
        started = self.launched_at
        tty = progress and sys.stderr.isatty()
        last_report = 0.0
        while True:
            elapsed = time.monotonic() - started
            if self.process.poll() is not None:
                self.stop()  # the API process is gone; an engine core it started may not be
                self._record_start(elapsed, "failed")
                lines = list(self.tail)
                reason = engine_error_line(lines) or (lines[-1] if lines else "no output")
                if tty:
                    sys.stderr.write("\n")
                raise ServerStartError(f"vLLM exited with code {self.process.returncode} during start-up: {reason}",
                                       lines[-40:], self.log_path)
            if self.healthy():
                if tty:
                    sys.stderr.write("\n")
                log.info("server healthy at %s after %.0f s", self.base_url, elapsed)
                self._record_start(elapsed, "ready")
                return elapsed
            if elapsed > timeout_s:
                lines = list(self.tail)
                self.stop()
                self._record_start(elapsed, "timed out")
                raise ServerStartError(f"vLLM did not become healthy within {timeout_s:.0f} s; last line: "
                                       f"{lines[-1] if lines else 'none'}", lines[-40:], self.log_path)
            if progress:
                last_line = (self.tail[-1] if self.tail else "").strip()
                status = f"waiting for vLLM at {self.base_url}/health: {elapsed:4.0f} s | {last_line[-90:]}"
                if tty:
                    sys.stderr.write("\r\033[K" + status[: os.get_terminal_size(sys.stderr.fileno()).columns - 1])
                    sys.stderr.flush()
                elif elapsed - last_report >= 15:
                    print(status, file=sys.stderr, flush=True)
                    last_report = elapsed
            time.sleep(0.5)

    def _record_start(self, seconds: float, outcome: str) -> None:
        """One line per engine start in `$SPECDEPLOY_START_LOG`, if set (the test suite counts its
        engine starts with it, those of command-line subprocesses included)."""
        path = os.environ.get(START_LOG_ENV)
        if not path:
            return
        line = {"name": self.plan.served_name, "url": self.base_url, "log": str(self.log_path or ""),
                "seconds": round(seconds, 1), "outcome": outcome, "pid": os.getpid()}
        try:
            with open(path, "a", encoding="utf-8") as sink:
                sink.write(json.dumps(line) + "\n")
        except OSError as exc:
            log.warning("cannot record the engine start in %s: %s", path, exc)

    def stop(self, timeout_s: float = 30) -> int | None:
        """SIGTERM the process group, then SIGKILL after `timeout_s` (at once if this wait is
        interrupted, by a second Ctrl-C say); returns the exit code."""
        if self.process is None:
            return None
        try:
            return stop_group(self.process, signal.SIGTERM, timeout_s, "vLLM")
        finally:
            self._finish_reader()

    def kill(self) -> None:
        """SIGKILL the whole process group now (a second Ctrl-C)."""
        if self.process is not None:
            signal_group(self.process, signal.SIGKILL)

    def _finish_reader(self) -> None:
        if self._reader:
            self._reader.join(timeout=5)

    def __enter__(self) -> Server:
        if self.process is None:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def start_server(plan: LaunchPlan, log_path: Path | None = None, timeout_s: float = 900,
                 progress: bool = True, echo: bool = False) -> Server:
    """Start a server and wait until it is healthy; on failure nothing is left running."""
    server = Server(plan, log_path, echo=echo).start()
    try:
        server.wait_healthy(timeout_s, progress=progress)
    except BaseException:
        server.stop()
        raise
    return server
