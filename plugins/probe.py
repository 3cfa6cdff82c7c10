"""A cost probe, not a drafter: it proposes K tokens the target will not pick, every step.

Each step then verifies K + 1 tokens per request and (greedy) keeps one: the engine does the
work of speculative verification without any of its gain, so the step time measured on a
server running this proposer is the cost of verifying K tokens, beside the plain decode step of
the same server without speculation. vLLM's own tool for this, `rejection_sample_method:
synthetic`, does not run on its CPU build.

The proposed token is the model's padding token (no training text contains it, so the target
practically never predicts it), or id 0 when the model names none. Acceptance does not change
what a step costs: the measurement reads step times (the gaps between a request's outputs),
not tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from plugins import num_speculative_tokens, vllm_fixes


class RejectedDraftProposer:
    """vLLM custom_class proposer: K copies of a token the target does not predict."""

    def __init__(self, vllm_config: Any):
        vllm_fixes.apply()
        self.k = num_speculative_tokens(vllm_config)
        pad = getattr(vllm_config.model_config.hf_config, "pad_token_id", None)
        self.token = int(pad) if isinstance(pad, int) else 0

    def load_model(self, target_model: Any) -> None:
        """Nothing to load (the CPU runner calls it for every drafter)."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        return [[self.token] * self.k for _ in sampled_token_ids]
