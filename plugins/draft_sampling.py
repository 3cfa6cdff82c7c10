"""Sampled drafts from custom proposers: the rows' sampling parameters in, draft probabilities out.

Speculative sampling keeps the target's output distribution for any draft distribution q, and a
drafted token is accepted with probability min(1, p/q), a rejected one replaced from
max(p - q, 0). vLLM 0.32's model runner gives its LLM-based drafters (draft_model, EAGLE) the
batch's sampling metadata and reads their q (`take_last_draft_probs()`), but calls a
`custom_class` proposer with neither: its drafts reach the rejection sampler without
probabilities, which verifies them as certain (q one-hot at the drafted token). That is still
exact for any way of choosing the draft, but a draft sampled at temperature 1 is then accepted
only with the target's probability of that one token, where a draft whose q resembles the
target's is accepted with sum(min(p, q)).

`register()` (a vLLM general plugin; specdeploy's proposers also call it when vLLM builds them)
wraps `GPUModelRunner.propose_draft_token_ids`, which the CPU runner inherits, and extends the
custom_class branch with the two steps the runner already takes for its own drafters:

- before `propose`, a proposer with `set_draft_sampling` receives a `RowSampling`: each row's
  temperature (0: greedy), top-p and top-k, in the row order `propose` then receives;
- after it, a proposer with `take_last_draft_probs` may return its draft distribution per drafted
  position, a float tensor [rows, K', vocabulary] (K' at least the longest draft): row i, position
  j is the distribution draft token j of row i was drawn from. The runner keeps it for the next
  step's verification, keyed by request id, exactly as it keeps a draft model's.

The contract a proposer keeps (docs/custom-proposer-probabilities.md): draw each token from the
distribution it returns for that position; decide whether to draft a position before drawing its
token (stopping because of the token drawn biases it); return None when no row drew a token
(deterministic drafts need no probabilities). Rows of greedy requests are verified by argmax and
never read theirs. A proposer that returns nothing, or a runner without this patch, keeps vLLM's
behaviour: verification against one-hot q, lossless with any drafts.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

log = logging.getLogger("vllm.specdeploy.draft_sampling")
_WRAPPED = "__specdeploy_draft_sampling__"


@dataclass(frozen=True)
class RowSampling:
    """One step's sampling parameters per batch row, as the target's sampler applies them."""

    temperature: np.ndarray
    """float32 per row; 0 for greedy requests (verified by argmax, their drafts need no q)."""
    top_p: np.ndarray
    """float32 per row; 1: off."""
    top_k: np.ndarray
    """int per row; 0 or at least `vocab_size`: off."""
    vocab_size: int
    """Width of the target's logits: the last dimension draft probabilities must have."""

    @property
    def sampled(self) -> np.ndarray:
        """Rows whose requests are sampled (temperature > 0)."""
        return self.temperature > 0

    @classmethod
    def of_input_batch(cls, batch: Any) -> RowSampling:
        """The runner's input batch, copied (its arrays are reused buffers)."""
        n = batch.num_reqs
        return cls(batch.temperature_cpu[:n].copy(), batch.top_p_cpu[:n].copy(), batch.top_k_cpu[:n].copy(),
                   int(batch.vocab_size))


def warp_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Probabilities of a 1-D float logit vector at a row's temperature, top-k and top-p, as vLLM's
    sampler processes the target's (temperature first, then top-k, then top-p). `temperature` > 0."""
    logits = logits.float() / temperature
    vocab = logits.shape[-1]
    if 0 < top_k < vocab or top_p < 1:
        ordered, order = logits.sort()  # ascending, as vLLM's apply_top_k_top_p
        if 0 < top_k < vocab:
            ordered = ordered.masked_fill(ordered < ordered[vocab - top_k], float("-inf"))
        if top_p < 1:
            cumulative = ordered.softmax(-1).cumsum(-1)
            drop = cumulative <= 1 - top_p
            drop[-1] = False  # at least one token stays
            ordered = ordered.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, ordered)
    return logits.softmax(-1)


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token drawn from a 1-D probability vector by inverting its cumulative sum: the same
    distribution as `torch.multinomial`, whose sampling over a vocabulary costs several times more."""
    cdf = probs.cumsum(-1)
    u = torch.rand((), generator=generator, device=probs.device, dtype=cdf.dtype) * cdf[-1]
    return min(int(torch.searchsorted(cdf, u, right=True)), probs.shape[-1] - 1)


def _checked(probs: Any, rows: int, longest: int, vocab: int, device: torch.device) -> torch.Tensor:
    """The proposer's probabilities as the rejection sampler reads them, or a clear error: a wrong
    shape would verify drafts against another row's or another position's distribution."""
    if not isinstance(probs, torch.Tensor) or probs.ndim != 3 or probs.shape[0] != rows \
            or probs.shape[1] < longest or probs.shape[2] != vocab:
        shape = tuple(probs.shape) if isinstance(probs, torch.Tensor) else type(probs).__name__
        raise ValueError(f"custom proposer's take_last_draft_probs() returned {shape}; expected a tensor "
                         f"[{rows} rows, >= {longest} draft positions, {vocab} vocabulary]")
    return probs.to(device=device, dtype=torch.float32, non_blocking=True).contiguous()


def _with_draft_sampling(method: Callable) -> Callable:
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        spec = self.speculative_config
        drafter = getattr(self, "drafter", None)
        if spec is None or spec.method != "custom_class" or drafter is None:
            return method(self, *args, **kwargs)
        tell = getattr(drafter, "set_draft_sampling", None)
        if tell is not None:
            tell(RowSampling.of_input_batch(self.input_batch))
        drafts = method(self, *args, **kwargs)  # resets the runner's _draft_probs, then calls propose
        take = getattr(drafter, "take_last_draft_probs", None)
        probs = take() if take is not None else None
        if probs is not None:
            batch = self.input_batch
            longest = max(map(len, drafts), default=0)
            self._draft_probs = _checked(probs, batch.num_reqs, longest, batch.vocab_size, self.device)
            self._draft_prob_req_ids = batch.req_ids.copy()
        return drafts

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def register() -> bool:
    """vLLM general-plugin hook, also called by specdeploy's proposers: install the wrapper (once
    per process); True when it is installed."""
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        method = GPUModelRunner.__dict__["propose_draft_token_ids"]
        if not getattr(method, _WRAPPED, False):
            GPUModelRunner.propose_draft_token_ids = _with_draft_sampling(method)  # type: ignore[method-assign]
        return True
    except Exception as exc:  # a later vLLM may have moved things: the proposers then draft greedily
        log.warning("specdeploy: could not pass sampling parameters to custom proposers (%s); plugin "
                    "drafters draft greedily", exc)
        return False
