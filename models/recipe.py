"""The embedded pair's training recipe: every knob, and the hash `training.json` records.

The hash names the recipe's run folder and is checked against the shipped weights' (`make models
REBUILD=1` retrains when they differ), so it covers `TRAIN_VERSION` and every field of `Recipe`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

TRAIN_VERSION = 3  # bump when the code changes what a recipe produces (the hash covers the knobs)


@dataclass(frozen=True)
class Recipe:
    """Every knob of the training. bf16 autocast where the CPU computes bf16 natively, float32
    elsewhere (the same recipe; rounding differs, the quality does not)."""

    seed: int = 1234  # torch.manual_seed before each model's init; the batch generator's seed
    threads: int = 2  # torch intra-op threads: fixed and recorded, as BLAS reductions may depend on it
    heldout_percent: int = 5  # stdlib files whose path hash mod 100 falls below this are held out
    max_file_kb: int = 300  # skips pydoc_data/topics.py (English prose) and generated tables
    packages: tuple[str, ...] = ("torch", "transformers", "vllm", "numpy", "scipy", "pandas", "matplotlib", "sympy",
                                 "networkx")  # sources installed beside the engine (make venv): a fixed list,
    # so that a tool installed later into the environment does not change the corpus
    stdlib_weight: float = 0.3  # share of training windows drawn from the stdlib's training split
    vocab_size: int = 4096  # byte-level BPE incl. 3 specials + 256 bytes: 3.5 bytes a token on stdlib code
    tokenizer_sample_mb: int = 40  # text the BPE is learned from (stdlib first, then site-packages)
    seq_len: int = 512  # training window: code repeats its identifiers over hundreds of tokens
    batch_size: int = 16  # windows per step (8,192 tokens)
    lr: float = 3e-3  # AdamW peak learning rate
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1  # decoupled, on matrices only
    warmup_steps: int = 100  # linear warm-up
    decay_fraction: float = 0.2  # linear decay to min_lr_ratio * lr over the last fifth of the steps
    min_lr_ratio: float = 0.02
    grad_clip: float = 1.0
    head_dim: int = 64  # vLLM's CPU attention supports 64
    max_position_embeddings: int = 2048  # serving uses max_model_len up to 2048
    target_layers: int = 4
    target_width: int = 256  # 4 heads of 64: widened 6x (bf16) or 3x (float32) for serving
    target_ffn: int = 768  # SwiGLU inner size
    target_steps: int = 1600  # fixed (not a time budget) so that builds are reproducible: 13M tokens
    # (more steps reached a lower loss in far more time: docs/results.md, R39's note)
    draft_layers: int = 2  # half the target's depth: one trained from scratch agreed far less (docs/results.md, R39)
    draft_width: int = 256  # the target's width, so that the draft starts from the target's own layers
    draft_ffn: int = 768
    draft_init_layers: tuple[int, ...] = (0, 3)  # target layers copied into the draft (with embeddings,
    # final norm and head) before distillation: a layer-dropped target is a far better start than noise
    draft_steps: int = 1000  # distillation steps (KL to the target's logits): 4M tokens
    draft_batch_size: int = 16
    draft_seq_len: int = 256
    draft_lr: float = 2e-3  # lower than the target's: it starts trained
    eval_windows: int = 256  # held-out windows of seq_len tokens for the final figures
    curve_every: int = 200  # steps between points of the held-out loss curve
    curve_windows: int = 32  # held-out windows per curve point
    checkpoint_every_s: int = 300  # seconds between checkpoints


RECIPE = Recipe()


def recipe_hash(recipe: Recipe) -> str:
    """The training recipe (`training.json` records the one its weights came from)."""
    blob = json.dumps({"version": TRAIN_VERSION, "recipe": asdict(recipe)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
