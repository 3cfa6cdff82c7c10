"""The embedded pair's corpus and tokenizer.

Corpus: the Python standard library's training split (the held-out split is fixed by a hash of
each file's path) plus the sources of the packages installed beside the engine (`Recipe.packages`:
torch, transformers, vLLM, numpy...: tens of millions of tokens), tests excluded, exact duplicates dropped, and any file
whose text equals a held-out file's dropped. Training windows are drawn from the standard library
with probability `stdlib_weight` (`models.pair_training`), so the style the held-out split is in
is not drowned out.

Tokenizer: a byte-level BPE learned from the corpus, each file framed by <s> ... </s>.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import sysconfig
from pathlib import Path
from typing import Any

from models.recipe import RECIPE, Recipe
from models.training import progress

log = logging.getLogger("specdeploy")

SPECIALS = ("<s>", "</s>", "<pad>")  # ids 0, 1, 2: bos, eos, pad
BOS, EOS, PAD = 0, 1, 2
# Never train on tests (they are mostly fixtures).
SKIP_DIRS = frozenset({"test", "tests", "idle_test", "testing", "__pycache__"})
STDLIB_SKIP_DIRS = SKIP_DIRS | {"site-packages", "dist-packages"}


# ----------------------------------------------------------------------------- corpus


def stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _python_files(root: Path, skip: frozenset[str], max_kb: int) -> list[Path]:
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in skip)  # pruned, not filtered: site-packages is big
        for name in names:
            path = Path(folder) / name
            if name.endswith(".py") and path.is_file() and path.stat().st_size <= max_kb * 1024:
                files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _digest(path: Path) -> bytes:
    return hashlib.sha1(path.read_bytes()).digest()


@functools.lru_cache(maxsize=None)
def stdlib_split(recipe: Recipe = RECIPE) -> dict[str, tuple[Path, ...]]:
    """The stdlib's `train` and `heldout` files (a fast walk: no site-packages)."""
    root = stdlib()
    files = _python_files(root, STDLIB_SKIP_DIRS, recipe.max_file_kb)

    # Split by a hash of the relative path: stable across machines and when files come or go.
    def held(p: Path) -> bool:
        digest = hashlib.sha1(p.relative_to(root).as_posix().encode()).digest()
        return int.from_bytes(digest[:4], "big") % 100 < recipe.heldout_percent

    return {"train": tuple(p for p in files if not held(p)), "heldout": tuple(p for p in files if held(p))}


@functools.lru_cache(maxsize=None)
def corpus(recipe: Recipe = RECIPE) -> dict[str, tuple[Path, ...]]:
    """`train` and `heldout` (the stdlib's two splits) and `extra` (site-packages, deduplicated)."""
    split = dict(stdlib_split(recipe))
    files = split["train"] + split["heldout"]
    extra: list[Path] = []
    seen = {_digest(p) for p in files}  # held-out texts (and stdlib copies) never enter training twice
    for package in recipe.packages:
        if not (site_packages() / package).is_dir():
            raise FileNotFoundError(f"{site_packages() / package} is missing: the recipe trains on the sources of "
                                    f"{', '.join(recipe.packages)} as `make venv` installs them")
        for path in _python_files(site_packages() / package, SKIP_DIRS, recipe.max_file_kb):
            digest = _digest(path)
            if digest not in seen:
                seen.add(digest)
                extra.append(path)
    split["extra"] = tuple(extra)
    return split


def corpus_listing(recipe: Recipe, splits: tuple[str, ...]) -> list[tuple[str, int]]:
    out = []
    for name in splits:
        root = stdlib() if name != "extra" else site_packages()
        out += [(p.relative_to(root).as_posix(), p.stat().st_size) for p in corpus(recipe)[name]]
    return out


def corpus_hash(recipe: Recipe) -> str:
    """The files the recipe reads here (another Python release or package version differs a little)."""
    blob = json.dumps(corpus_listing(recipe, ("train", "heldout", "extra")))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def token_ids(tok: Any, files: tuple[Path, ...], desc: str | None = None) -> list[int]:
    """All files as one token stream, each file framed by <s> ... </s>."""
    ids: list[int] = []
    chunk = 256
    bar = progress(total=len(files), desc=desc, unit="file") if desc else None
    for i in range(0, len(files), chunk):
        part = files[i:i + chunk]
        for enc in tok.encode_batch([read(p) for p in part], add_special_tokens=False):
            ids += [BOS, *enc.ids, EOS]
        if bar is not None:
            bar.update(len(part))
    if bar is not None:
        bar.close()
    return ids


def train_tokenizer(recipe: Recipe, split: dict[str, tuple[Path, ...]]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    budget, texts = recipe.tokenizer_sample_mb * 1 << 20, []
    # The stdlib first (the held-out style), then site-packages spread evenly over its files.
    extra = split["extra"]
    step = max(1, len(extra) // 4000)
    for path in (*split["train"], *extra[::step]):
        texts.append(read(path))
        budget -= len(texts[-1])
        if budget <= 0:
            break
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=recipe.vocab_size, min_frequency=2, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    log.info("tokenizer: byte-level BPE of %d tokens from %.0f MB of code", recipe.vocab_size,
             sum(map(len, texts)) / 1e6)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    # Prompts get a leading <s> like every training document, as Llama tokenizers do.
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", BOS)])
    return tok


def token_bytes(tok: Any) -> list[int]:
    """UTF-8 bytes each token id stands for (0 for the specials): byte-level BPE maps one character
    of a token's string to one byte."""
    vocab = tok.get_vocab()
    out = [0] * tok.get_vocab_size()
    for text, idx in vocab.items():
        out[idx] = 0 if text in SPECIALS else len(text)
    return out
