"""The bigram table and the bigram proposer, called directly: fast, no engine, no embedded pair.

Inputs are shaped as vLLM 0.32 passes them to a custom proposer: `sampled_token_ids` a list per
running request, `num_tokens_no_spec` and `token_ids_cpu` the persistent batch's int32 arrays
(max_num_seqs rows, max_model_len columns), of which only the first rows are live.
"""

from __future__ import annotations

import math
import zipfile
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from models.bigram_tables import main
from deploy.config import ConfigError, parse_config
from deploy.preflight import Machine, ModelInfo, ResolvedDeployment, resolve_table_path
from plugins.bigram import BigramDrafter, BigramProposer, ContextCounts, pair_hash
from plugins.bigram_table import (
    BigramTableError, build_arrays, build_table, load_table, save_table, tokenizer_fingerprint,
)

TEXT = "def f(self, x):\n    return self.x + x\n\n" * 40 + "class A(object):\n    pass\n" * 20
MAX_SEQS, MAX_LEN = 16, 256


def train_tokenizer(folder: Path, vocab_size: int, text: str) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([text], trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text('{"model_type": "llama", "vocab_size": %d}' % tok.get_vocab_size())
    return folder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bigram")
    files = []
    for i in range(3):
        files.append(root / f"code{i}.py")
        files[-1].write_text(TEXT)
    return {
        "model": train_tokenizer(root / "model", 300, TEXT),
        "other": train_tokenizer(root / "other", 290, TEXT[::-1]),
        "files": files,  # type: ignore[dict-item]
        "root": root,
    }


@pytest.fixture(scope="module")
def table_path(corpus: dict) -> Path:
    return build_table(corpus["files"], corpus["model"], corpus["root"] / "table.npz", progress=False)


# --- building -------------------------------------------------------------------------------------

def test_laplace_smoothed_top_successors() -> None:
    arrays = build_arrays([[1, 2, 1, 2, 1, 3], [4]], vocab_size=5, fingerprint="fp", top_k=8, alpha=1.0)
    path_free = {k: v for k, v in arrays.items()}
    assert int(path_free["num_tokens"]) == 7
    indptr, succ, probs = arrays["indptr"], arrays["successors"], arrays["probs"].astype(float)
    # token 1 -> 2 (twice), 3 (once): (c + 1) / (3 + 5); token 2 -> 1 (twice): 3 / 7
    assert succ[indptr[1]:indptr[2]].tolist() == [2, 3]
    assert probs[indptr[1]:indptr[2]] == pytest.approx([3 / 8, 2 / 8], abs=1e-3)
    assert succ[indptr[2]:indptr[3]].tolist() == [1]
    assert probs[indptr[2]] == pytest.approx(3 / 7, abs=1e-3)
    assert indptr[4] == indptr[5]  # token 4 had no successor (sequence end)


def test_top_k_keeps_the_most_frequent(tmp_path: Path) -> None:
    seq = [0, 1, 0, 1, 0, 1, 0, 2, 0, 2, 0, 3]
    table = load_table(save_table(build_arrays([seq], vocab_size=6, fingerprint="fp", top_k=2), tmp_path / "t.npz"))
    assert [s for s, _ in table.successors_of(0)] == [1, 2]
    assert table.top_next[0] == 1 and table.top_next[5] == -1
    # unlisted successors get the smoothed zero-count probability; ids past the vocabulary too
    assert table.prob(np.array([0, 0, 9]), np.array([2, 3, 1])) == pytest.approx(
        [(2 + 1) / (6 + 6), 1 / (6 + 6), 1 / 6], abs=1e-3)


def test_build_from_files_with_the_cli(corpus: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "cli.npz"
    assert main(["--tokenizer", str(corpus["model"]), "--out", str(out), *map(str, corpus["files"])]) == 0
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(corpus["model"] / "tokenizer.json"))
    table = load_table(out, tokenizer_fingerprint(corpus["model"]))
    assert table.vocab_size == tok.get_vocab_size() and "wrote" in capsys.readouterr().out
    # Recount the corpus plainly: every token's top successor and its smoothed probability match.
    pairs: Counter[tuple[int, int]] = Counter()
    for f in corpus["files"]:
        ids = tok.encode(f.read_text(), add_special_tokens=False).ids
        pairs.update(zip(ids, ids[1:]))
    totals: Counter[int] = Counter()
    for (a, _), c in pairs.items():
        totals[a] += c
    for a in totals:
        top = max(c for (x, _), c in pairs.items() if x == a)
        assert pairs[a, int(table.top_next[a])] == top
        assert table.top_prob[a] == pytest.approx((top + 1) / (totals[a] + table.vocab_size), rel=2e-3)


def test_compact_for_a_128k_vocabulary(tmp_path: Path) -> None:
    vocab = 128_256
    rng = np.random.default_rng(0)
    # Zipf-distributed ids: most rows end up with far more than top_k distinct successors.
    sequences = [np.minimum(rng.zipf(1.1, size=200_000), vocab) - 1 for _ in range(10)]
    arrays = build_arrays(sequences, vocab, "fp", top_k=8)
    path = save_table(arrays, tmp_path / "big.npz")
    assert len(arrays["successors"]) <= vocab * 8
    assert all(a.size <= (vocab + 1) * 8 for a in arrays.values())  # nothing vocabulary-squared
    assert path.stat().st_size < 4e6, f"{path.stat().st_size / 1e6:.1f} MB"
    load_table(path, "fp")
    # The worst case, every token with top_k successors, stays a few MB: built, not computed. Walking
    # the vocabulary in steps coprime to its size follows every token with token + step once.
    steps = [1, 5, 7, 11, 13, 17, 19, 23]
    assert all(math.gcd(step, vocab) == 1 for step in steps)
    full = build_arrays([np.arange(vocab + 1) * step % vocab for step in steps], vocab, "fp", top_k=8)
    assert len(full["successors"]) == vocab * 8
    assert sum(a.nbytes for a in full.values()) < 8e6, "in memory"
    assert save_table(full, tmp_path / "full.npz").stat().st_size < 8e6, "on disk"


# --- refusing bad tables -----------------------------------------------------------------------------

def test_another_tokenizer_is_refused(corpus: dict, table_path: Path) -> None:
    assert tokenizer_fingerprint(corpus["model"]) != tokenizer_fingerprint(corpus["other"])
    with pytest.raises(BigramTableError, match="built for another tokenizer"):
        load_table(table_path, tokenizer_fingerprint(corpus["other"]))


def test_missing_and_corrupt_files_are_refused(tmp_path: Path, table_path: Path) -> None:
    with pytest.raises(BigramTableError, match="does not exist.*models.bigram_tables"):
        load_table(tmp_path / "nope.npz")
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip file at all")
    with pytest.raises(BigramTableError, match="corrupt"):
        load_table(garbage)
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(table_path.read_bytes()[:200])
    with pytest.raises(BigramTableError, match="corrupt"):
        load_table(truncated)
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, format=np.array("specdeploy-bigram-v1"), indptr=np.zeros(3))
    with pytest.raises(BigramTableError, match="missing arrays"):
        load_table(wrong)
    inconsistent = dict(np.load(table_path))
    inconsistent["successors"] = inconsistent["successors"] + 10_000
    with pytest.raises(BigramTableError, match="inconsistent"):
        load_table(save_table(inconsistent, tmp_path / "inconsistent.npz"))
    assert zipfile.is_zipfile(table_path)


def test_tables_with_wrong_types_huge_rows_or_unknown_arrays_are_refused(tmp_path: Path, table_path: Path) -> None:
    """Every array is checked from its header before any is read: memory stays bounded."""
    good = dict(np.load(table_path))
    cases = {
        "vocab-vector": ({**good, "vocab_size": np.array([5, 6, 7])}, "array 'vocab_size' is int64 of shape (3,)"),
        "probs-strings": ({**good, "probs": good["probs"].astype(str)}, "array 'probs' is <U"),
        "extra": ({**good, "payload": np.zeros(10)}, "unknown arrays ['payload']"),
        "huge-vocab": ({**good, "vocab_size": np.array(1 << 40)}, "vocab_size 1099511627776 outside"),
    }
    v = int(good["vocab_size"])
    one_long_row = np.zeros(v + 1, dtype=np.int64)
    one_long_row[1:] = v - 1  # token 0 lists every other token: a dense (V + 1) x V expansion
    cases["huge-row"] = ({**good, "indptr": one_long_row, "successors": np.arange(1, v, dtype=np.int64),
                          "probs": np.full(v - 1, 1.0 / v, dtype=np.float32)}, f"lists {v - 1} successors, more than")
    for name, (arrays, expected) in cases.items():
        with pytest.raises(BigramTableError, match="corrupt") as info:
            load_table(save_table(arrays, tmp_path / f"{name}.npz"))
        assert expected in str(info.value), (name, str(info.value))


def resolved_for(model: Path, table: str | None, target_ref: str | None = None) -> ResolvedDeployment:
    config = parse_config({"name": "t", "target": {"model": target_ref or str(model)},
                           "speculation": {"drafter": "bigram", "bigram": {"table": table}}})
    info = ModelInfo(str(model), str(model), True, None, None, None, None)
    return ResolvedDeployment(config, Machine(0, 0, 24), "cpu", info, None)


def test_preflight_refuses_bad_tables_before_any_engine(corpus: dict, table_path: Path, tmp_path: Path) -> None:
    assert resolve_table_path(resolved_for(corpus["model"], str(table_path))) == table_path
    cases = {
        str(tmp_path / "missing.npz"): "does not exist",
        str(corpus["files"][0]): "corrupt",
        str(build_table(corpus["files"], corpus["other"], tmp_path / "other.npz", progress=False)):
            "built for another tokenizer",
    }
    for table, message in cases.items():
        with pytest.raises(ConfigError, match=message) as info:
            resolve_table_path(resolved_for(corpus["model"], table))
        assert info.value.problems[0].startswith("speculation.bigram.table: ")
    with pytest.raises(ConfigError, match="only the embedded pair has a built-in table"):
        resolve_table_path(resolved_for(corpus["model"], None))


# --- the proposer ------------------------------------------------------------------------------------

def vllm_config(options: dict, k: int, tokenizer: Path, max_model_len: int = MAX_LEN) -> SimpleNamespace:
    return SimpleNamespace(
        additional_config={"specdeploy": {"drafter": "bigram", **options}},
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(tokenizer=str(tokenizer), tokenizer_revision=None, max_model_len=max_model_len),
    )


def batch(histories: list[list[int]], sampled: list[list[int]] | None = None
          ) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
    """The three arguments vLLM passes to `propose` for these running requests."""
    tokens = np.zeros((MAX_SEQS, MAX_LEN), dtype=np.int32)
    lengths = np.zeros(MAX_SEQS, dtype=np.int32)
    for i, h in enumerate(histories):
        tokens[i, :len(h)] = h
        lengths[i] = len(h)
    return (sampled if sampled is not None else [[h[-1]] for h in histories]), lengths, tokens


@pytest.fixture(scope="module")
def chain_table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A table where 10 -> 11 -> 12 -> 13 -> 14 are strong, 14 -> 15 weak, and 20 -> 21 -> 20 loops."""
    seqs = [[10, 11, 12, 13, 14]] * 50 + [[14, 15], [14, 16], [14, 17], [14, 18]] + [[20, 21, 20, 21, 20]] * 50
    arrays = build_arrays(seqs, vocab_size=40, fingerprint="fp", alpha=0.1)
    return save_table(arrays, tmp_path_factory.mktemp("chain") / "chain.npz")


def drafter(table: Path, k: int, **options) -> BigramDrafter:
    return BigramDrafter(load_table(table), k, **{"max_model_len": MAX_LEN, **options})


def test_chain_follows_the_table_and_stops_below_the_threshold(chain_table: Path) -> None:
    d = drafter(chain_table, 8, context_weight=0, min_probability=0.5)
    # 14 -> 15 has (1 + 0.1) / (4 + 0.1 * 40) = 0.14: below 0.5, the chain stops before it
    assert d.propose(*batch([[1, 10]])) == [[11, 12, 13, 14]]
    d = drafter(chain_table, 8, context_weight=0, min_probability=0.1)
    assert d.propose(*batch([[1, 10]])) == [[11, 12, 13, 14, 15]]  # ties go to the lower id; 15 ends it
    assert drafter(chain_table, 8, context_weight=0, min_probability=0).propose(*batch([[30]])) == [[]]  # unseen


def test_never_more_than_k(chain_table: Path) -> None:
    for k in (1, 3, 8):
        [draft] = drafter(chain_table, k, context_weight=0, min_probability=0).propose(*batch([[20]]))
        assert draft == [21, 20] * (k // 2) + [21] * (k % 2)
    d = drafter(chain_table, 8, context_weight=0, min_probability=0)  # nor past the context window
    assert d.propose(*batch([[20] * (MAX_LEN - 2)])) == [[21, 20]]
    assert d.propose(*batch([[20] * MAX_LEN])) == [[]]


def test_batch_cut_off_and_rows_without_a_sampled_token(chain_table: Path) -> None:
    d = drafter(chain_table, 4, context_weight=0, min_probability=0.5, max_batch_size=3)
    assert d.propose(*batch([[10]] * 3)) == [[11, 12, 13, 14]] * 3
    four = d.propose(*batch([[10]] * 4))
    assert four == [[]] * 4 and len({id(x) for x in four}) == 4  # fresh lists: vLLM edits them
    assert d.propose(*batch([[10], [10]], sampled=[[10], []])) == [[11, 12, 13, 14], []]


def test_context_counts_win_where_they_exist(chain_table: Path) -> None:
    history = [10, 33, 1, 10, 33, 2, 10]  # in this request 10 is followed by 33, never by the table's 11
    d = drafter(chain_table, 4, context_weight=4.0, min_probability=0.15)
    [draft] = d.propose(*batch([history]))
    assert draft[0] == 33
    # 33 -> 1 and 33 -> 2 once each: (4 + floor) / (8 + 1) = 0.44 each, ties to the latest (2)
    assert draft[1] == 2
    # weight 0: the table alone
    assert drafter(chain_table, 4, context_weight=0).propose(*batch([history])) == [[11, 12, 13, 14]]


def reference(table, history: list[int], w: float, k: int, min_p: float) -> list[int]:
    """The drafting rule written plainly (exact dictionaries, no hashing, no vectorising)."""
    count: dict[tuple[int, int], int] = {}
    total: dict[int, int] = {}
    best: dict[int, tuple[float, int]] = {}
    for a, b in zip(history, history[1:]):
        count[a, b] = count.get((a, b), 0) + 1
        total[a] = total.get(a, 0) + 1
        score = w * count[a, b] + float(table.prob(np.array([a]), np.array([b]))[0])
        if a not in best or score >= best[a][0]:
            best[a] = (score, b)
    out, a = [], history[-1]
    for _ in range(k):
        nxt, p = int(table.top_next[min(a, table.vocab_size)]), float(table.top_prob[min(a, table.vocab_size)])
        if nxt < 0:
            p = -1
        if a in total:
            score, b = best[a]
            if score >= p:
                nxt, p = b, score
            p /= w * total[a] + 1
        if p < min_p:
            break
        out.append(nxt)
        a = nxt
    return out


@pytest.mark.parametrize("dense", [True, False], ids=["dense", "hashed"])
def test_incremental_state_survives_joins_finishes_and_row_moves(chain_table: Path, dense: bool,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests join, grow, finish and move between rows (vLLM condenses its batch); the drafter's
    incremental counts must always give what a plain recount of each history gives, with token
    records per id (small vocabularies) or hashed (large ones)."""
    if not dense:
        monkeypatch.setattr(ContextCounts, "DENSE_VOCAB", 0)
    rng = np.random.default_rng(7)
    table = load_table(chain_table)
    vocab = [10, 11, 12, 13, 14, 20, 21, 33, 34, 35]
    d = BigramDrafter(table, 4, context_weight=2.0, min_probability=0.1, max_batch_size=0, max_model_len=4096)
    assert d.context.dense == dense
    # Precondition: no two of these 100 pairs share a hash bucket, so counts are exact (a collision
    # would only forget a count, costing acceptance, never correctness).
    a, b = np.repeat(vocab, len(vocab)).astype(np.int64), np.tile(vocab, len(vocab)).astype(np.int64)
    assert len(set(pair_hash(a, b, d.context.pair_bits)[0].tolist())) == len(vocab) ** 2
    histories = [list(rng.choice(vocab, size=rng.integers(2, 30))) for _ in range(6)]
    gained = [h[-1:] for h in histories]  # vLLM's sampled tokens: what each row gained this step
    for step in range(60):
        _, lengths, tokens = batch(histories)
        drafts = d.propose(gained, lengths, tokens)
        for h, got in zip(histories, drafts):
            assert got == reference(table, h, 2.0, 4, 0.1), f"step {step}"
        gained = [got[: rng.integers(0, len(got) + 1)] + [int(rng.choice(vocab))] for got in drafts]
        for h, new in zip(histories, gained):  # verification accepts a prefix and adds one token
            h += new
        event = rng.integers(0, 5)
        if event == 0 and len(histories) > 2:  # a request finishes; the last row moves into its place
            gone = int(rng.integers(0, len(histories)))
            histories[gone], gained[gone] = histories[-1], gained[-1]
            histories.pop()
            gained.pop()
        elif event == 1 and len(histories) < MAX_SEQS:  # a new request joins at the end
            histories.append(list(rng.choice(vocab, size=rng.integers(2, 30))))
            gained.append(histories[-1][-1:])
        elif event == 2:  # two rows swap
            i, j = rng.choice(len(histories), size=2, replace=False)
            histories[i], histories[j] = histories[j], histories[i]
            gained[i], gained[j] = gained[j], gained[i]
        for i, h in enumerate(histories):  # keep them in the window (a new request in the row)
            if len(h) >= MAX_LEN - 10:
                histories[i], gained[i] = h[:5], h[4:5]


def test_a_new_request_in_a_row_never_inherits_the_old_ones_counts(chain_table: Path) -> None:
    """The row's next request has the same first token, the same token where the old one ended and
    exactly the old length plus this step's tokens: only the tokens in between differ. Counting on
    from the old slot would draft 33 -> 34 from a history that never had it."""
    table = load_table(chain_table)
    d = drafter(chain_table, 4, context_weight=4.0, min_probability=0.1, max_batch_size=0)
    old = [5, 33, 34, 35, 33, 34, 35, 7]
    d.propose(*batch([old]))
    new = [5, 20, 21, 20, 21, 20, 21, 7, 33]
    [draft] = d.propose(*batch([new], sampled=[[33]]))
    assert draft == reference(table, new, 4.0, 4, 0.1) and (draft[:1] != [34])
    # The same request going on keeps its counts (no recount needed to be right either way).
    going_on = old + [33]
    d.propose(*batch([old]))
    assert d.propose(*batch([going_on], sampled=[[33]])) == [reference(table, going_on, 4.0, 4, 0.1)]


def test_drafts_never_reach_past_the_models_vocabulary(chain_table: Path) -> None:
    """A table built on a tokenizer larger than the model's embedding (here: 40 ids vs 21)."""
    table = load_table(chain_table)
    d = BigramDrafter(table, 4, context_weight=0, min_probability=0, max_model_len=MAX_LEN, model_vocab_size=21)
    [draft] = d.propose(*batch([[1, 10]]))
    assert draft == [11, 12, 13, 14] and max(draft) < 21
    [draft] = d.propose(*batch([[20]]))
    assert all(t < 21 for t in draft)
    assert BigramDrafter(table, 4, context_weight=0, min_probability=0, max_model_len=MAX_LEN,
                         model_vocab_size=14).propose(*batch([[1, 10]])) == [[11, 12, 13]]


def test_pair_tags_tell_apart_pairs_that_share_a_bucket() -> None:
    """A tag must depend on both ids: pairs (a, b) and (a', b) landing in one bucket are different
    pairs (a tag taken from the product's low bits would depend on b alone and merge them)."""
    bits = 8
    a = np.arange(1, 5001, dtype=np.int64)
    b = np.full_like(a, 77)
    bucket, tag = pair_hash(a, b, bits)
    assert (tag != 0).all() and (tag & 0xFFFFFFFF == 0).all()  # non-zero, in the high 32 bits
    for chosen in np.unique(bucket)[:20]:
        same_bucket = tag[bucket == chosen]
        assert len(np.unique(same_bucket)) == len(same_bucket), f"bucket {chosen}: pairs share a tag"


def test_context_drafts_never_reach_past_the_models_vocabulary(chain_table: Path) -> None:
    """With context counts on, the table's successors still stop at the model's vocabulary (21 ids
    here): the chain 10 -> 11 -> ... -> 20 -> 21 stops before 21, which the model cannot emit."""
    table = load_table(chain_table)
    # A small weight lets the table's successor of a counted token (20 -> 21) outscore the context's.
    for weight in (4.0, 0.01):
        d = BigramDrafter(table, 8, context_weight=weight, min_probability=0, max_model_len=MAX_LEN,
                          model_vocab_size=21)
        for history in ([1, 10], [19, 20], [20, 5, 20], [5, 6, 5, 6, 20]):
            [draft] = d.propose(*batch([history]))
            assert all(t < 21 for t in draft), (weight, history, draft)


def test_proposer_reads_its_options_and_refuses_another_tokenizer(corpus: dict, table_path: Path) -> None:
    options = {"table": str(table_path), "context_weight": 0, "min_probability": 0.0, "max_batch_size": 2}
    proposer = BigramProposer(vllm_config(options, 3, corpus["model"]))
    proposer.load_model(None)
    assert proposer.drafter.k == 3 and proposer.drafter.max_batch_size == 2
    assert proposer.drafter.context_weight == 0 and proposer.drafter.min_probability == 0
    from tokenizers import Tokenizer

    history = Tokenizer.from_file(str(corpus["model"] / "tokenizer.json")).encode("    return self.x").ids
    chain = [history[-1]]
    for _ in range(3):  # no threshold, no context counts: the table's most likely successors
        chain.append(int(load_table(table_path).top_next[chain[-1]]))
    assert min(chain) >= 0, "every token of the chain has a successor in the corpus"
    assert proposer.propose(*batch([history]), slot_mappings=None) == [chain[1:]]
    # Past max_batch_size running requests it proposes nothing.
    assert proposer.propose(*batch([history] * 3), slot_mappings=None) == [[], [], []]
    with pytest.raises(BigramTableError, match="refuses to start.*built for another tokenizer"):
        BigramProposer(vllm_config(options, 3, corpus["other"]))
    with pytest.raises(ValueError, match="start the server through specdeploy"):
        BigramProposer(SimpleNamespace(additional_config={}, speculative_config=None, model_config=None))


def test_context_state_stays_bounded_over_thousands_of_requests(chain_table: Path) -> None:
    """What `make soak` checks on the engine, at the unit level: 2,000 short requests pass through
    8 rows (each lives a few steps, then another takes its row); the context counts' arrays are
    sized by the rows, never by the requests served."""
    rng = np.random.default_rng(11)
    vocab = [10, 11, 12, 13, 14, 20, 21, 33, 34, 35]
    d = drafter(chain_table, 4, context_weight=4.0, min_probability=0.1, max_batch_size=0)

    def new_request() -> tuple[list[int], int]:
        return list(rng.choice(vocab, size=rng.integers(2, 40))), int(rng.integers(1, 6))

    rows = [new_request() for _ in range(8)]
    served, sizes = 8, None
    while served < 2000:
        histories = [h for h, _ in rows]
        drafts = d.propose(*batch(histories))
        c = d.context
        now = (c.slots, c.slot_state.nbytes, c.pairs.nbytes, c.tokens.nbytes)
        sizes = sizes or now
        assert now == sizes, f"after {served} requests"
        for i, ((h, left), got) in enumerate(zip(rows, drafts)):
            if left <= 1:
                rows[i] = new_request()
                served += 1
            else:
                rows[i] = (h + got[:1] + [int(rng.choice(vocab))], left - 1)
    assert sizes[0] <= 2 * 8
