"""A Llama-architecture draft's forward pass, run straight from its weights.

The small-model plugin feeds its draft one token at a time for one request at a time. Through
transformers each such forward pass of a small draft costs far more than its arithmetic: nearly
all of it is the generic machinery around a few small matrix products (mask building, cache
objects, module dispatch); vLLM's native draft-model path does the same work in its own kernels.
This module is the arithmetic of transformers' `LlamaForCausalLM` (RMSNorm, rotary positions,
grouped-query attention, SiLU MLP, the LM head) in a few tensor operations per layer, with a
plain per-request KV cache. It covers the Llama checkpoints a draft usually is (Llama, and the
SmolLM, TinyLlama and Qwen-style drafts saved as `llama`): default rotary positions, no biases.
`for_model` returns None for anything else, and the plugin keeps transformers for those.

The drafts stay exact whatever this computes: the verifier is handed the distribution each draft
was drawn from, so a numerical difference from transformers could only change acceptance. A test
holds its logits to transformers' all the same (tests/test_drafters_engine.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


class KVCache:
    """One request's keys and values, per layer [kv_heads, capacity, head_dim], the first `length`
    positions filled; grown by doubling, so appending a token rarely copies."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        empty = (kv_heads, 0, head_dim)
        self.keys = [torch.empty(empty, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.empty(empty, dtype=dtype, device=device) for _ in range(layers)]
        self.length = 0

    @property
    def capacity(self) -> int:
        """Positions this cache holds memory for (what the drafter's memory budget counts)."""
        return self.keys[0].shape[1]

    @staticmethod
    def grown(capacity: int, positions: int) -> int:
        """The capacity after `reserve(positions)` from `capacity`."""
        return capacity if positions <= capacity else max(positions, 2 * capacity, 64)

    def reserve(self, positions: int) -> None:
        """Room for `positions` positions in all (filled ones are kept)."""
        size = self.grown(self.capacity, positions)
        if size == self.capacity:
            return
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                new = old.new_empty((old.shape[0], size, old.shape[2]))
                new[:, : self.length] = old[:, : self.length]
                store[i] = new

    def crop(self, length: int) -> None:
        """Forget every position from `length` on (the drafts the target rejected)."""
        self.length = min(self.length, length)


@dataclass
class _Layer:
    attention_norm: torch.Tensor
    qkv: torch.Tensor  # q, k and v projections stacked: one matrix product instead of three
    out: torch.Tensor
    mlp_norm: torch.Tensor
    gate_up: torch.Tensor  # gate and up projections stacked
    down: torch.Tensor


class LlamaDraft:
    """`logits(ids, position, cache)`: the draft's next-token logits after feeding `ids`."""

    def __init__(self, model: Any, max_len: int):
        c = model.config
        self.heads = c.num_attention_heads
        self.kv_heads = c.num_key_value_heads or self.heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // self.heads
        self.eps = c.rms_norm_eps
        inner = model.model
        self.layers = [_Layer(layer.input_layernorm.weight, torch.cat([layer.self_attn.q_proj.weight,
                                                                       layer.self_attn.k_proj.weight,
                                                                       layer.self_attn.v_proj.weight]),
                              layer.self_attn.o_proj.weight, layer.post_attention_layernorm.weight,
                              torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]),
                              layer.mlp.down_proj.weight) for layer in inner.layers]
        self.embed = inner.embed_tokens.weight
        self.norm = inner.norm.weight
        self.head = model.lm_head.weight
        self.dtype = self.embed.dtype
        self.device = self.embed.device
        self.hidden = c.hidden_size
        # Rotary angles of every position, computed once (in float32, as transformers does).
        positions = min(int(getattr(c, "max_position_embeddings", 0) or 0) or max_len, max_len)
        angles = torch.outer(torch.arange(positions, device=self.device).float(), inner.rotary_emb.inv_freq.float())
        angles = torch.cat((angles, angles), -1)
        scale = float(getattr(inner.rotary_emb, "attention_scaling", 1.0))
        self.cos = (angles.cos() * scale).to(self.dtype)
        self.sin = (angles.sin() * scale).to(self.dtype)

    @classmethod
    def for_model(cls, model: Any, max_len: int) -> LlamaDraft | None:
        """The fast path for `model` on sequences of up to `max_len` tokens, or None where it would not
        compute what transformers does."""
        c = model.config
        rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
        if (getattr(c, "model_type", None) != "llama" or rope.get("rope_type", "default") != "default"
                or getattr(c, "attention_bias", False) or getattr(c, "mlp_bias", False)
                or getattr(c, "hidden_act", "silu") != "silu" or getattr(c, "pretraining_tp", 1) != 1):
            return None
        return cls(model, max_len)

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers), self.kv_heads, self.head_dim, self.dtype, self.device)

    @staticmethod
    def reserve(cache: KVCache, positions: int) -> None:
        """Make room for `positions` in one allocation before a drafting step (no growth inside it)."""
        cache.reserve(positions)

    @staticmethod
    def positions_held(cache: KVCache | None, positions: int = 0) -> int:
        """Positions `cache` (None: a new one) holds memory for once it has room for `positions`."""
        return KVCache.grown(0 if cache is None else cache.capacity, positions)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm in float32, scaled in the model's dtype (transformers' LlamaRMSNorm)."""
        return weight * F.rms_norm(x.float(), (self.hidden,), eps=self.eps).to(x.dtype)

    @torch.inference_mode()
    def logits(self, ids: torch.Tensor, position: int, cache: KVCache) -> torch.Tensor:
        """Feed `ids` ([n] token ids at positions `position`...) after the `position` tokens the
        cache holds; the logits [vocabulary] after the last of them."""
        n = ids.shape[0]
        cache.crop(position)
        end = position + n
        cache.reserve(end)
        cos, sin = self.cos[position:end], self.sin[position:end]
        mask = None  # one new token sees every position; several see the cache and the new ones up to their own
        if n > 1:
            mask = torch.arange(end, device=self.device)[None, :] <= torch.arange(position, end, device=self.device)[:, None]
        x = self.embed[ids]
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for i, layer in enumerate(self.layers):
            q, k, v = F.linear(self._rms(x, layer.attention_norm), layer.qkv).split([q_size, kv_size, kv_size], -1)
            q = _rotate(q.view(n, self.heads, self.head_dim).transpose(0, 1), cos, sin)
            k = _rotate(k.view(n, self.kv_heads, self.head_dim).transpose(0, 1), cos, sin)
            cache.keys[i][:, position:end] = k
            cache.values[i][:, position:end] = v.view(n, self.kv_heads, self.head_dim).transpose(0, 1)
            # With a batch dimension: on CPU, 3-D inputs take PyTorch's slow reference attention.
            attended = F.scaled_dot_product_attention(q[None], cache.keys[i][None, :, :end],
                                                      cache.values[i][None, :, :end], attn_mask=mask,
                                                      enable_gqa=self.heads != self.kv_heads)[0]
            x = x + F.linear(attended.transpose(0, 1).reshape(n, q_size), layer.out)
            gate, up = F.linear(self._rms(x, layer.mlp_norm), layer.gate_up).chunk(2, -1)
            x = x + F.linear(F.silu(gate) * up, layer.down)
        cache.length = end
        return F.linear(self._rms(x[-1], self.norm), self.head)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions as transformers applies them: x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin
