"""The bigram drafter: a deterministic chain of likely next tokens, vectorised over the batch.

Each step, for every running request, it starts from the last token `a` and repeats up to K
times: pick the most likely successor `b` of `a`, stop before it if its probability is below
`min_probability`, else append it and continue from `b`. Probabilities combine the corpus table
(`plugins.bigram_table`) with counts from the request's own tokens (prompt + output so far):

    P(b | a) = (w * c(a, b) + P_table(b | a)) / (w * N(a) + 1)

where c(a, b) counts `a b` in the request's context, N(a) the times `a` was followed by anything
there, and w = `context_weight`: with no context counts this is the table; one occurrence
with w = 4 already weighs 0.8. For greedy requests the chain is an argmax, verified as certain
(one-hot draft probabilities).

With `draft_sampling: probabilistic`, sampled requests draw their chain instead: at each position
the drafter's distribution is P(. | a) over the successors it knows (the table's listed ones and
those the context counted), raised to 1/T at the request's temperature T and cut by its top-k and
top-p, and the draft token is drawn from it; the distribution goes to vLLM's verifier
(`plugins.draft_sampling`), which keeps the target's output distribution for any draft
distribution it is given. The table's add-one floor, the share of tokens never seen after `a`, is
not drafted: spread over the whole vocabulary it would draw tokens the target almost never picks,
and the verifier's residual max(p - q, 0) covers them. Whether a position is drafted (the most
likely successor at least `min_probability`) is decided before its token is drawn, never after
(dropping an unlikely draw would bias the drafts against the probabilities handed over).

vLLM passes no request ids to `propose`, so context counts live in per-row slots that are
validated by content: a slot remembers how much of its row's history it has counted and a few
of those tokens; when the row holds something else (a request finished and another moved into
its row, a new or resumed request) the slot is rebuilt from the row's history, otherwise only
the new tokens are counted. Counts are kept in small per-slot hash tables (direct-mapped: a
collision forgets a count, which can cost acceptance but never correctness). Everything is a
pure function of the calls' inputs, so every tensor-parallel rank proposes the same tokens.

The per-token work (counting, chains) runs in loops compiled with numba, as vLLM's own n-gram
drafter does: a small part of a step even with hundreds of running requests, faster than numpy
(`benchmark_propose` measures it).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numba
import numpy as np
import torch

from plugins.drafters import DRAFTERS
from plugins import draft_sampling, k_by_batch_size, k_for_batch, num_speculative_tokens, plugin_options, vllm_fixes
from plugins.draft_sampling import RowSampling
from plugins.bigram_table import BigramTable, BigramTableError, load_table, tokenizer_fingerprint
from plugins.temperature_gate import TemperatureGate

# Inside vLLM's worker processes: a child of vLLM's logger, so these lines reach the server log.
log = logging.getLogger("vllm.specdeploy.bigram")
DEFAULTS = DRAFTERS["bigram"].options

_HASH_MULT = np.int64(-7046029254386353131)  # 0x9E3779B97F4A7C15 (Fibonacci hashing), wrapping int64
_LOW32 = np.int64(0xFFFFFFFF)
_HIGH32 = ~_LOW32
_TAG_BITS = np.int64(0x7FFFFFFF)
_TAG_SET = np.int64(0x80000000)  # makes every pair tag non-zero (0 marks an empty bucket)


def pair_hash(a: Any, b: Any, bits: int) -> tuple[Any, Any]:
    """Bucket in [0, 2**bits) of each (a, b) pair (the product's top bits), and its tag in the high
    32 bits: the 31 bits below the bucket's, which depend on both ids, plus one set bit.
    Plain operators only: the same code runs on numpy arrays and, compiled, on scalars."""
    h = ((a << np.int64(32)) | b) * _HASH_MULT
    bucket = (h >> np.int64(64 - bits)) & ((np.int64(1) << np.int64(bits)) - np.int64(1))
    return bucket, (((h >> np.int64(33 - bits)) & _TAG_BITS) | _TAG_SET) << np.int64(32)


# The per-token loops below are compiled with numba (a vLLM dependency; vLLM's own n-gram drafter
# is compiled the same way): one pass over each row's new tokens and one over its chain, with no
# per-operation interpreter cost. cache=True keeps the machine code between processes.
_pair_hash = numba.njit(cache=True, inline="always")(pair_hash)


@numba.njit(cache=True)
def _table_prob(listed: np.ndarray, listed_probs: np.ndarray, floor: np.ndarray, vocab_size: int,
                a: int, b: int) -> float:
    row = min(a, vocab_size)
    for j in range(listed.shape[1]):
        s = listed[row, j]
        if s == b:
            return listed_probs[row, j]
        if s < 0:
            break
    return floor[row]


# A token record: 4 float32 (16 bytes, a quarter of a cache line), read and written together. Ids and
# counts are exact in float32 up to 2**24, past any vocabulary (MAX_VOCAB) and any count we keep.
_KEY, _TOTAL, _BEST, _SCORE = range(4)
_RECORD = 4


@numba.njit(cache=True, inline="always")
def _drafts(length, grown, max_model_len):
    """Whether a row gets a draft: it gained a token this step (not a partial prefill, not discarded)
    and has room left in the context window."""
    return grown > 0 and 0 < length < max_model_len


@numba.njit(cache=True)
def _sync_kernel(lengths, grown, max_model_len, flat, width, slot_state, probes, pairs, pair_bits, tokens,
                 token_bits, fresh_tokens, dense, weight, listed, listed_probs, floor, vocab_size):
    """Count each drafting row's new tokens into its slot (rebuilding slots whose row holds another request)."""
    pair_width, token_width = 1 << pair_bits, 1 << token_bits
    # Touch every bucket the update below will read: these loads are independent, so the CPU
    # overlaps their cache misses; the update loop (branchy, each step reading what the previous
    # wrote) would otherwise wait for them one at a time.
    touched = 0
    for r in range(grown.size):
        length = np.int64(lengths[r])
        if _drafts(length, grown[r], max_model_len):
            for pos in range(r * width + max(slot_state[r, 0], 1), r * width + length):
                a, b = np.int64(flat[pos - 1]), np.int64(flat[pos])
                bucket, _ = _pair_hash(a, b, pair_bits)
                touched += pairs[(r << pair_bits) | bucket] + np.int64(tokens[(r << token_bits) | (a & (token_width - 1)), 0])
    for r in range(grown.size):
        length = np.int64(lengths[r])
        if not _drafts(length, grown[r], max_model_len):
            continue
        off = r * width
        state = slot_state[r]  # seen, first token, last counted token, then `probes` (position, token) pairs
        seen = state[0]
        same = seen > 0 and seen + grown[r] == length and flat[off] == state[1] and flat[off + seen - 1] == state[2]
        for p in range(probes):
            if same and flat[off + state[3 + 2 * p]] != state[4 + 2 * p]:
                same = False
        if not same:  # another request in this row (or a first sight): rebuild the slot
            seen = 0
            pairs[r * pair_width:(r + 1) * pair_width] = 0
            tokens[r * token_width:(r + 1) * token_width] = fresh_tokens
        for pos in range(off + max(seen, 1), off + length):
            a, b = np.int64(flat[pos - 1]), np.int64(flat[pos])
            # c(a, b): a new pair takes its bucket over (a collision forgets the old count)
            bucket, tag = _pair_hash(a, b, pair_bits)
            pi = (r << pair_bits) | bucket
            if (pairs[pi] & _HIGH32) != tag:
                pairs[pi] = tag
            pairs[pi] += 1
            # N(a) and a's best context successor (scores only grow; ties go to the latest)
            t = tokens[(r << token_bits) | (a & (token_width - 1))]
            if not dense and t[_KEY] != a:
                t[_KEY], t[_TOTAL], t[_BEST], t[_SCORE] = a, 0, -1, -np.inf
            t[_TOTAL] += 1
            # float32 like the record, so that equal scores compare equal (ties go to the latest)
            score = np.float32(weight * (pairs[pi] & _LOW32) + _table_prob(listed, listed_probs, floor, vocab_size, a, b))
            if score >= t[_SCORE]:
                t[_SCORE], t[_BEST] = score, b
        state[0], state[1], state[2] = length, flat[off], flat[off + length - 1]
        for p in range(probes):  # positions 0 and evenly up to the last counted token
            q = length * p // probes
            state[3 + 2 * p], state[4 + 2 * p] = q, flat[off + q]
    return touched


@numba.njit(cache=True)
def _chain_kernel(lengths, grown, max_model_len, flat, width, unknown, k, min_probability, table_next,
                  table_prob, tokens, token_bits, dense, weight, drafts, count):
    """Each drafting row's chain of up to k argmax successors from its last token; `tokens`: the
    context's records, None for the table alone. Step by step over all rows, not row by row: the
    rows' look-ups are independent, so the CPU overlaps their cache misses."""
    current = np.full(grown.size, -1, dtype=np.int64)  # -1: no (more) drafting
    for r in range(grown.size):
        if _drafts(np.int64(lengths[r]), grown[r], max_model_len):
            current[r] = min(np.int64(flat[r * width + lengths[r] - 1]), unknown)
    for step in range(k):
        any_alive = False
        for r in range(grown.size):
            cur = current[r]
            if cur < 0:
                continue
            nxt, prob = table_next[cur], table_prob[cur]
            if tokens is not None:
                t = tokens[(r << token_bits) | (cur & ((1 << token_bits) - 1))]
                if dense or t[_KEY] == cur:  # the context counted cur (dense: every id has a record)
                    if t[_BEST] >= 0 and t[_SCORE] >= prob:  # its best successor beats the table's
                        nxt, prob = np.int64(t[_BEST]), t[_SCORE]
                    prob = prob / (weight * t[_TOTAL] + 1)
            # -1 (no successor known) stops the chain too; so does the end of the context window
            if prob >= min_probability and lengths[r] + step < max_model_len:
                drafts[r, step] = nxt
                current[r] = min(nxt, unknown)
                count[r] = step + 1
                any_alive = True
            else:
                current[r] = -1
        if not any_alive:
            break


@numba.njit(cache=True)
def _sample_kernel(rows, lengths, max_model_len, flat, width, k, min_probability, listed, listed_probs,
                   table_vocab, weight, temperature, top_k, top_p, uniforms, drafts, count, probs):
    """Each sampled row's chain of up to k tokens drawn from the mixed bigram distribution (module
    doc), written with their distributions to `probs[row, position]`. The context's counts of the
    current token are read from the row's history directly (one pass per position), as the full
    distribution needs every successor, not the best one the hashed records keep."""
    vocab = probs.shape[2]
    mass = np.zeros(vocab, dtype=np.float64)  # w * c(a, b) + P_table(b | a), over the support
    support = np.empty(vocab, dtype=np.int64)  # the successors with mass, in the order first seen
    for i in range(rows.size):
        r = rows[i]
        length = np.int64(lengths[r])
        off = r * width
        current = np.int64(flat[off + length - 1])
        for step in range(k):
            if length + step >= max_model_len:
                break
            n = 0
            token = current
            row = min(current, table_vocab)  # ids past the table: its empty last row
            for j in range(listed.shape[1]):
                b = np.int64(listed[row, j])
                if b < 0:
                    break
                if b < vocab and listed_probs[row, j] > 0:
                    if mass[b] == 0:
                        support[n] = b
                        n += 1
                    mass[b] += listed_probs[row, j]
            seen = 0
            for pos in range(off, off + length - 1):
                if weight > 0 and flat[pos] == current:
                    seen += 1
                    b = np.int64(flat[pos + 1])
                    if b < vocab:
                        if mass[b] == 0:
                            support[n] = b
                            n += 1
                        mass[b] += weight
            best = 0.0
            for j in range(n):
                best = max(best, mass[support[j]])
            stop = n == 0 or best / (weight * seen + 1) < min_probability
            if not stop:
                # Temperature, then top-k, then top-p, as vLLM's sampler treats the target's logits.
                kept = support[:n][np.argsort(-mass[support[:n]], kind="mergesort")]
                scores = np.log(mass[kept]) / temperature[i]
                scores = np.exp(scores - scores[0])
                if 0 < top_k[i] < kept.size:
                    kept, scores = kept[:top_k[i]], scores[:top_k[i]]
                if top_p[i] < 1:
                    cumulative = np.cumsum(scores) / scores.sum()
                    last = np.searchsorted(cumulative, top_p[i])  # the first position reaching top_p
                    kept, scores = kept[:last + 1], scores[:last + 1]
                q = (scores / scores.sum()).astype(np.float32)
                # Draw from exactly the float32 distribution handed to the verifier.
                total = 0.0
                for j in range(q.size):
                    total += q[j]
                target, acc, choice = uniforms[i, step] * total, 0.0, 0
                for j in range(q.size):
                    if q[j] > 0:
                        choice = j  # the last with mass, should rounding leave target past the end
                        acc += q[j]
                        if target < acc:
                            break
                for j in range(q.size):
                    probs[r, step, kept[j]] = q[j]
                token = kept[choice]
                drafts[r, step] = token
                count[r] = step + 1
            for j in range(n):
                mass[support[j]] = 0.0
            if stop:
                break
            current = token


class ContextCounts:
    """Bigram counts of each batch row's own history, updated incrementally (see module doc).

    Per row slot, two direct-mapped hash tables:
    - pairs: one int64 per bucket, a 32-bit tag of (a, b) above its count c(a, b);
    - tokens (bucket: a mod size), one 16-byte record each: `a`, N(a), and the best context
      successor b* with its score w * c(a, b*) + P_table(b* | a). A chain step reads one record
      and the table's top successor of `a`, and takes whichever scores higher.
    A slot keeps counting its row only while the row is provably the same request: its length
    grew by exactly the tokens sampled this step, and its first token, its last counted token and
    `PROBES` tokens spread over the counted history are unchanged. A new request moved into the
    row (even one sharing a long prompt prefix) fails one of these and the slot is rebuilt.

    With a small vocabulary (up to `DENSE_VOCAB` ids) every token id has its own bucket, filled
    with the table's choice until the context counts it: no key checks. Larger vocabularies hash
    by id (a collision forgets a count: acceptance, never correctness) and fall back to the table
    where the context has no record.
    """

    DENSE_VOCAB = 4096
    PROBES = 4

    def __init__(self, table: BigramTable, context_weight: float, max_model_len: int, ids: int):
        """`ids`: how many token ids may occur (the drafter's table rows)."""
        self.table = table
        self.weight = np.float32(context_weight)
        self.dense = ids <= self.DENSE_VOCAB
        # Four pair buckets per history token (fewer collisions); one token bucket per id (dense)
        # or per history token: 32 KB of pairs and 32 KB of token records per row of 1024 tokens.
        self.pair_bits = int(np.clip(np.ceil(np.log2(4 * max(max_model_len, 1))), 8, 14))
        if self.dense:
            self.token_bits = max(int(np.ceil(np.log2(ids))), 1)
        else:
            self.token_bits = int(np.clip(np.ceil(np.log2(max(max_model_len, 1))), 8, 12))
        # An empty slot's token records (dense: keyed by position already).
        fresh = np.zeros((1 << self.token_bits, _RECORD), np.float32)
        fresh[:, [_KEY, _BEST]] = -1
        fresh[:, _SCORE] = -np.inf
        if self.dense:
            fresh[:, _KEY] = np.arange(len(fresh))
        self.fresh_tokens = fresh
        self.slots = 0
        self.slot_state = np.zeros((0, 3 + 2 * self.PROBES), dtype=np.int64)
        """Per slot: history tokens counted (0: empty, rebuild), first token, last counted token, probes."""
        self.pairs = np.zeros(0, dtype=np.int64)
        self.tokens = np.zeros((0, _RECORD), np.float32)
        self.ensure(8)

    def ensure(self, slots: int) -> None:
        """Room for `slots` rows (grown, never shrunk: vLLM reuses its batch rows). New slots are
        empty (nothing counted), so their first sync builds them."""
        if slots <= self.slots:
            return
        slots = max(slots, 2 * self.slots)
        grow = slots - self.slots
        self.slot_state = np.concatenate([self.slot_state, np.zeros((grow, self.slot_state.shape[1]), np.int64)])
        self.pairs = np.concatenate([self.pairs, np.zeros(grow << self.pair_bits, np.int64)])
        self.tokens = np.concatenate([self.tokens, np.zeros((grow << self.token_bits, _RECORD), np.float32)])
        self.slots = slots

    def sync(self, lengths: np.ndarray, grown: np.ndarray, max_model_len: int, flat: np.ndarray, width: int) -> None:
        """Bring the slots of the drafting rows up to date with their histories
        `flat[row * width:][:length]` (`flat`: vLLM's token array, flattened; `grown`: the tokens
        each row gained this step, vLLM's sampled tokens)."""
        self.ensure(len(grown))
        t = self.table
        _sync_kernel(lengths, grown, max_model_len, flat, width, self.slot_state, self.PROBES, self.pairs,
                     self.pair_bits, self.tokens, self.token_bits, self.fresh_tokens, self.dense, self.weight,
                     t.listed, t.listed_probs, t.floor, t.vocab_size)


class BigramDrafter:
    """The drafting logic, independent of vLLM's config objects (tests and benchmarks build it directly)."""

    def __init__(self, table: BigramTable, k: int, context_weight: float = DEFAULTS["context_weight"],
                 min_probability: float = DEFAULTS["min_probability"], max_batch_size: int = DEFAULTS["max_batch_size"],
                 max_model_len: int = 1 << 20, model_vocab_size: int | None = None,
                 k_by_batch: list[int] | None = None, seed: int = 0):
        if k < 1:
            raise ValueError("k must be >= 1")
        self.table = table
        self.k = k
        self.context_weight = float(context_weight)
        self.min_probability = float(min_probability)
        self.max_batch_size = int(max_batch_size)
        self.k_by_batch = k_by_batch
        """K per running batch size (speculation.schedule), None: K at every size."""
        self.max_model_len = int(max_model_len)
        # The table's chain step per token id: next token and probability, -1 for "no known
        # successor" (stops the chain). Rows up to the model's vocabulary (it may be padded past
        # the tokenizer's), plus a last one that ids past them and the -1 of a stopped chain index.
        rows = max(table.vocab_size, int(model_vocab_size or 0)) + 2
        self._next = np.full(rows, -1, dtype=np.int64)
        self._prob = np.full(rows, -1, dtype=np.float32)
        known = np.flatnonzero(table.top_next[: table.vocab_size] >= 0)
        self._next[known], self._prob[known] = table.top_next[known], table.top_prob[known]
        if model_vocab_size:  # a tokenizer larger than the model's embedding: never draft past it
            past = self._next >= int(model_vocab_size)
            self._next[past], self._prob[past] = -1, -1
        self._unknown = rows - 1
        self.context = (ContextCounts(table, context_weight, max_model_len, rows)
                        if context_weight > 0 else None)
        self.vocab_size = int(model_vocab_size or table.vocab_size)
        """Width of the draft probabilities handed to the verifier (the target's logits)."""
        self.rng = np.random.default_rng(seed)  # one fixed stream: every tensor-parallel rank draws alike
        self.last_draft_probs: np.ndarray | None = None
        """[rows, K, vocabulary] float32 of the last `propose` that sampled a draft, else None."""

    def warm_up(self) -> None:
        """Compile the kernels (or load them from numba's cache) for vLLM's int32 arrays now, not on
        the first request. The slot it touches is rebuilt when a request arrives."""
        self.propose([[0]], np.ones(1, dtype=np.int32), np.zeros((1, 2), dtype=np.int32))
        sampled = RowSampling(np.ones(1, np.float32), np.ones(1, np.float32), np.zeros(1, np.int32), self.vocab_size)
        self.propose([[0]], np.ones(1, dtype=np.int32), np.zeros((1, 2), dtype=np.int32), sampled)
        self.last_draft_probs = None

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, sampling: RowSampling | None = None) -> list[list[int]]:
        """Drafts per row; with `sampling`, rows of sampled requests draw theirs (`last_draft_probs`)."""
        batch = len(sampled_token_ids)
        self.last_draft_probs = None
        if batch == 0:
            return []
        k = k_for_batch(self.k_by_batch, self.k, batch)
        if k == 0 or (self.max_batch_size and batch > self.max_batch_size):
            return [[] for _ in range(batch)]  # empty drafts keep vLLM's speculative path running
        lengths = num_tokens_no_spec[:batch]
        grown = np.fromiter(map(len, sampled_token_ids), dtype=np.int64, count=batch)
        drafts = np.zeros((batch, k), dtype=np.int64)
        count = np.zeros(batch, dtype=np.int64)
        if sampling is not None:
            hot = np.flatnonzero(sampling.sampled[:batch] & (grown > 0))
            if hot.size:
                self.last_draft_probs = probs = np.zeros((batch, k, self.vocab_size), dtype=np.float32)
                _sample_kernel(hot, lengths, self.max_model_len, token_ids_cpu.reshape(-1), token_ids_cpu.shape[1],
                               k, self.min_probability, self.table.listed, self.table.listed_probs,
                               self.table.vocab_size, self.context_weight,
                               sampling.temperature[hot].astype(np.float64), sampling.top_k[hot].astype(np.int64),
                               sampling.top_p[hot].astype(np.float64), self.rng.random((hot.size, k)),
                               drafts, count, probs)
                if not count[hot].any():
                    self.last_draft_probs = None  # nothing drawn: nothing for the verifier
                grown = grown.copy()
                grown[hot] = 0  # drawn: the greedy chain below skips them (their slots rebuild if reused)
        flat = token_ids_cpu.reshape(-1)  # a view: vLLM's array is contiguous
        width = token_ids_cpu.shape[1]
        context = self.context
        if context is not None:
            context.sync(lengths, grown, self.max_model_len, flat, width)
        _chain_kernel(lengths, grown, self.max_model_len, flat, width, self._unknown, k, self.min_probability,
                      self._next, self._prob, context.tokens if context else None,
                      context.token_bits if context else 0, bool(context and context.dense),
                      context.weight if context else np.float32(0), drafts, count)
        # One fresh list per request (vLLM's scheduler edits them in place); cut the short ones.
        out = drafts.tolist()
        short = np.flatnonzero(count < k)
        for i, n in zip(short.tolist(), count[short].tolist()):
            del out[i][n:]
        return out


class BigramProposer:
    """vLLM custom_class proposer (`speculative_config.method: custom_class`), see the module doc.

    Options (from `additional_config["specdeploy"]`, declared in deploy.config.BigramOptions, defaults
    in plugins/drafters.py):
    `table`, `context_weight`, `min_probability`, `max_batch_size`, and from the config's
    speculation section `schedule`, `draft_sampling` and `draft_max_temperature` (plugins.temperature_gate). K is
    `speculative_config.num_speculative_tokens`.
    """

    def __init__(self, vllm_config: Any):
        vllm_fixes.apply()  # vLLM 0.32 on CPU verifies drafts at a garbage temperature otherwise
        options = plugin_options(vllm_config, "bigram")
        model_config = vllm_config.model_config
        tokenizer = str(model_config.tokenizer)
        try:
            if not options.get("table"):
                raise BigramTableError("no table in its options (speculation.bigram.table)")
            expected = tokenizer_fingerprint(tokenizer, getattr(model_config, "tokenizer_revision", None),
                                             local_only=False)
            table = load_table(options["table"], expected, tokenizer)
        except BigramTableError as exc:
            # Refuse to start: a table of another tokenizer would draft meaningless ids.
            raise BigramTableError(f"specdeploy bigram drafter refuses to start: {exc}") from None
        get_vocab = getattr(model_config, "get_vocab_size", None)
        self.gate = TemperatureGate(options.get("draft_max_temperature"))
        self.probabilistic = options.get("draft_sampling") == "probabilistic"
        """Sampled requests get sampled drafts (else argmax chains, as for greedy requests)."""
        self.sampling: RowSampling | None = None
        """This step's rows' sampling parameters, from the runner (plugins.draft_sampling)."""
        draft_sampling.register()  # the rows' sampling parameters, if vLLM did not load it as a general plugin
        self.drafter = BigramDrafter(
            table, num_speculative_tokens(vllm_config), options["context_weight"],
            options["min_probability"], options["max_batch_size"], model_config.max_model_len,
            model_vocab_size=get_vocab() if get_vocab else None, k_by_batch=k_by_batch_size(vllm_config, options))
        began = time.perf_counter()
        self.drafter.warm_up()
        log.info("specdeploy bigram drafter: table %s (vocabulary %d), K=%d, context_weight=%g, "
                 "min_probability=%g, max_batch_size=%d, %s drafts for sampled requests; compiled loops ready "
                 "in %.1f s", table.path, table.vocab_size, self.drafter.k, self.drafter.context_weight,
                 self.drafter.min_probability, self.drafter.max_batch_size,
                 "sampled" if self.probabilistic else "greedy", time.perf_counter() - began)

    def load_model(self, target_model: Any) -> None:
        """Nothing to load (the CPU runner calls it for every drafter)."""

    def set_draft_sampling(self, sampling: RowSampling) -> None:
        """This step's sampling parameters per row (plugins.draft_sampling)."""
        self.sampling = sampling
        self.gate.note(sampling.temperature)

    def take_last_draft_probs(self) -> torch.Tensor | None:
        """The distributions the last step's sampled drafts were drawn from (plugins.draft_sampling)."""
        probs = self.drafter.last_draft_probs
        return None if probs is None else torch.from_numpy(probs)

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Any = None) -> list[list[int]]:
        return self.drafter.propose(self.gate.rows(sampled_token_ids), num_tokens_no_spec, token_ids_cpu,
                                    self.sampling if self.probabilistic else None)


def benchmark_propose(table: BigramTable, batch: int = 256, k: int = 8, steps: int = 80, history: int = 256,
                      max_model_len: int = 1024, seed: int = 0) -> dict[str, float]:
    """Microseconds per `propose` in steady state (wall-clock median, mean, 90th percentile, min over
    `steps`, and the median CPU time of the calling thread, which a busy shared CPU inflates less):
    `batch` running requests whose histories grow by 1..K+1 random tokens per step (many new
    pairs to count: a costly case), context counts on and no probability threshold, so every
    chain that can runs its full K steps. The first call, which counts every prompt, is excluded."""
    rng = np.random.default_rng(seed)
    steps = min(steps, (max_model_len - history) // (k + 1) - 1)
    drafter = BigramDrafter(table, k, min_probability=0.0, max_batch_size=0, max_model_len=max_model_len)
    tokens = np.zeros((batch, max_model_len), dtype=np.int32)
    tokens[:, :history] = rng.integers(0, table.vocab_size, size=(batch, history))
    lengths = np.full(batch, history, dtype=np.int32)
    sampled = [[0] for _ in range(batch)]
    drafter.propose(sampled, lengths, tokens)
    took = []
    for _ in range(steps):
        grow = rng.integers(1, k + 2, size=batch)
        for step in range(k + 1):  # append what "verification accepted" (random ids, vectorised)
            rows = np.flatnonzero(grow > step)
            tokens[rows, lengths[rows]] = rng.integers(0, table.vocab_size, size=rows.size)
            lengths[rows] += 1
        sampled = [[0] * int(g) for g in grow]  # vLLM's sampled tokens: what each row gained
        wall, cpu = time.perf_counter(), time.thread_time()
        drafter.propose(sampled, lengths, tokens)
        took.append((time.perf_counter() - wall, time.thread_time() - cpu))
    us = np.array(took) * 1e6
    return {"median_us": float(np.median(us[:, 0])), "mean_us": float(us[:, 0].mean()),
            "p90_us": float(np.percentile(us[:, 0], 90)), "min_us": float(us[:, 0].min()),
            "cpu_median_us": float(np.median(us[:, 1])), "batch": batch, "k": k, "steps": len(took)}
