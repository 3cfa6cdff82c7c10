"""Plugin drafters draft only for requests at the temperatures they were tuned for.

specdeploy's plugins draft greedily: vLLM 0.32 gives a custom proposer no sampling parameters and
takes no draft probabilities from it. At temperature > 0 a greedy draft token survives only with
the target's probability of it. On the embedded float32 pair at T=1 that was 9-15% of drafts, and
every K was slower than plain decoding at batch 1 (K=1 0.89x, K=2 0.81x). So a config may set
`speculation.draft_max_temperature`: rows of requests sampled above it get no draft. They decode
as on a plain server, and they cost the drafter nothing.

vLLM does not tell `propose` the rows' temperatures either. `register()`, a vLLM general plugin,
wraps `GPUModelRunner.propose_draft_token_ids` (the CPU runner inherits it). Before the runner calls
a custom proposer, the wrapper hands the proposer's `note_temperatures` the input batch's
temperature per row (0 for greedy requests), in the row order `propose` then receives.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

import numpy as np

log = logging.getLogger("vllm.specdeploy.temperature_gate")
_WRAPPED = "__specdeploy_temperature_gate__"


class TemperatureGate:
    """Empties the rows of requests sampled above `max_temperature` before a plugin drafts."""

    def __init__(self, max_temperature: float | None):
        self.max_temperature = max_temperature
        """Highest temperature that gets drafts; None: every request does."""
        self.temperatures: np.ndarray | None = None
        """This step's temperature per row, from the runner (None until `register()`'s wrapper runs)."""
        self._warned = False

    def note(self, temperatures: np.ndarray) -> None:
        self.temperatures = temperatures

    def rows(self, sampled_token_ids: list[list[int]]) -> list[list[int]]:
        """`sampled_token_ids` with the rows above the gate emptied: both drafters treat an empty
        row as one that gets no draft (as vLLM does a partial prefill's)."""
        limit = self.max_temperature
        if limit is None:
            return sampled_token_ids
        temperatures = self.temperatures
        if temperatures is None or len(temperatures) < len(sampled_token_ids):
            if not self._warned:  # a later vLLM may have moved the runner method: draft for all, say so
                self._warned = True
                log.warning("specdeploy: the drafter got no request temperatures from vLLM's model runner, so "
                            "speculation.draft_max_temperature=%g is not applied: every request gets drafts", limit)
            return sampled_token_ids
        hot = np.flatnonzero(temperatures[:len(sampled_token_ids)] > limit)
        if not len(hot):
            return sampled_token_ids
        gated = list(sampled_token_ids)  # vLLM's own list is left as it was
        for i in hot.tolist():
            gated[i] = []
        return gated


def _noting_temperatures(method: Callable) -> Callable:
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        note = getattr(getattr(self, "drafter", None), "note_temperatures", None)
        if note is not None:
            batch = self.input_batch
            note(batch.temperature_cpu[:batch.num_reqs])
        return method(self, *args, **kwargs)

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def register() -> None:
    """vLLM general-plugin hook: install the wrapper (once per process)."""
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        method = GPUModelRunner.__dict__["propose_draft_token_ids"]
        if not getattr(method, _WRAPPED, False):
            GPUModelRunner.propose_draft_token_ids = _noting_temperatures(method)  # type: ignore[method-assign]
    except Exception as exc:  # serve as before; the gate itself warns if it is ever asked to act
        log.warning("specdeploy: could not hand request temperatures to plugin drafters (%s)", exc)
