"""Plugin drafters draft only for requests at the temperatures they were configured for.

A config may set `speculation.draft_max_temperature`: rows of requests sampled above it get no
draft. They decode as on a plain server, and they cost the drafter nothing. With `draft_sampling:
probabilistic` the plugins sample their drafts and hand the verifier their probabilities
(`plugins.draft_sampling`), so sampled requests keep much of their acceptance; the gate is for the
temperatures where a drafter still does not pay (its drafts, sampled or not, rarely match a flat
target distribution), and for greedy drafting of sampled traffic, where a draft token survives only
with the target's probability of it.

vLLM does not tell `propose` the rows' temperatures: the runner patch of `plugins.draft_sampling`
hands each proposer the input batch's sampling parameters per row (temperature 0 for greedy
requests) before it calls `propose`, in the row order `propose` then receives.
"""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger("vllm.specdeploy.temperature_gate")


class TemperatureGate:
    """Empties the rows of requests sampled above `max_temperature` before a plugin drafts."""

    def __init__(self, max_temperature: float | None):
        self.max_temperature = max_temperature
        """Highest temperature that gets drafts; None: every request does."""
        self.temperatures: np.ndarray | None = None
        """This step's temperature per row, from the runner (None until `plugins.draft_sampling` hands them)."""
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
