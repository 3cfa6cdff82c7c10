"""Sampled drafts and their probabilities, without an engine (plugins/draft_sampling.py).

vLLM's own rejection sampler (its CPU kernels, as the engine runs them) keeps the target's
distribution for a draft drawn from q exactly when it is told q, or told nothing (q taken as
one-hot at the drafted token); told another distribution than the one drawn from, it does not.
The plugins must therefore draw each draft token from exactly the distribution they hand over:
checked here for the bigram and the small-model drafters. The engine tests are in
test_drafters_engine.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from plugins.bigram import BigramDrafter
from plugins.bigram_table import build_arrays, load_table, save_table
from plugins.draft_sampling import RowSampling, warp_logits
from plugins.small_model import SmallModelDrafter

ALPHA = 1e-3


def goodness_of_fit(draws: np.ndarray, q: np.ndarray) -> float:
    """Chi-square p-value of integer draws against the distribution q (cells with expected < 5 pooled)."""
    n = len(draws)
    observed = np.bincount(draws, minlength=len(q)).astype(float)
    expected = q.astype(float) / q.sum() * n
    if observed[expected == 0].sum():
        return 0.0  # a draw the distribution gives no mass: certainly not from it
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    exp = exp[keep] * obs[keep].sum() / exp[keep].sum()  # float32 q: sums equal to rounding
    return float(chisquare(obs[keep], exp).pvalue)


# --- vLLM's verifier -----------------------------------------------------------------------------

# In a fresh interpreter: vLLM registers its CPU kernels by scanning the loaded modules, which fails
# once numba is loaded (as the bigram drafter's import does in this test session).
VERIFY = """
import json, sys, torch
from vllm.platforms import current_platform
from vllm.v1.sample import rejection_sampler as rs
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from plugins import vllm_fixes

if current_platform.is_cpu():
    current_platform.register_triton_kernel_overrides()
    vllm_fixes.apply()
torch.manual_seed(0)
n = 20000
p = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
q = torch.tensor([0.05, 0.05, 0.10, 0.20, 0.30, 0.30])
drafts = torch.multinomial(q, n, replacement=True)
meta = SamplingMetadata(
    temperature=torch.ones(n), all_greedy=False, all_random=True, top_p=None, top_k=None, generators={},
    max_num_logprobs=None, no_penalties=True, prompt_token_ids=None, frequency_penalties=torch.zeros(n),
    presence_penalties=torch.zeros(n), repetition_penalties=torch.ones(n), output_token_ids=[[]] * n,
    allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())
result = {"p": p.tolist()}
for name, told in (("q", q), ("nothing", None), ("q^2", q ** 2 / (q ** 2).sum())):
    out = rs.rejection_sample(drafts.to(torch.int32), [1] * n, 1, torch.arange(1, n + 1, dtype=torch.int32),
                              None if told is None else told.repeat(n, 1).contiguous(),
                              torch.log(p).repeat(n, 1).contiguous(), torch.zeros((n, 1), dtype=torch.int32), meta)
    result[name] = out[:, 0].tolist()
print(json.dumps(result))
"""


def test_the_verifier_is_exact_only_when_told_the_distribution_drafts_were_drawn_from() -> None:
    """Drafts drawn from q: verified against q (what the plugins hand over) or against nothing
    (vLLM 0.32's custom proposers: q taken as one-hot, so "q = 1" at the drafted token), the output
    follows p; told q at another temperature (q^2, normalised), it does not. This is why a sampled
    draft's probabilities must be exactly those it was drawn from, and why without them sampled
    drafts are still lossless, only rarely accepted."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", VERIFY], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    p = np.array(result["p"])
    pvalues = [goodness_of_fit(np.array(result[name]), p) for name in ("q", "nothing", "q^2")]
    print(f"p-values: told q {pvalues[0]:.3g}, told nothing {pvalues[1]:.3g}, told q^2 {pvalues[2]:.3g}")
    assert pvalues[0] > ALPHA and pvalues[1] > ALPHA
    assert pvalues[2] < 1e-10


# --- the rows' sampling parameters ---------------------------------------------------------------

def test_warped_draft_distribution_matches_vllms_top_k_top_p() -> None:
    """The plugins' drafts use the temperature, top-k and top-p the target's sampler applies."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    torch.manual_seed(0)
    logits = torch.randn(40) * 3
    for temperature, top_k, top_p in ((1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (1.0, 7, 0.6), (0.5, 40, 0.95)):
        ours = warp_logits(logits, temperature, top_k, top_p)
        scaled = (logits / temperature)[None].clone()
        theirs = apply_top_k_top_p_pytorch(scaled, torch.tensor([top_k or 40]), torch.tensor([top_p])).softmax(-1)[0]
        assert torch.allclose(ours, theirs, atol=1e-6), (temperature, top_k, top_p)
        assert ours.sum().item() == pytest.approx(1, abs=1e-5)


def _sampling(temperature: list[float], vocab: int, top_k: list[int] | None = None,
              top_p: list[float] | None = None) -> RowSampling:
    rows = len(temperature)
    return RowSampling(np.array(temperature, np.float32), np.array(top_p or [1.0] * rows, np.float32),
                       np.array(top_k or [vocab] * rows, np.int32), vocab)


# --- the bigram drafter --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bigram_table(tmp_path_factory) -> object:
    """A table of 32 ids whose successors are spread out (several likely successors per token)."""
    rng = np.random.default_rng(0)
    vocab = 32
    sequences = []
    for _ in range(200):
        seq = [int(rng.integers(vocab))]
        for _ in range(60):  # successor a+1, a+2 or a+3 mostly, anything sometimes
            seq.append((seq[-1] + int(rng.choice([1, 2, 3], p=[0.5, 0.3, 0.2]))) % vocab
                       if rng.random() < 0.9 else int(rng.integers(vocab)))
        sequences.append(seq)
    path = save_table(build_arrays(sequences, vocab, "test", top_k=6), tmp_path_factory.mktemp("table") / "t.npz")
    return load_table(path)


def test_bigram_draws_each_draft_from_the_distribution_it_hands_over(bigram_table) -> None:
    table = bigram_table
    drafter = BigramDrafter(table, k=3, context_weight=4.0, min_probability=0.0, max_batch_size=0,
                            max_model_len=256, model_vocab_size=table.vocab_size + 8)  # a padded model vocabulary
    tokens = np.zeros((3, 256), np.int32)
    tokens[:, :6] = [[8, 20, 4, 5, 7, 8], [8, 20, 4, 5, 7, 8], [3, 4, 6, 7, 9, 10]]
    lengths = np.full(3, 6, np.int32)
    sampling = _sampling([1.0, 0.0, 0.7], table.vocab_size + 8)
    greedy = drafter.propose([[1]] * 3, lengths, tokens)
    first, q_first, seconds = [], None, {}
    for _ in range(4000):
        drafts = drafter.propose([[1]] * 3, lengths, tokens, sampling)
        probs = drafter.last_draft_probs
        assert probs is not None and probs.shape == (3, 3, table.vocab_size + 8)
        assert drafts[1] == greedy[1] and not probs[1].any()  # greedy rows: the argmax chain, no probabilities
        for row in (0, 2):
            assert len(drafts[row]) == 3
            for j, token in enumerate(drafts[row]):
                assert probs[row, j, token] > 0 and probs[row, j].sum() == pytest.approx(1, abs=1e-5)
        q_first = probs[0, 0] if q_first is None else q_first
        assert np.array_equal(probs[0, 0], q_first)  # the first position's distribution depends on the history only
        first.append(drafts[0][0])
        seconds.setdefault(drafts[0][0], ([], probs[0, 1].copy()))[0].append(drafts[0][1])
    p_first = goodness_of_fit(np.array(first), q_first)
    # The second position: drawn from its distribution given the first draft.
    token, (draws, q_second) = max(seconds.items(), key=lambda item: len(item[1][0]))
    p_second = goodness_of_fit(np.array(draws), q_second)
    print(f"bigram draws vs the probabilities handed over: p = {p_first:.3g} (first), {p_second:.3g} (second)")
    assert p_first > ALPHA and p_second > ALPHA
    # The context counts move the distribution: "8 20" is in the history, rare in the table.
    assert q_first[20] > 0.3 > table.prob(np.array([8]), np.array([20]))[0]
    assert q_first[table.vocab_size:].sum() == 0  # no ids past the table's vocabulary


def test_bigram_sampling_applies_temperature_top_k_and_top_p(bigram_table) -> None:
    table = bigram_table
    drafter = BigramDrafter(table, k=1, context_weight=0.0, min_probability=0.0, max_batch_size=0,
                            max_model_len=256)
    tokens = np.zeros((5, 256), np.int32)
    tokens[:, 0] = 4
    lengths = np.ones(5, np.int32)
    vocab = table.vocab_size
    drafter.propose([[1]] * 5, lengths, tokens, _sampling([1.0, 0.5, 1.0, 1.0, 1.0], vocab,
                                                          top_k=[vocab, vocab, 2, vocab, 1], top_p=[1, 1, 1, 0.5, 1]))
    q = drafter.last_draft_probs[:, 0]
    listed = dict(table.successors_of(4))
    base = np.zeros(vocab)
    base[list(listed)] = list(listed.values())
    base /= base.sum()  # T=1: the table's listed successors, its add-one floor left out
    assert np.allclose(q[0], base, atol=1e-6)
    assert np.allclose(q[1], base ** 2 / (base ** 2).sum(), atol=1e-6)  # T=0.5
    assert (q[2] > 0).sum() == 2 and q[2].argmax() == base.argmax()
    kept = np.flatnonzero(q[3])
    assert base[kept].sum() >= 0.5 and base[kept].sum() - base[kept].min() < 0.5  # the fewest reaching top-p
    assert q[4].max() == 1 and q[4].argmax() == base.argmax()  # top-k 1: the argmax, certain


def test_bigram_decides_to_stop_before_drawing(bigram_table) -> None:
    """A chain stops where the most likely successor is below min_probability, whatever is drawn:
    draft lengths do not depend on the tokens drawn at the positions they keep."""
    table = bigram_table
    drafter = BigramDrafter(table, k=4, context_weight=0.0, min_probability=0.99, max_batch_size=0, max_model_len=256)
    tokens = np.zeros((1, 256), np.int32)
    tokens[0, 0] = 4
    drafts = drafter.propose([[1]], np.ones(1, np.int32), tokens, _sampling([1.0], table.vocab_size))
    assert drafts == [[]] and drafter.last_draft_probs is None  # nothing drawn, nothing to verify against


# --- the small-model drafter ---------------------------------------------------------------------

def test_small_model_draws_each_draft_from_the_distribution_it_hands_over() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=24, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=64)).eval()
    with torch.no_grad():  # a spread-out distribution (random small weights give a nearly uniform one)
        model.lm_head.weight.mul_(20)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        drafter = SmallModelDrafter(model, 2, max_model_len=64, vocab_size=30)  # a padded target vocabulary
        tokens = np.zeros((2, 64), np.int32)
        tokens[:, :3] = [[1, 2, 3], [1, 2, 3]]
        lengths = np.full(2, 3, np.int32)
        sampling = _sampling([1.0, 0.0], 30, top_k=[8, 30])
        greedy = drafter.propose([[3]] * 2, lengths, tokens)
        assert drafter.last_draft_probs is None
        first, q_first = [], None
        for _ in range(1500):
            drafts = drafter.propose([[3]] * 2, lengths, tokens, sampling)
            probs = drafter.last_draft_probs
            assert probs is not None and probs.shape == (2, 2, 30)
            assert drafts[1] == greedy[1] and not probs[1].any()
            for j, token in enumerate(drafts[0]):
                assert probs[0, j, token] > 0 and (probs[0, j] > 0).sum() == 8  # top-k 8
            q_first = probs[0, 0].numpy().copy() if q_first is None else q_first
            assert np.allclose(probs[0, 0].numpy(), q_first, atol=1e-6)
            first.append(drafts[0][0])
    finally:
        torch.set_num_threads(threads)
    p = goodness_of_fit(np.array(first), q_first)
    print(f"small-model draws vs the probabilities handed over: p = {p:.3g}")
    assert p > ALPHA
    assert q_first[24:].sum() == 0
