"""specdeploy's draft-proposer plugins, loaded by vLLM through `speculative_config.method: custom_class`.

- `plugins.bigram.BigramProposer`: chains successors from a bigram table of the target's
  tokenizer (`plugins.bigram_table`) and from each request's own context.
- `plugins.small_model.SmallModelProposer`: runs a small causal model with the target's tokenizer
  (transformers, one KV cache per request).

Both draft argmax chains for greedy requests and, with `draft_sampling: probabilistic`, draw the
drafts of sampled requests from their own distribution at the request's temperature, top-k and
top-p; `plugins.draft_sampling` (a vLLM general plugin the proposers also install) hands them the
rows' sampling parameters and the verifier their draft probabilities.

`plugins.vllm_fixes` repairs a vLLM 0.32 CPU bug that skews sampling with speculation at
temperature > 0 (both proposers apply it; as a vLLM general plugin it reaches native drafters).
`plugins.k0_handoff`, another general plugin, lets a schedule's K=0 steps skip the engine's draft
hand-off, so drafting nothing costs what a plain step costs. `plugins.temperature_gate` lets a
config's `draft_max_temperature` keep requests sampled hotter than that from drafting.

Configs never name these classes: `speculation.drafter: bigram` or `drafter: small_model` with
`implementation: plugin` select them (the registry `plugins/drafters.py`), and their options reach
the worker processes as `vllm_config.additional_config[OPTIONS_KEY]`. Nothing here imports `deploy`.
"""

from __future__ import annotations

from typing import Any

from plugins.drafters import DRAFTERS, OPTIONS_KEY


def specdeploy_options(vllm_config: Any) -> dict[str, Any] | None:
    """The options specdeploy put in vLLM's `additional_config`, as passed (None: there are none)."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    options = extra.get(OPTIONS_KEY) if isinstance(extra, dict) else None
    return options if isinstance(options, dict) else None


def plugin_options(vllm_config: Any, drafter: str) -> dict[str, Any]:
    """The options specdeploy put in `additional_config` for this drafter, over the registry's
    defaults; a clear error when there are none."""
    options = specdeploy_options(vllm_config)
    if options is None or options.get("drafter") != drafter:
        raise ValueError(
            f"specdeploy's {drafter} proposer found no options in vLLM's additional_config['{OPTIONS_KEY}']; "
            f"start the server through specdeploy (`make serve`, deploy.plan_from_config) with "
            f"speculation.drafter: {drafter}, which passes them")
    return {**DRAFTERS[drafter].options, **options}


def num_speculative_tokens(vllm_config: Any) -> int:
    """K, which vLLM does not pass to `propose` (and does not truncate drafts to)."""
    spec = vllm_config.speculative_config
    if spec is None or not spec.num_speculative_tokens:
        raise ValueError("specdeploy proposer started without speculative_config.num_speculative_tokens")
    return int(spec.num_speculative_tokens)


def k_by_batch_size(vllm_config: Any, options: dict[str, Any]) -> list[int] | None:
    """The config's schedule as K per running batch size (index = batch size), built by vLLM's own
    function so a plugin reads it exactly as vLLM's scheduler reads it for native drafters; None
    without a schedule."""
    if not options.get("schedule"):
        return None
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    return build_dynamic_sd_schedule_lookup(options["schedule"], int(vllm_config.scheduler_config.max_num_seqs),
                                            num_speculative_tokens(vllm_config))


def k_for_batch(lookup: list[int] | None, k: int, batch: int) -> int:
    """K for this step's running batch size (the largest entry past the lookup's end)."""
    return k if not lookup else lookup[min(batch, len(lookup) - 1)]
