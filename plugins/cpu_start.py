"""On a CPU, let vLLM start its engine-core and worker processes by fork (`resources.cpu_start: fork`).

vLLM 0.32's CPU platform always starts them by spawn (`VLLM_WORKER_MULTIPROC_METHOD=spawn`, set
while it builds its config): each process then imports vLLM and torch anew, which dominated a
server's start on a small CPU. Forked, they begin as copies of the API server (vLLM's default on
GPUs, where it forks unless CUDA is up) and run the same engine code from there. The kit asks for
it by setting `SPECDEPLOY_CPU_START=fork` in the server's environment; `register()`, a vLLM
general plugin that runs in the API server before vLLM builds its config, then sets the start
method back to fork after the platform's own choice.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("vllm.specdeploy.cpu_start")
ENV = "SPECDEPLOY_CPU_START"
_WRAPPED = "__specdeploy_cpu_start__"


def register() -> None:
    if os.environ.get(ENV) != "fork":
        return
    try:
        from vllm.platforms.cpu import CpuPlatform
    except Exception as exc:  # a later vLLM may have moved it: spawn still works, only slower
        log.warning("specdeploy: cannot start vLLM's CPU processes by fork (%s); they start by spawn", exc)
        return
    original = CpuPlatform.check_and_update_config
    if getattr(original, _WRAPPED, False):
        return

    def check_and_update_config(cls: type, vllm_config: object) -> None:
        original.__func__(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    setattr(check_and_update_config, _WRAPPED, True)
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[method-assign]
