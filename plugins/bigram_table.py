"""Bigram tables: the most likely successors of every token, for the bigram drafter.

    python -m models.bigram_tables --tokenizer MODEL_DIR --out table.npz [FILES...]

counts every pair of adjacent tokens in the text files (tokenized with the target's tokenizer;
default corpus: the embedded pair's training files) and keeps, per token, its `top_k` most
frequent successors with Laplace-smoothed probabilities (c + alpha) / (N + alpha * V). The
file is a compressed .npz of CSR arrays (no V x V matrix): at most V * top_k entries, a few MB
for a 128k vocabulary. It records a fingerprint of the tokenizer (a hash of its vocabulary,
merges and added tokens), and `load_table` refuses it for any other tokenizer.

This module is what the proposer in vLLM's workers imports, so it imports nothing of `deploy`.
The deployment side lives there: `deploy.preflight.resolve_table_path` builds the embedded
pair's table on first use (`models.bigram_tables`) and refuses a missing, corrupt or mismatched
table before any engine starts. The proposer checks the same again when the server starts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("specdeploy")

FORMAT = "specdeploy-bigram-v1"
DEFAULT_TOP_K = 8
DEFAULT_ALPHA = 1.0
BUILD_HINT = "python -m models.bigram_tables --tokenizer {tokenizer} --out {out} FILES..."
_MERGE_EVERY = 16_000_000  # pair keys collected before they are reduced to unique counts (memory bound)


class BigramTableError(ValueError):
    """A table that cannot be used: missing, corrupt, or built for another tokenizer."""


# --- tokenizers --------------------------------------------------------------------------------

def _tokenizer_json(tokenizer: str | Path, revision: str | None = None) -> Path | None:
    """tokenizer.json of a folder, or of a hub id in the local cache (never downloads)."""
    folder = Path(str(tokenizer)).expanduser()
    if folder.is_dir():
        path = folder / "tokenizer.json"
        return path if path.is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(str(tokenizer), "tokenizer.json", revision=revision)
    except Exception:  # not a valid hub id, no cache: fall back to transformers
        return None
    return Path(found) if isinstance(found, str) else None


def _auto_tokenizer(tokenizer: str | Path, revision: str | None, local_only: bool) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer), revision=revision, local_files_only=local_only)


def tokenizer_fingerprint(tokenizer: str | Path, revision: str | None = None, local_only: bool = True) -> str:
    """SHA-256 of a tokenizer's vocabulary, merges and added tokens (its identity, not its file bytes).

    Reads tokenizer.json where there is one; otherwise hashes transformers' `get_vocab()`.
    Raises `BigramTableError` when the tokenizer cannot be found.
    """
    path = _tokenizer_json(tokenizer, revision)
    if path is not None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BigramTableError(f"cannot read tokenizer {path}: {exc}") from None
        model = data.get("model") or {}
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
        payload: dict[str, Any] = {
            "type": model.get("type"), "vocab": model.get("vocab"), "merges": merges,
            "added": sorted((t.get("id"), t.get("content")) for t in data.get("added_tokens") or []),
        }
    else:
        try:
            tok = _auto_tokenizer(tokenizer, revision, local_only)
        except Exception as exc:
            raise BigramTableError(f"cannot load tokenizer {tokenizer}: {exc}") from None
        payload = {"vocab": sorted(tok.get_vocab().items())}
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


def _encoder(tokenizer: str | Path) -> tuple[Callable[[list[str]], list[list[int]]], int]:
    """A batch encoder (no special tokens) and the vocabulary size (highest id + 1)."""
    path = _tokenizer_json(tokenizer)
    if path is not None:
        from tokenizers import Tokenizer

        fast = Tokenizer.from_file(str(path))
        size = max(fast.get_vocab(with_added_tokens=True).values()) + 1
        return (lambda texts: [e.ids for e in fast.encode_batch(texts, add_special_tokens=False)]), size
    tok = _auto_tokenizer(tokenizer, None, local_only=False)
    size = max(tok.get_vocab().values()) + 1
    return (lambda texts: tok(texts, add_special_tokens=False)["input_ids"]), size


# --- building -------------------------------------------------------------------------------------

def _reduce(keys: list[np.ndarray], counts: np.ndarray | None, uniq: np.ndarray | None
            ) -> tuple[np.ndarray, np.ndarray]:
    new = np.concatenate(keys)
    weights = np.ones(len(new), dtype=np.float64)
    if uniq is not None and counts is not None:
        new, weights = np.concatenate([uniq, new]), np.concatenate([counts, weights])
    uniq, inverse = np.unique(new, return_inverse=True)
    return uniq, np.bincount(inverse, weights=weights)


def build_arrays(sequences: Iterable[Sequence[int] | np.ndarray], vocab_size: int, fingerprint: str,
                 top_k: int = DEFAULT_TOP_K, alpha: float = DEFAULT_ALPHA, tokenizer: str = "",
                 ) -> dict[str, np.ndarray]:
    """Count adjacent pairs over token-id sequences and keep each token's `top_k` successors.

    Returns the arrays `save_table` writes: CSR `indptr`/`successors`/`probs` (successors by
    descending count, ties by id) and per-token `totals` (pair count of the token as predecessor).
    """
    if vocab_size < 2 or not 1 <= top_k <= MAX_TOP_K or alpha <= 0:
        raise ValueError(f"need vocab_size >= 2, 1 <= top_k <= {MAX_TOP_K} and alpha > 0")
    v = np.int64(vocab_size)
    pending: list[np.ndarray] = []
    pending_size, tokens = 0, 0
    uniq: np.ndarray | None = None
    counts: np.ndarray | None = None
    for seq in sequences:
        ids = np.asarray(seq, dtype=np.int64)
        tokens += len(ids)
        if len(ids) < 2:
            continue
        if ids.min() < 0 or ids.max() >= vocab_size:
            raise ValueError(f"token id out of range [0, {vocab_size})")
        pending.append(ids[:-1] * v + ids[1:])
        pending_size += len(ids) - 1
        if pending_size >= _MERGE_EVERY:
            uniq, counts = _reduce(pending, counts, uniq)
            pending, pending_size = [], 0
    if pending:
        uniq, counts = _reduce(pending, counts, uniq)
    if uniq is None or counts is None:
        uniq, counts = np.zeros(0, np.int64), np.zeros(0, np.float64)
    rows, succ = uniq // v, uniq % v
    totals = np.bincount(rows, weights=counts, minlength=vocab_size)
    order = np.lexsort((succ, -counts, rows))  # by row, then most frequent first, ties by id
    rows, succ, counts = rows[order], succ[order], counts[order]
    starts = np.searchsorted(rows, rows, side="left")
    keep = (np.arange(len(rows)) - starts) < top_k
    rows, succ, counts = rows[keep], succ[keep], counts[keep]
    probs = (counts + alpha) / (totals[rows] + alpha * vocab_size)
    indptr = np.zeros(vocab_size + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=vocab_size), out=indptr[1:])
    index_dtype = np.int32 if len(succ) < 2**31 else np.int64
    return {
        "format": np.array(FORMAT), "fingerprint": np.array(fingerprint), "tokenizer": np.array(str(tokenizer)),
        "vocab_size": np.array(vocab_size, dtype=np.int64), "top_k": np.array(top_k, dtype=np.int64),
        "alpha": np.array(alpha, dtype=np.float64), "num_tokens": np.array(tokens, dtype=np.int64),
        "indptr": indptr.astype(index_dtype), "successors": succ.astype(np.int32),
        "probs": probs.astype(np.float16), "totals": totals.astype(np.float32),
    }


def save_table(arrays: dict[str, np.ndarray], out: str | Path) -> Path:
    """Write atomically (a reader never sees half a file)."""
    out = Path(out).expanduser().resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            np.savez_compressed(handle, **arrays)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def build_table(files: Sequence[str | Path], tokenizer: str | Path, out: str | Path, top_k: int = DEFAULT_TOP_K,
                alpha: float = DEFAULT_ALPHA, progress: bool = True) -> Path:
    """Tokenize `files` with `tokenizer` (a folder or cached hub id) and write the table to `out`."""
    from tqdm import tqdm

    if not files:
        raise ValueError("no corpus files given")
    encode, vocab_size = _encoder(tokenizer)
    fingerprint = tokenizer_fingerprint(tokenizer, local_only=False)

    def sequences() -> Iterable[list[int]]:
        batch = 64  # files per encode_batch call: the Rust tokenizer parallelises inside a batch
        with tqdm(total=len(files), desc="bigram table", unit="file", disable=not progress) as bar:
            for start in range(0, len(files), batch):
                chunk = files[start:start + batch]
                texts = [Path(f).read_text(encoding="utf-8", errors="replace") for f in chunk]
                yield from encode(texts)
                bar.update(len(chunk))

    arrays = build_arrays(sequences(), vocab_size, fingerprint, top_k, alpha, tokenizer=str(tokenizer))
    path = save_table(arrays, out)
    log.info("bigram table %s: %d tokens from %d files, vocabulary %d, %d entries, %.2f MB",
             path, int(arrays["num_tokens"]), len(files), vocab_size, len(arrays["successors"]),
             path.stat().st_size / 1e6)
    return path


# --- loading ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BigramTable:
    """A loaded table, with the per-token arrays the proposer needs precomputed.

    Token ids outside the table's vocabulary (a model vocabulary padded beyond the tokenizer's)
    map to an extra empty row at index `vocab_size`.
    """

    path: Path
    fingerprint: str
    tokenizer: str
    vocab_size: int
    indptr: np.ndarray
    successors: np.ndarray
    probs: np.ndarray
    floor: np.ndarray
    """Per token (V + 1): probability of any successor not listed, alpha / (N + alpha * V)."""
    top_next: np.ndarray
    """Per token (V + 1): the most likely successor, -1 when the token was never seen."""
    top_prob: np.ndarray
    """Per token (V + 1): its probability."""
    listed: np.ndarray
    """(V + 1, top_k) successors per token, -1 padded: vectorised P(b | a) without a V x V matrix."""
    listed_probs: np.ndarray

    def row(self, token: np.ndarray) -> np.ndarray:
        """Row index of (non-negative) token ids; ids past the vocabulary map to the empty last row."""
        return np.minimum(np.asarray(token, dtype=np.int64), self.vocab_size)

    def prob(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """P(b | a) from the table, vectorised over equal-shaped 1-D id arrays."""
        rows, b = self.row(a), np.asarray(b)
        width = self.listed.shape[1]
        candidates = np.take(self.listed, rows, axis=0)  # np.take: several times faster than listed[rows]
        flat = rows * width + (candidates == b[:, None]).argmax(axis=1)  # the match, or column 0
        found = self.listed.ravel()[flat] == b
        return np.where(found, self.listed_probs.ravel()[flat], self.floor[rows])

    def successors_of(self, token: int) -> list[tuple[int, float]]:
        """The listed successors of one token with their probabilities (for people and tests)."""
        if not 0 <= token < self.vocab_size:
            return []
        lo, hi = int(self.indptr[token]), int(self.indptr[token + 1])
        return [(int(s), float(p)) for s, p in zip(self.successors[lo:hi], self.probs[lo:hi])]


REQUIRED = ("format", "fingerprint", "vocab_size", "indptr", "successors", "probs", "totals", "alpha")
OPTIONAL = ("tokenizer", "top_k", "num_tokens")
MAX_TOP_K = 256
"""Successors kept per token, at most: the drafter expands them to a dense (V + 1) x top_k array,
so a row of thousands would cost gigabytes for a large vocabulary."""
MAX_VOCAB = 1 << 22
# What each array must hold: (dtype kind: i integer, f float, U/S string; number of dimensions).
_KINDS = {"format": ("US", 0), "fingerprint": ("US", 0), "tokenizer": ("US", 0), "vocab_size": ("iu", 0),
          "top_k": ("iu", 0), "num_tokens": ("iu", 0), "alpha": ("f", 0), "indptr": ("iu", 1),
          "successors": ("iu", 1), "probs": ("f", 1), "totals": ("iuf", 1)}


def _array_header(data: Any, name: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of one array of an .npz, read from its header without loading it."""
    with data.zip.open(f"{name}.npy") as handle:
        version = np.lib.format.read_magic(handle)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(handle)
    return shape, dtype


def load_table(path: str | Path, expected_fingerprint: str | None = None, tokenizer: str | None = None,
               ) -> BigramTable:
    """Read and check a table; raise `BigramTableError` saying what is wrong and how to fix it.

    `expected_fingerprint`: the target tokenizer's (`tokenizer_fingerprint`); `tokenizer`: where
    that tokenizer is, for the messages.
    """
    path = Path(path).expanduser()
    build = BUILD_HINT.format(tokenizer=tokenizer or "TARGET_MODEL_DIR", out=path)

    def corrupt(why: str) -> BigramTableError:
        return BigramTableError(f"bigram table {path} is corrupt or not a specdeploy bigram table ({why}); "
                                f"rebuild it with `{build}`")

    if not path.is_file():
        raise BigramTableError(f"bigram table {path} does not exist. Build it with `{build}`, or leave "
                               f"speculation.bigram.table unset to use the embedded pair's table")
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in REQUIRED if k not in data.files]
            if missing:
                raise corrupt(f"missing arrays {missing}")
            unknown = sorted(set(data.files) - set(REQUIRED) - set(OPTIONAL))
            if unknown:
                raise corrupt(f"unknown arrays {unknown}")
            # Check every array's header before reading any: memory stays bounded by what a
            # table of this vocabulary can need, whatever the file claims.
            headers = {k: _array_header(data, k) for k in data.files}
            for name, (shape, dtype) in headers.items():
                kinds, ndim = _KINDS[name]
                if dtype.kind not in kinds or len(shape) != ndim:
                    raise corrupt(f"array {name!r} is {dtype} of shape {shape}, expected "
                                  f"{'a scalar' if ndim == 0 else 'a vector'} of kind {kinds!r}")
            v = int(data["vocab_size"])
            if not 2 <= v <= MAX_VOCAB:
                raise corrupt(f"vocab_size {v} outside 2..{MAX_VOCAB}")
            entries = headers["successors"][0][0]
            if headers["indptr"][0] != (v + 1,) or headers["totals"][0] != (v,) or entries > v * MAX_TOP_K:
                raise corrupt("array sizes do not fit the vocabulary")
            arrays = {k: data[k] for k in data.files}
    except BigramTableError:
        raise
    except Exception as exc:  # zip, pickle, dtype or I/O problems all mean the same to a user
        raise corrupt(f"{type(exc).__name__}: {exc}") from None
    if str(arrays["format"]) != FORMAT:
        raise corrupt(f"format {str(arrays['format'])!r}, expected {FORMAT!r}")
    v = int(arrays["vocab_size"])
    indptr, succ, probs, totals = (arrays[k] for k in ("indptr", "successors", "probs", "totals"))
    alpha = float(arrays["alpha"])
    consistent = (v >= 2 and indptr.shape == (v + 1,) and totals.shape == (v,) and succ.ndim == 1
                  and succ.shape == probs.shape and int(indptr[0]) == 0 and int(indptr[-1]) == len(succ)
                  and bool(np.all(np.diff(indptr) >= 0)) and alpha > 0
                  and (len(succ) == 0 or (int(succ.min()) >= 0 and int(succ.max()) < v))
                  and bool(np.all(np.isfinite(probs))) and bool(np.all((probs >= 0) & (probs <= 1))))
    if not consistent:
        raise corrupt("arrays are inconsistent")
    fingerprint = str(arrays["fingerprint"])
    built_for = str(arrays.get("tokenizer", "")) or "unknown"
    if expected_fingerprint is not None and fingerprint != expected_fingerprint:
        raise BigramTableError(
            f"bigram table {path} was built for another tokenizer ({built_for}, fingerprint {fingerprint[:12]}) "
            f"than the target's ({tokenizer or 'unknown'}, fingerprint {expected_fingerprint[:12]}); its token "
            f"ids would mean other tokens. Rebuild it for the target with `{build}`")
    floor = np.append(alpha / (totals.astype(np.float64) + alpha * v), 1.0 / v).astype(np.float32)
    counts = np.diff(indptr)
    rows = np.repeat(np.arange(v, dtype=np.int64), counts)
    top_next = np.full(v + 1, -1, dtype=np.int64)
    top_prob = floor.copy()
    has = counts > 0
    first = indptr[:-1][has].astype(np.int64)
    top_next[:v][has] = succ[first]
    top_prob[:v][has] = probs[first]
    top_k = int(counts.max()) if len(counts) else 0
    if top_k > MAX_TOP_K:
        raise corrupt(f"a token lists {top_k} successors, more than {MAX_TOP_K}; rebuild it with a smaller --top-k")
    rank = np.arange(len(succ)) - np.repeat(indptr[:-1].astype(np.int64), counts)
    listed = np.full((v + 1, max(top_k, 1)), -1, dtype=np.int32)
    listed_probs = np.zeros((v + 1, max(top_k, 1)), dtype=np.float32)
    listed[rows, rank] = succ
    listed_probs[rows, rank] = probs
    return BigramTable(path.resolve(), fingerprint, built_for, v, indptr.astype(np.int64), succ.astype(np.int64),
                       probs.astype(np.float32), floor, top_next, top_prob.astype(np.float32), listed, listed_probs)
