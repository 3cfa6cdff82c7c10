"""Bigram tables beside the models: the embedded pair's table, and the command that builds one.

    python -m models.bigram_tables --tokenizer MODEL_DIR --out table.npz [FILES...]

builds a table for the target's tokenizer from text files (default: the embedded pair's training
corpus). The table format, building and checking are `plugins.bigram_table`'s, which the drafter
in vLLM's workers imports; what needs the embedded pair lives here, so that module imports
nothing of `models` or `deploy`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from models.embedded_pair import corpus_files, ensure_pair, pair_kind
from plugins.bigram_table import (DEFAULT_ALPHA, DEFAULT_TOP_K, BigramTableError, build_table, load_table,
                                  tokenizer_fingerprint)

log = logging.getLogger("specdeploy")

EMBEDDED_TABLE_NAME = "bigram-table.npz"


def embedded_table(progress: bool = True, ref: str = "embedded:target") -> Path:
    """The table of the embedded model `ref` resolves to (`SPECDEPLOY_PAIR`: SmolLM2 by default,
    else the code pair), built from the code pair's training corpus with that model's tokenizer on
    first use (file-locked, cached)."""
    from filelock import FileLock

    if pair_kind() == "smollm2" and not ref.startswith("embedded:code-"):
        from models.smollm2 import ensure_target

        target = ensure_target()
        path = target.parent / f"{target.name}.{EMBEDDED_TABLE_NAME}"
    else:
        pair = ensure_pair()
        # Beside the pair's folder (named after it), not inside: that folder is the other build's output.
        path = Path(pair.root).parent / f"{Path(pair.root).name}.{EMBEDDED_TABLE_NAME}"
        target = pair.target
    tokenizer = str(target)
    expected = tokenizer_fingerprint(tokenizer)
    with FileLock(str(path) + ".lock", timeout=1800):
        if path.is_file():
            try:
                load_table(path, expected, tokenizer)
                return path
            except BigramTableError as exc:
                log.warning("rebuilding the embedded bigram table: %s", exc)
        files = [str(f) for f in corpus_files("train")]
        log.info("building the embedded pair's bigram table from %d files (once; cached at %s)", len(files), path)
        return build_table(files, tokenizer, path, progress=progress)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.bigram_tables", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", required=True, help="the target's model or tokenizer folder (or cached hub id)")
    parser.add_argument("--out", required=True, help="table file to write (.npz)")
    parser.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, help="successors kept per token (%(default)s)")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="Laplace smoothing (%(default)s)")
    parser.add_argument("files", nargs="*", help="text files (default: the embedded pair's training corpus)")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    files = opts.files
    if not files:
        files = [str(f) for f in corpus_files("train")]
        log.info("no files given: using the embedded pair's training corpus (%d files)", len(files))
    try:
        path = build_table(files, opts.tokenizer, opts.out, opts.top_k, opts.alpha)
    except (BigramTableError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    table = load_table(path)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB): vocabulary {table.vocab_size}, "
          f"{len(table.successors)} successor entries, tokenizer fingerprint {table.fingerprint[:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
