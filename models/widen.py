"""Widen a trained Llama model without changing what it computes (Net2Net-style replication).

Why: serving a model small enough for a CPU to train costs framework overhead, not weights or
arithmetic, so speculative decoding behaves nothing like it does on a real deployment. Widening
the trained model `copies` times gives a dense model whose forward pass really reads and
multiplies `copies`^2 times the weights (bandwidth-bound at batch 1, compute-bound at batch 32,
as real targets are) while it predicts exactly what the trained model predicts (up to rounding).

How, for a residual stream of width d widened to n*d (every vector tiled n times):
  - embeddings and RMSNorm weights are tiled: the RMS of a tiled vector is the original RMS;
  - every linear layer reads a tiled input, so its input columns are tiled and divided by n
    (the n copies sum back to the original product); outputs feeding the residual stream or
    the MLP's inner neurons are tiled n times;
  - attention heads are copied: each query head n times, each key/value head `kv_copies` times,
    so every copy of a query head attends with a copy of its own key/value head (grouped-query
    attention with n / kv_copies query heads per key/value head); o_proj divides by n;
  - the LM head (untied from the embeddings) is the embedding matrix tiled and divided by n.
"""

from __future__ import annotations

from typing import Any


def widen_llama(model: Any, copies: int, kv_copies: int) -> Any:
    """A new `LlamaForCausalLM` `copies` times as wide that computes the same logits.

    The source must have as many key/value heads as query heads; `kv_copies` must divide `copies`.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    src: LlamaConfig = model.config
    if copies < 1 or kv_copies < 1 or copies % kv_copies:
        raise ValueError(f"copies ({copies}) must be a positive multiple of kv_copies ({kv_copies})")
    if src.num_key_value_heads != src.num_attention_heads:
        raise ValueError("widen_llama expects multi-head attention (as many key/value heads as query heads)")
    if src.attention_bias or src.mlp_bias:
        raise ValueError("widen_llama does not handle linear-layer biases")
    heads, head_dim, group = src.num_attention_heads, src.head_dim, copies // kv_copies
    config = LlamaConfig(**{**src.to_dict(), "hidden_size": src.hidden_size * copies,
                            "intermediate_size": src.intermediate_size * copies,
                            "num_attention_heads": heads * copies, "num_key_value_heads": heads * kv_copies,
                            "head_dim": head_dim, "tie_word_embeddings": False})
    wide = LlamaForCausalLM(config)

    def tiled_in(weight: torch.Tensor) -> torch.Tensor:
        """Columns for a tiled input: the n copies of each column, each divided by n."""
        return weight.repeat(1, copies) / copies

    def head_rows(weight: torch.Tensor, order: list[int]) -> torch.Tensor:
        """Rows of the heads in `order` (a projection's output grouped by head)."""
        blocks = weight.reshape(heads, head_dim, -1)
        return blocks[order].reshape(len(order) * head_dim, -1)

    # Key/value head g is a copy of source head g % heads; query head j belongs to key/value
    # group j // group, so it copies that group's source head.
    kv_order = [g % heads for g in range(heads * kv_copies)]
    q_order = [kv_order[j // group] for j in range(heads * copies)]

    with torch.no_grad():
        embed = model.model.embed_tokens.weight
        wide.model.embed_tokens.weight.copy_(embed.repeat(1, copies))
        wide.lm_head.weight.copy_(tiled_in(model.lm_head.weight))
        wide.model.norm.weight.copy_(model.model.norm.weight.repeat(copies))
        for old, new in zip(model.model.layers, wide.model.layers):
            new.input_layernorm.weight.copy_(old.input_layernorm.weight.repeat(copies))
            new.post_attention_layernorm.weight.copy_(old.post_attention_layernorm.weight.repeat(copies))
            a, b = old.self_attn, new.self_attn
            b.q_proj.weight.copy_(head_rows(tiled_in(a.q_proj.weight), q_order))
            b.k_proj.weight.copy_(head_rows(tiled_in(a.k_proj.weight), kv_order))
            b.v_proj.weight.copy_(head_rows(tiled_in(a.v_proj.weight), kv_order))
            # o_proj reads the concatenated heads: head j's columns are its source head's / n.
            o_cols = a.o_proj.weight.reshape(-1, heads, head_dim)[:, q_order].reshape(src.hidden_size, -1)
            b.o_proj.weight.copy_((o_cols / copies).repeat(copies, 1))
            m, w = old.mlp, new.mlp
            w.gate_proj.weight.copy_(tiled_in(m.gate_proj.weight).repeat(copies, 1))
            w.up_proj.weight.copy_(tiled_in(m.up_proj.weight).repeat(copies, 1))
            w.down_proj.weight.copy_(tiled_in(m.down_proj.weight).repeat(copies, 1))
    return wide.eval()
