"""The small-model drafter as a plugin: a small causal LM inside vLLM's worker.

vLLM's native `draft_model` path runs the draft inside the engine (its attention kernels, its KV
cache blocks, its config checks). This plugin runs any causal LM that transformers can load and
that shares the target's vocabulary, with its own KV cache per request; a Llama-architecture draft
runs straight from its weights (`plugins.llama_draft`, faster per token than transformers'
generic forward), any other through transformers:

- each step, for every running request, it finds the cache built for that request's history,
  rolls it back to the longest prefix the current history shares with the tokens it fed (the
  draft tokens the target rejected drop out; what was accepted stays), feeds the new tokens,
  and drafts K tokens: greedily (argmax) for greedy requests, and with `draft_sampling:
  probabilistic` sampled for sampled requests from the draft's distribution at the request's
  temperature, top-k and top-p, whose probabilities go to vLLM's verifier (`plugins.draft_sampling`),
  as vLLM's own draft-model path does; either way the output keeps the target's distribution;
- vLLM passes no request ids, so caches are matched to batch rows by content: a cache belongs
  to a row when the tokens it was built from are a prefix of the row's history (the cache only
  depends on those tokens, so identical histories may share it). A row's own previous cache is
  tried first; a request moved to another row (others finished) is found among the rest;
  anything else starts a new cache. Caches that no running request claims are freed.

Options (`additional_config["specdeploy"]`): `draft_model`, the draft's local folder,
`max_cache_mib` (default 1024, in `plugins/drafters.py`), the memory its per-request KV caches may
hold: requests past it get no draft until others finish, and `draft_sampling`. The config's
`schedule` and `draft_max_temperature` (plugins.temperature_gate) arrive there too. A step that fails (out of memory, a
bad token) gives that request an empty draft and a warning in the server log; the engine goes
on. K is `speculative_config.num_speculative_tokens`; the draft runs on the worker's device in
the target's dtype, except a small one on a CPU, which runs in float32 (`CPU_FLOAT32_MAX_BYTES`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from plugins.drafters import DRAFTERS
from plugins import draft_sampling, k_by_batch_size, k_for_batch, num_speculative_tokens, plugin_options, vllm_fixes
from plugins.draft_sampling import RowSampling, draw, warp_logits
from plugins.llama_draft import LlamaDraft
from plugins.temperature_gate import TemperatureGate

# Inside vLLM's worker processes: a child of vLLM's logger, so these lines reach the server log.
log = logging.getLogger("vllm.specdeploy.small_model")

CPU_FLOAT32_MAX_BYTES = 64 * 2**20
"""On a CPU, a draft whose float32 weights fit in this runs in float32 whatever the target's dtype."""


@dataclass
class _RequestCache:
    tokens: np.ndarray
    """Every token fed to the draft, in order: the history at the last step plus the drafts fed back."""
    history: int
    """How many of `tokens` were the request's real history (the rest were drafts)."""
    cache: Any
    """The draft's KV cache holding exactly `tokens` (`LlamaDraft`'s or transformers' DynamicCache)."""


class TransformersDraft:
    """Any causal LM through transformers: the general path, with the interface of `LlamaDraft`."""

    def __init__(self, model: Any):
        self.model = model

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @staticmethod
    def reserve(cache: Any, positions: int) -> None:
        """Nothing to do: a DynamicCache grows token by token."""

    @staticmethod
    def positions_held(cache: Any | None, positions: int = 0) -> int:
        """A DynamicCache holds exactly its tokens: `positions` once it has them."""
        return max(positions, 0 if cache is None else cache.get_seq_length())

    def logits(self, ids: torch.Tensor, position: int, cache: Any) -> torch.Tensor:
        """Feed `ids` after the first `position` cached tokens; the next-token logits after the last."""
        cached = cache.get_seq_length()
        if position < cached:
            cache.crop(position - cached)  # negative: remove that many tokens from the end
        positions = torch.arange(position, position + ids.shape[0], device=ids.device)[None]
        return self.model(input_ids=ids[None], position_ids=positions, past_key_values=cache, use_cache=True,
                          logits_to_keep=1).logits[0, -1]


def kv_bytes_per_token(model: Any) -> int:
    """What one cached token costs the draft: keys and values of every layer."""
    cfg = model.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    itemsize = next(model.parameters()).element_size()
    return max(2 * cfg.num_hidden_layers * heads * head_dim * itemsize, 1)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D arrays."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class SmallModelDrafter:
    """Drafting with per-request KV caches; independent of vLLM's config objects."""

    def __init__(self, model: Any, k: int, max_model_len: int, device: torch.device | str = "cpu",
                 max_cache_mib: float = DRAFTERS["small_model"].options["max_cache_mib"],
                 k_by_batch: list[int] | None = None, vocab_size: int | None = None, seed: int = 0):
        self.k = k
        positions = getattr(model.config, "max_position_embeddings", None) or max_model_len
        self.max_len = min(int(max_model_len), int(positions))
        self.forward: LlamaDraft | TransformersDraft = (LlamaDraft.for_model(model, self.max_len)
                                                        or TransformersDraft(model))
        """The draft's forward pass: straight from the weights for Llama checkpoints, else transformers."""
        self.vocab_size = int(vocab_size or model.config.vocab_size)
        """Width of the draft probabilities handed to the verifier (the target's logits)."""
        # One fixed-seed stream: every tensor-parallel rank draws the same drafts.
        self.generator = torch.Generator(device=torch.device(device)).manual_seed(seed)
        self.last_draft_probs: torch.Tensor | None = None
        """[rows, K, vocabulary] of the last `propose` that sampled a draft, else None."""
        self.k_by_batch = k_by_batch
        """K per running batch size (speculation.schedule), None: K at every size."""
        self.device = torch.device(device)
        self.max_cached_tokens = int(max_cache_mib * 2**20 // kv_bytes_per_token(model))
        """Budget of the per-request KV caches: past it, further requests get no draft this step."""
        self._rows: list[_RequestCache | None] = []
        self.fed_tokens = 0
        """Tokens run through the draft so far (prompts, catch-up and drafting), for benchmarks."""
        self.failures = 0
        """Drafting steps that raised (each gave an empty draft; the engine went on)."""
        self.over_budget = 0
        """Requests left without a draft because the caches were at their budget."""

    @property
    def cached_tokens(self) -> int:
        return sum(len(s.tokens) for s in self._rows if s is not None)

    @property
    def held_positions(self) -> int:
        """Positions the caches hold memory for (at least `cached_tokens`): what the budget bounds."""
        return sum(self.forward.positions_held(s.cache) for s in self._rows if s is not None)

    @staticmethod
    def _claim(row: int, history: np.ndarray, free: dict[int, _RequestCache]) -> _RequestCache | None:
        """The cache built for this history: the row's own first, else one that moved rows."""

        def built_for(state: _RequestCache) -> bool:
            return state.history <= len(history) and np.array_equal(state.tokens[: state.history],
                                                                     history[: state.history])

        own = free.get(row)
        if own is not None and built_for(own):
            return free.pop(row)
        for r, state in free.items():
            if built_for(state):
                return free.pop(r)
        return None

    @torch.inference_mode()
    def _step(self, state: _RequestCache | None, history: np.ndarray, k: int,
              sampling: tuple[float, int, float] | None = None, probs: torch.Tensor | None = None,
              ) -> tuple[list[int], _RequestCache]:
        """K drafts for one request: argmax, or with `sampling` (temperature > 0, top-k, top-p) drawn
        from the draft's distribution, which is written to `probs` [K, vocabulary]."""
        n = len(history)
        if state is None:
            state = _RequestCache(np.zeros(0, np.int64), 0, self.forward.new_cache())
        self.forward.reserve(state.cache, n + k - 1)  # history + drafts[:-1], in one allocation
        # Roll back to what the history confirms (accepted drafts stay), keeping one token to feed.
        keep = min(common_prefix(state.tokens, history), n - 1)
        feed = torch.as_tensor(history[keep:], dtype=torch.long, device=self.device)
        drafts: list[int] = []
        position = keep
        for _ in range(k):
            logits = self.forward.logits(feed, position, state.cache)  # drops what follows `position`
            self.fed_tokens += feed.shape[0]
            position += feed.shape[0]
            if sampling is None:
                token = int(logits.argmax())
            else:
                q = warp_logits(logits[:self.vocab_size], *sampling)
                token = draw(q, self.generator)
                assert probs is not None
                probs[len(drafts), :q.shape[0]] = q
            drafts.append(token)
            feed = torch.tensor([token], dtype=torch.long, device=self.device)
        # The last draft was never fed: the cache holds history + drafts[:-1].
        state.tokens = np.concatenate([history.astype(np.int64), np.asarray(drafts[:-1], np.int64)])
        state.history = n
        return drafts, state

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, sampling: RowSampling | None = None) -> list[list[int]]:
        """Drafts per row; with `sampling`, rows of sampled requests draw theirs (`last_draft_probs`)."""
        batch = len(sampled_token_ids)
        self.last_draft_probs = None
        probs: torch.Tensor | None = None
        free = {r: s for r, s in enumerate(self._rows) if s is not None}
        rows: list[_RequestCache | None] = [None] * batch
        out: list[list[int]] = [[] for _ in range(batch)]
        budget = self.max_cached_tokens
        k_now = k_for_batch(self.k_by_batch, self.k, batch)
        for i in range(batch):
            n = int(num_tokens_no_spec[i])
            k = min(k_now, self.max_len - n)
            if not sampled_token_ids[i] or n < 1 or k < 1:
                continue  # partial prefill, discarded row, or no room left: no draft
            history = token_ids_cpu[i, :n]
            state = self._claim(i, history, free)
            # What its cache will hold memory for after this step (history + drafts[:-1]), not only its
            # tokens: a cache that grows by doubling can hold up to twice what it has filled.
            if self.forward.positions_held(None if state is None else state.cache, n + k - 1) > budget:
                self._note_over_budget()
                continue  # its cache (if any) is dropped below: memory stays bounded
            row_sampling = None
            if sampling is not None and sampling.temperature[i] > 0:
                row_sampling = (float(sampling.temperature[i]), int(sampling.top_k[i]), float(sampling.top_p[i]))
                if probs is None:
                    probs = torch.zeros(batch, self.k, self.vocab_size, device=self.device)
            try:
                out[i], rows[i] = self._step(state, history, k, row_sampling,
                                             None if row_sampling is None else probs[i])
            except Exception as exc:  # noqa: BLE001 - a failed draft must never take the engine down
                self._note_failure(exc)
                continue
            budget -= self.forward.positions_held(rows[i].cache)
        self._rows = rows  # unclaimed caches belonged to finished (or preempted) requests: freed
        self.last_draft_probs = probs
        return out

    def _note_failure(self, exc: Exception) -> None:
        self.failures += 1
        if self.failures == 1 or self.failures % 1000 == 0:  # a log a person can read, not one per step
            log.warning("specdeploy small-model drafter: drafting failed (%d so far), the request goes on "
                        "without a draft this step: %s: %s", self.failures, type(exc).__name__, exc)

    def _note_over_budget(self) -> None:
        self.over_budget += 1
        if self.over_budget == 1 or self.over_budget % 1000 == 0:
            log.warning("specdeploy small-model drafter: draft KV caches at their budget (%d tokens); requests "
                        "past it get no draft (%d so far). Raise max_cache_mib if memory allows",
                        self.max_cached_tokens, self.over_budget)


class SmallModelProposer:
    """vLLM custom_class proposer for `drafter: small_model` with `implementation: plugin`."""

    def __init__(self, vllm_config: Any):
        vllm_fixes.apply()  # vLLM 0.32 on CPU verifies drafts at a garbage temperature otherwise
        options = plugin_options(vllm_config, "small_model")
        path = Path(str(options.get("draft_model", "")))
        if not (path / "config.json").is_file():
            raise ValueError(f"specdeploy small-model drafter: draft model folder {path} has no config.json; "
                             f"set speculation.model to a local checkpoint folder")
        self.path = path
        self.max_cache_mib = float(options["max_cache_mib"])
        """Memory for the per-request draft KV caches (requests past it get no draft)."""
        self.k = num_speculative_tokens(vllm_config)
        self.k_by_batch = k_by_batch_size(vllm_config, options)
        self.gate = TemperatureGate(options.get("draft_max_temperature"))
        self.probabilistic = options.get("draft_sampling") == "probabilistic"
        """Sampled requests get sampled drafts (else argmax drafts, as for greedy requests)."""
        self.sampling: RowSampling | None = None
        """This step's rows' sampling parameters, from the runner (plugins.draft_sampling)."""
        draft_sampling.register()  # the rows' sampling parameters, if vLLM did not load it as a general plugin
        self.model_config = vllm_config.model_config
        self.device = torch.device(str(vllm_config.device_config.device))
        self.drafter: SmallModelDrafter | None = None

    def load_model(self, target_model: Any) -> None:
        """Load the draft on the worker's device (vLLM calls this after the target)."""
        from transformers import AutoModelForCausalLM

        dtype = self.model_config.dtype
        model = AutoModelForCausalLM.from_pretrained(str(self.path), dtype=dtype)
        params = sum(p.numel() for p in model.parameters())
        if self.device.type == "cpu" and params * 4 <= CPU_FLOAT32_MAX_BYTES:
            # A draft this small is bound by the cost of each operation, not by reading its weights,
            # and on CPUs a bf16 matrix-vector product costs more than a float32 one. Its drafts stay
            # exact in any dtype.
            model, dtype = model.float(), torch.float32
        model = model.to(self.device).eval()
        draft_vocab = int(model.config.vocab_size)
        target_vocab = int(self.model_config.get_vocab_size())
        if draft_vocab != target_vocab:
            raise ValueError(f"specdeploy small-model drafter: the draft {self.path} has a vocabulary of "
                             f"{draft_vocab} but the target has {target_vocab}; the draft must use the "
                             f"target's tokenizer")
        self.drafter = SmallModelDrafter(model, self.k, self.model_config.max_model_len, self.device,
                                         max_cache_mib=self.max_cache_mib, k_by_batch=self.k_by_batch,
                                         vocab_size=target_vocab)
        path = ("its forward pass from the weights" if isinstance(self.drafter.forward, LlamaDraft) else
                "transformers' forward pass (not a plain Llama checkpoint: slower per token)")
        log.info("specdeploy small-model drafter: %s (%.2fM parameters, %s) on %s, K=%d, %s drafts for sampled "
                 "requests, %s", self.path, params / 1e6, dtype, self.device, self.k,
                 "sampled" if self.probabilistic else "greedy", path)

    def set_draft_sampling(self, sampling: RowSampling) -> None:
        """This step's sampling parameters per row (plugins.draft_sampling)."""
        self.sampling = sampling
        self.gate.note(sampling.temperature)

    def take_last_draft_probs(self) -> torch.Tensor | None:
        """The distributions the last step's sampled drafts were drawn from (plugins.draft_sampling)."""
        return self.drafter.last_draft_probs if self.drafter is not None else None

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Any = None) -> list[list[int]]:
        if self.drafter is None:
            raise RuntimeError("SmallModelProposer.propose called before load_model")
        return self.drafter.propose(self.gate.rows(sampled_token_ids), num_tokens_no_spec, token_ids_cpu,
                                    self.sampling if self.probabilistic else None)
