"""Where an engine step's time goes: opt-in timers around vLLM 0.32's step phases.

Set `SPECDEPLOY_STEP_PROFILE=<folder>` in a server's environment and specdeploy's general plugin
(`plugins.vllm_fixes.register`, run by vLLM in every process) wraps these methods with wall-clock
timers; the process that runs steps (the engine core, with its worker on one device) rewrites
`<folder>/steps-<pid>.json` twice a second with cumulative calls and seconds per phase:

| phase | vLLM method | what it holds |
|---|---|---|
| step | EngineCore.step | one whole engine step (all of the below but post_step) |
| schedule | Scheduler.schedule | picking requests and draft tokens to run |
| forward | GPUModelRunner.execute_model | input preparation and the target's forward pass |
| sample_tokens | GPUModelRunner.sample_tokens | the rest of the model step: the next four and glue |
| sample | GPUModelRunner._sample | sampling and rejection sampling (verification) |
| bookkeeping | GPUModelRunner._bookkeeping_sync | accepted tokens into the batch's arrays |
| propose | GPUModelRunner.propose_draft_token_ids | the drafter (a draft model's forwards, n-gram, plugins) |
| update | Scheduler.update_from_output | outputs to requests, stop checks |
| post_step | EngineCore.post_step | drafts handed to the scheduler (synchronous scheduling) |

The CPU model runner inherits these methods from the GPU one, so the same names hold on both.
Timers cost little beside a step; without the variable nothing is wrapped.
Cumulative figures let a benchmark take differences between two reads (`read_profile`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("vllm.specdeploy.step_profile")

ENV = "SPECDEPLOY_STEP_PROFILE"
WRITE_EVERY_S = 0.5
# phase -> (module, class, method)
PHASES: dict[str, tuple[str, str, str]] = {
    "step": ("vllm.v1.engine.core", "EngineCore", "step"),
    "schedule": ("vllm.v1.core.sched.scheduler", "Scheduler", "schedule"),
    "forward": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "execute_model"),
    "sample_tokens": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "sample_tokens"),
    "sample": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_sample"),
    "bookkeeping": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_bookkeeping_sync"),
    "propose": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "propose_draft_token_ids"),
    "update": ("vllm.v1.core.sched.scheduler", "Scheduler", "update_from_output"),
    "post_step": ("vllm.v1.engine.core", "EngineCore", "post_step"),
}


class _Totals:
    """Cumulative calls and seconds per phase, written by a daemon thread once any step ran."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._forked()
        # vLLM's engine core and workers may be forks of the process that installed the timers
        # (resources.cpu_start: fork): each child counts and writes for itself, from zero.
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self.path = self.folder / f"steps-{os.getpid()}.json"
        self.calls = dict.fromkeys(PHASES, 0)
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.lock = threading.Lock()
        self.writer: threading.Thread | None = None  # a parent's thread does not survive a fork

    def add(self, phase: str, seconds: float) -> None:
        with self.lock:
            self.calls[phase] += 1
            self.seconds[phase] += seconds
        if self.writer is None:  # the first timed call: this process runs steps
            self.writer = threading.Thread(target=self._write_forever, name="specdeploy-step-profile", daemon=True)
            self.writer.start()

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"pid": os.getpid(), "time": time.time(),
                    "phases": {p: {"calls": self.calls[p], "seconds": self.seconds[p]} for p in PHASES}}

    def _write_forever(self) -> None:
        while True:
            try:
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(self.snapshot()))
                tmp.replace(self.path)  # readers never see half a file
            except OSError as exc:
                log.warning("specdeploy step profile: cannot write %s (%s); timers go on", self.path, exc)
            time.sleep(WRITE_EVERY_S)


def _timed(totals: _Totals, phase: str, method: Callable) -> Callable:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            totals.add(phase, time.perf_counter() - began)

    wrapper.__specdeploy_timed__ = True  # type: ignore[attr-defined]
    return wrapper


def install(folder: str | Path) -> list[str]:
    """Wrap every phase's method (once per process); returns the phases it could not find."""
    import importlib

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    totals = _Totals(folder)
    missing = []
    for phase, (module, cls, name) in PHASES.items():
        try:
            owner = getattr(importlib.import_module(module), cls)
            method = owner.__dict__[name]
        except (ImportError, AttributeError, KeyError):
            missing.append(phase)
            continue
        if not getattr(method, "__specdeploy_timed__", False):
            setattr(owner, name, _timed(totals, phase, method))
    if missing:
        log.warning("specdeploy step profile: vLLM has no %s here; those phases stay at zero", ", ".join(missing))
    return missing


def install_from_env() -> None:
    """The general plugin's entry: profile steps when `SPECDEPLOY_STEP_PROFILE` names a folder."""
    folder = os.environ.get(ENV)
    if folder:
        install(folder)


def read_profile(folder: str | Path) -> dict[str, dict[str, float]]:
    """Cumulative {phase: {"calls", "seconds"}} summed over the folder's processes ({} if none wrote)."""
    total: dict[str, dict[str, float]] = {}
    for path in sorted(Path(folder).glob("steps-*.json")):
        try:
            phases = json.loads(path.read_text())["phases"]
        except (OSError, ValueError, KeyError):
            continue  # being replaced this instant: the next read has it
        for phase, figures in phases.items():
            slot = total.setdefault(phase, {"calls": 0, "seconds": 0.0})
            slot["calls"] += figures["calls"]
            slot["seconds"] += figures["seconds"]
    return total


def read_settled(folder: str | Path, tries: int = 20) -> dict[str, dict[str, float]]:
    """`read_profile` once the engine is idle: the files are rewritten every `WRITE_EVERY_S`, so
    wait until two reads a write apart agree (the engine has finished its last step)."""
    previous = None
    for _ in range(tries):
        current = read_profile(folder)
        if previous is not None and current == previous:
            return current  # two reads a write apart agree (twice nothing: no timed engine writes there)
        previous = current
        time.sleep(WRITE_EVERY_S * 1.5)
    return previous or {}


def per_step_ms(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, float]:
    """Milliseconds per engine step of each phase between two reads, plus `steps` (their number)
    and `other`: what a step spent outside the named phases (glue, the executor's hand-offs)."""
    def delta(phase: str, key: str) -> float:
        return after.get(phase, {}).get(key, 0) - before.get(phase, {}).get(key, 0)

    steps = delta("step", "calls")
    if steps <= 0:
        return {}
    ms = {phase: 1000 * delta(phase, "seconds") / steps for phase in PHASES}
    inside = ms["sample"] + ms["bookkeeping"] + ms["propose"]
    ms["sample_tokens_other"] = ms["sample_tokens"] - inside
    ms["other"] = ms["step"] - ms["schedule"] - ms["forward"] - ms["sample_tokens"] - ms["update"]
    ms["steps"] = steps
    return ms
