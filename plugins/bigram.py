"""The bigram drafter: a deterministic chain of likely next tokens, vectorised over the batch.

Each step, for every running request, it starts from the last token `a` and repeats up to K
times: pick the most likely successor `b` of `a`, stop before it if its probability is below
`min_probability`, else append it and continue from `b`. Probabilities combine the corpus table
(`plugins.bigram_table`) with counts from the request's own tokens (prompt + output so far):

    P(b | a) = (w * c(a, b) + P_table(b | a)) / (w * N(a) + 1)

where c(a, b) counts `a b` in the request's context, N(a) the times `a` was followed by anything
there, and w = `context_weight`: with no context counts this is the table; one occurrence
with w = 4 already weighs 0.8. The chain is an argmax, never a sample, so vLLM's verification
(draft probabilities taken as one-hot) keeps the target's output distribution exactly.

vLLM passes no request ids to `propose`, so context counts live in per-row slots that are
validated by content: a slot remembers how much of its row's history it has counted and a few
of those tokens; when the row holds something else (a request finished and another moved into
its row, a new or resumed request) the slot is rebuilt from the row's history, otherwise only
the new tokens are counted. Counts are kept in small per-slot hash tables (direct-mapped: a
collision forgets a count, which can cost acceptance but never correctness). Everything is a
pure function of the calls' inputs, so every tensor-parallel rank proposes the same tokens.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from plugins import num_speculative_tokens, plugin_options, vllm_fixes
from plugins.bigram_table import BigramTable, BigramTableError, load_table, tokenizer_fingerprint

# Inside vLLM's worker processes: a child of vLLM's logger, so these lines reach the server log.
log = logging.getLogger("vllm.specdeploy.bigram")

_HASH_MULT = np.int64(-7046029254386353131)  # 0x9E3779B97F4A7C15 (Fibonacci hashing), wrapping int64
_LOW32 = np.int64(0xFFFFFFFF)
_HIGH32 = ~_LOW32
_TAG_BIT = np.int64(1 << 32)  # makes every pair tag non-zero (0 marks an empty bucket)


def pair_hash(a: np.ndarray, b: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Bucket in [0, 2**bits) of each (a, b) pair, and its tag (non-zero, in the high 32 bits)."""
    h = ((a << np.int64(32)) | b) * _HASH_MULT
    return (h >> np.int64(64 - bits)) & ((1 << bits) - 1), (h << np.int64(32)) | _TAG_BIT


class ContextCounts:
    """Bigram counts of each batch row's own history, updated incrementally (see module doc).

    Per row slot, two direct-mapped hash tables (flat 1-D arrays: numpy's fastest gathers):
    - pairs: one int64 per bucket, a 32-bit tag of (a, b) above its count c(a, b);
    - tokens (bucket: a mod size): `a`, N(a), the best context successor b* with its score
      w * c(a, b*) + P_table(b* | a), and the chain's choice after `a` (b*, or the table's top
      successor when that scores higher) with its combined probability. The choice is refreshed
      whenever `a` gets a count, so a chain step is a single look-up.
    A slot keeps counting its row only while the row is provably the same request: its length
    grew by exactly the tokens sampled this step, and its first token, its last counted token and
    `PROBES` tokens spread over the counted history are unchanged. A new request moved into the
    row (even one sharing a long prompt prefix) fails one of these and the slot is rebuilt.

    With a small vocabulary (up to `DENSE_VOCAB` ids) every token id has its own bucket, filled
    with the table's choice until the context counts it: no key checks, and a chain step is two
    gathers. Larger vocabularies hash by id (a collision forgets a count: acceptance, never
    correctness) and fall back to the table where the context has no record.
    """

    DENSE_VOCAB = 4096
    PROBES = 4

    def __init__(self, table: BigramTable, context_weight: float, max_model_len: int,
                 table_next: np.ndarray, table_prob: np.ndarray):
        self.table = table
        self.weight = np.float32(context_weight)
        self.token_limit = len(table_next) - 1
        """Ids from here on are never proposed (the drafter's table rows end there)."""
        self.dense = len(table_next) <= self.DENSE_VOCAB
        # Four pair buckets per history token (fewer collisions); one token bucket per id (dense)
        # or per history token: about 56 KB per row for 1024-token contexts.
        self.pair_bits = int(np.clip(np.ceil(np.log2(4 * max(max_model_len, 1))), 8, 14))
        if self.dense:
            self.token_bits = max(int(np.ceil(np.log2(len(table_next)))), 1)
            size = 1 << self.token_bits
            self._fresh_tokens = {"t_key": np.arange(size), "t_next": np.full(size, -1, np.int64),
                                  "t_prob": np.full(size, -1, np.float32)}
            self._fresh_tokens["t_next"][: len(table_next)] = table_next
            self._fresh_tokens["t_prob"][: len(table_prob)] = table_prob
        else:
            self.token_bits = int(np.clip(np.ceil(np.log2(max(max_model_len, 1))), 8, 12))
        self._probe_steps = np.arange(self.PROBES)
        self.slots = 0
        self.arrays: dict[str, np.ndarray] = {}
        self.ensure(8)

    # name: (bucket kind, dtype, empty value)
    _LAYOUT: dict[str, tuple[str, Any, float]] = {
        "seen": ("slot", np.int64, 0),  # history tokens counted so far (0: nothing, rebuild)
        "first": ("slot", np.int64, -1),  # the row's first token
        "last": ("slot", np.int64, -1),  # the last token counted
        "probe_pos": ("probe", np.int64, 0),  # positions spread over the counted history
        "probe_tok": ("probe", np.int64, -1),  # and the tokens there
        "pairs": ("pair", np.int64, 0),
        "t_key": ("token", np.int64, -1),
        "t_total": ("token", np.float32, 0),
        "t_best": ("token", np.int64, -1),
        "t_score": ("token", np.float32, -np.inf),
        "t_next": ("token", np.int64, -1),
        "t_prob": ("token", np.float32, -1),
    }

    def _width(self, kind: str) -> int:
        return {"slot": 1, "probe": self.PROBES, "pair": 1 << self.pair_bits, "token": 1 << self.token_bits}[kind]

    def ensure(self, slots: int) -> None:
        """Room for `slots` rows (grown, never shrunk: vLLM reuses its batch rows)."""
        if slots <= self.slots:
            return
        slots = max(slots, 2 * self.slots)
        for name, (kind, dtype, empty) in self._LAYOUT.items():
            grown = np.full(slots * self._width(kind), empty, dtype=dtype)
            old = self.arrays.get(name)
            if old is not None:
                grown[: len(old)] = old
            self.arrays[name] = grown
            setattr(self, name, grown)
        self._reset(np.arange(self.slots, slots))
        self.slots = slots

    def _reset(self, rows: np.ndarray) -> None:
        for name, (kind, _, empty) in self._LAYOUT.items():
            width = self._width(kind)
            target = self.arrays[name].reshape(-1, width)
            if self.dense and name in self._fresh_tokens:
                target[rows] = self._fresh_tokens[name]
            else:
                target[rows] = empty

    def sync(self, rows: np.ndarray, lengths: np.ndarray, flat: np.ndarray, width: int, last: np.ndarray,
             grown: np.ndarray) -> None:
        """Bring the slots of `rows` up to date with their histories `flat[row * width:][:length]`
        (`flat`: vLLM's token array, flattened; `last`: each row's last token; `grown`: the
        tokens each row gained this step, vLLM's sampled tokens)."""
        offset = rows * width
        seen = self.seen[rows]
        # Probe positions are below `seen`, so they stay inside the row even where the row changed.
        same = ((seen > 0) & (seen + grown == lengths) & (flat[offset] == self.first[rows])
                & (flat[offset + seen - 1] == self.last[rows])
                & (flat[offset[:, None] + self.probe_pos.reshape(-1, self.PROBES)[rows]]
                   == self.probe_tok.reshape(-1, self.PROBES)[rows]).all(axis=1))
        if not same.all():
            self._reset(rows[~same])
            seen = np.where(same, seen, 0)
        start = np.maximum(seen, 1)
        new = lengths - start
        total = int(new.sum())
        if total > 0:
            ends = np.cumsum(new)
            pos = np.repeat(offset + start - ends + new, new) + np.arange(total)
            self._count(np.repeat(rows, new), flat[pos - 1].astype(np.int64), flat[pos].astype(np.int64))
        self.seen[rows] = lengths
        self.first[rows] = flat[offset]
        self.last[rows] = last
        spread = lengths[:, None] * self._probe_steps // self.PROBES  # 0 and evenly up to the last token
        self.probe_pos.reshape(-1, self.PROBES)[rows] = spread
        self.probe_tok.reshape(-1, self.PROBES)[rows] = flat[offset[:, None] + spread]

    def _count(self, slots: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        # pairs: take new pairs' buckets over (count 0), then count
        bucket, tag = pair_hash(a, b, self.pair_bits)
        idx = (slots << self.pair_bits) | bucket
        own = (self.pairs[idx] & _HIGH32) == tag
        if not own.all():
            lost = ~own
            self.pairs[idx[lost]] = tag[lost]
            own[lost] = self.pairs[idx[lost]] == tag[lost]  # False: lost a collision within this update
        np.add.at(self.pairs, idx[own], np.int64(1))  # numpy scalars: ufunc.at is slow with Python ints
        # tokens: take new tokens' buckets over, count N(a)
        tidx = (slots << self.token_bits) | (a & ((1 << self.token_bits) - 1))
        town = np.ones(len(a), dtype=bool) if self.dense else self.t_key[tidx] == a
        if not town.all():
            lost = ~town
            fresh = tidx[lost]
            self.t_key[fresh] = a[lost]
            self.t_total[fresh], self.t_best[fresh], self.t_score[fresh] = 0, -1, -np.inf
            town[lost] = self.t_key[fresh] == a[lost]
        np.add.at(self.t_total, tidx[town], np.float32(1))
        # best successor: scores only grow, so the running argmax is the max of the old best and the updates
        both = own & town
        t_both, a_both, b_both = (tidx, a, b) if both.all() else (tidx[both], a[both], b[both])
        count = (self.pairs[idx if both.all() else idx[both]] & _LOW32).astype(np.float32)
        score = self.weight * count + self.table.prob(a_both, b_both).astype(np.float32)
        np.maximum.at(self.t_score, t_both, score)
        won = score >= self.t_score[t_both]
        self.t_best[t_both[won]] = b_both[won]
        # the chain's choice for every token that got a count
        t_own, a_own = (tidx, a) if town.all() else (tidx[town], a[town])
        best, best_score = self.t_best[t_own], self.t_score[t_own]
        row = np.minimum(a_own, self.table.vocab_size)
        top_prob = self.table.top_prob[row]
        use = (best >= 0) & (best_score >= top_prob)
        nxt = np.where(use, best, self.table.top_next[row])
        prob = np.where(use, best_score, top_prob) / (self.weight * self.t_total[t_own] + 1)
        self.t_next[t_own] = nxt
        self.t_prob[t_own] = np.where((nxt >= 0) & (nxt < self.token_limit), prob, -1)


class BigramDrafter:
    """The drafting logic, independent of vLLM's config objects (tests and benchmarks build it directly)."""

    def __init__(self, table: BigramTable, k: int, context_weight: float = 4.0, min_probability: float = 0.15,
                 max_batch_size: int = 64, max_model_len: int = 1 << 20, model_vocab_size: int | None = None):
        if k < 1:
            raise ValueError("k must be >= 1")
        self.table = table
        self.k = k
        self.context_weight = float(context_weight)
        self.min_probability = float(min_probability)
        self.max_batch_size = int(max_batch_size)
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
        self.context = (ContextCounts(table, context_weight, max_model_len, self._next, self._prob)
                        if context_weight > 0 else None)

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray) -> list[list[int]]:
        batch = len(sampled_token_ids)
        if batch == 0:
            return []
        if self.max_batch_size and batch > self.max_batch_size:
            return [[] for _ in range(batch)]  # empty drafts keep vLLM's speculative path running
        lengths = np.asarray(num_tokens_no_spec[:batch], dtype=np.int64)
        # Rows without a sampled token this step (partial prefill, discarded) get no draft.
        grown = np.fromiter(map(len, sampled_token_ids), dtype=np.int64, count=batch)
        active = (grown > 0) & (lengths > 0) & (lengths < self.max_model_len)
        rows = np.flatnonzero(active)
        if rows.size == 0:
            return [[] for _ in range(batch)]
        lengths = lengths[rows]
        width = token_ids_cpu.shape[1]
        flat = token_ids_cpu.reshape(-1)  # a view: vLLM's array is contiguous
        current = np.minimum(flat[rows * width + lengths - 1], self._unknown).astype(np.int64)
        context = self.context
        if context is not None:
            context.ensure(batch)
            context.sync(rows, lengths, flat, width, current, grown[rows])
            base, mask = rows << context.token_bits, (1 << context.token_bits) - 1
            t_key, t_next, t_prob = context.t_key, context.t_next, context.t_prob
        drafts = np.zeros((rows.size, self.k), dtype=np.int64)
        count = np.zeros(rows.size, dtype=np.int64)
        alive = np.ones(rows.size, dtype=bool)
        for step in range(self.k):
            if context is not None and context.dense:  # every id has a record: the context's or the table's
                bucket = base | current  # a stopped chain's -1 reads the last bucket: harmless, not counted
                nxt, prob = t_next[bucket], t_prob[bucket]
            elif context is not None:  # the context's choice wherever it saw `current` followed by something
                bucket = base | (current & mask)
                hit = t_key[bucket] == current
                nxt = np.where(hit, t_next[bucket], self._next[current])
                prob = np.where(hit, t_prob[bucket], self._prob[current])
            else:
                nxt, prob = self._next[current], self._prob[current]
            alive &= prob >= self.min_probability  # also stops at -1: no successor known
            if not alive.any():
                break
            drafts[:, step] = nxt
            count += alive
            current = nxt  # stopped rows go on from -1 (the last table row): harmless, not counted
        # Never draft past the context window.
        count = np.minimum(count, self.max_model_len - lengths)
        if rows.size < batch:
            drafts, count = self._scatter(batch, rows, drafts, count)
        # One fresh list per request: vLLM's scheduler edits them in place.
        return [d[:n] for d, n in zip(drafts.tolist(), count.tolist())]

    def _scatter(self, batch: int, rows: np.ndarray, drafts: np.ndarray, count: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
        all_drafts = np.zeros((batch, self.k), dtype=np.int64)
        all_counts = np.zeros(batch, dtype=np.int64)
        all_drafts[rows], all_counts[rows] = drafts, count
        return all_drafts, all_counts


class BigramProposer:
    """vLLM custom_class proposer (`speculative_config.method: custom_class`), see the module doc.

    Options (from `additional_config["specdeploy"]`, declared in deploy.config.BigramOptions):
    `table`, `context_weight`, `min_probability`, `max_batch_size`. K is
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
        self.drafter = BigramDrafter(
            table, num_speculative_tokens(vllm_config), options.get("context_weight", 4.0),
            options.get("min_probability", 0.15), options.get("max_batch_size", 64), model_config.max_model_len,
            model_vocab_size=get_vocab() if get_vocab else None)
        log.info("specdeploy bigram drafter: table %s (vocabulary %d), K=%d, context_weight=%g, "
                 "min_probability=%g, max_batch_size=%d", table.path, table.vocab_size, self.drafter.k,
                 self.drafter.context_weight, self.drafter.min_probability, self.drafter.max_batch_size)

    def load_model(self, target_model: Any) -> None:
        """Nothing to load (the CPU runner calls it for every drafter)."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Any = None) -> list[list[int]]:
        return self.drafter.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)


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
