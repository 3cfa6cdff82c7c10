"""The drafters specdeploy knows, in one table: what vLLM calls each, which are specdeploy's
plugins, which take a draft model, which can sample their drafts, and their options' defaults.

Config validation, preflight, the engine arguments, the Kubernetes manifests and the plugins in
vLLM's workers all read it. It lives with the plugins and imports nothing, so a worker gets this
file alone, and deploy depends on plugins, never the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OPTIONS_KEY = "specdeploy"
"""The key of vLLM's `additional_config` under which a plugin drafter finds its options (vLLM hands
that dict to every worker process)."""


@dataclass(frozen=True)
class Drafter:
    name: str
    """As `speculation.drafter` spells it."""
    vllm_method: str | None = None
    """vLLM's own speculative method for it (`implementation: native`); None: specdeploy's plugin only."""
    plugin_class: str | None = None
    """specdeploy's proposer, which vLLM loads as `method: custom_class`; None: vLLM's drafter only."""
    takes_model: bool = False
    """Needs a draft checkpoint in `speculation.model` (and takes none otherwise)."""
    samples_drafts: bool = False
    """Can draw its drafts from a distribution and hand it to the verifier (`draft_sampling:
    probabilistic`): vLLM's draft-model drafters as vLLM's `draft_sample_method`, specdeploy's
    plugins through `plugins.draft_sampling`; the others' drafts are deterministic."""
    options: dict[str, Any] = field(default_factory=dict)
    """The plugin's options (under OPTIONS_KEY) and their defaults."""
    speculative_defaults: dict[str, Any] = field(default_factory=dict)
    """Fields of vLLM's speculative_config specdeploy sets for this method unless the config does."""

    @property
    def has_implementations(self) -> bool:
        """vLLM and specdeploy both implement it: `speculation.implementation` picks one."""
        return bool(self.vllm_method and self.plugin_class)

    def plugin(self, implementation: str = "native") -> str | None:
        """The proposer class vLLM loads for this drafter, or None when vLLM drafts natively."""
        if self.plugin_class and (not self.has_implementations or implementation == "plugin"):
            return self.plugin_class
        return None


DRAFTERS: dict[str, Drafter] = {d.name: d for d in (
    Drafter("none"),
    Drafter("small_model", vllm_method="draft_model", plugin_class="plugins.small_model.SmallModelProposer",
            takes_model=True, samples_drafts=True, options={"max_cache_mib": 1024}),
    Drafter("bigram", plugin_class="plugins.bigram.BigramProposer", samples_drafts=True,
            options={"context_weight": 4.0, "min_probability": 0.15, "max_batch_size": 64}),
    Drafter("ngram", vllm_method="ngram", speculative_defaults={"prompt_lookup_min": 1, "prompt_lookup_max": 3}),
    Drafter("suffix", vllm_method="suffix"),
    Drafter("eagle", vllm_method="eagle", takes_model=True, samples_drafts=True),
    Drafter("eagle3", vllm_method="eagle3", takes_model=True, samples_drafts=True),
    Drafter("mtp", vllm_method="mtp", samples_drafts=True),
    Drafter("medusa", vllm_method="medusa", takes_model=True),
    Drafter("mlp_speculator", vllm_method="mlp_speculator", takes_model=True),
    # Measures verification cost, does not serve: drafts K tokens the target rejects.
    Drafter("probe", plugin_class="plugins.probe.RejectedDraftProposer"),
)}
