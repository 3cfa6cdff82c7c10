"""The embedded default model pair: a Llama target and a distilled draft, no hub and no GPU needed.

Two steps, so that a first `make serve` takes minutes, not the quarter of an hour training takes:

1. **Training** (`make models REBUILD=1`, about 16 min on 2 cores): a byte-level BPE tokenizer, a
   2M-parameter target and a 0.34M-parameter draft distilled from it, trained in float32 on the
   Python standard library's own sources by `Recipe`. The result is small (about 10 MB) and is
   shipped in the repository (`deploy/embedded_weights/`, with `training.json`: the recipe, its
   losses and the held-out agreement it reached); a test retrains and checks that the recipe
   still reproduces that agreement.
2. **Building the served pair** (every machine, on first use, well under a minute): the shipped
   target is widened without changing its function (`deploy.widen`) into what is served, saved in
   the serving dtype, and evaluated on held-out code. Cached under `$SPECDEPLOY_CACHE` (default
   `$XDG_CACHE_HOME/specdeploy` or `~/.cache/specdeploy`) in a folder keyed by the shipped weights
   and `Serving`.

Costs like a real deployment's. A 2M-parameter model costs framework overhead per step, not
weights or arithmetic, so speculation would behave unlike it does on a GPU. The served target is
therefore the trained one widened 8 times: a dense 102M-parameter bf16 model whose decode step
reads 204 MB of weights. At batch 1 a step is bound by memory bandwidth, so verifying K + 1 = 5
tokens costs about one plain step; at batch 32 it is bound by arithmetic, so verifying 32 x 5
tokens costs about 4 plain steps; the draft costs under a tenth of a target step. On a CPU without
bf16 arithmetic (AVX2 only) the target is served in float32 and widened 4 times (28M parameters),
which meets the same goals there. `make models` measures these ratios on the engine
(`tuning.step_costs`) and keeps them beside the pair (`engine_costs.json`), with the goals they
must meet (`GOALS`).

A second, **plumbing** target is built beside it from the same weights: widened only twice (6
heads, so tensor parallelism over 2 ranks works), same predictions, a fraction of the cost. The
test suite serves it (`SPECDEPLOY_PAIR=plumbing`) where it checks behaviour, not cost; `make
serve` and every measurement use the cost-faithful one (the default, `SPECDEPLOY_PAIR=cost`).

    pair = ensure_pair()        # builds on first use (under a file lock), else loads the report
    pair.target, pair.draft     # folders vLLM loads (`--model`, speculative_config["model"])

CLI: `python -m deploy.embedded_pair [--force] [--retrain] [--json]`.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from deploy.cpu_dtype import native_bf16
from deploy.pair_training import BOS, SPECIALS, kl_to, llama, progress, read, stdlib, stdlib_split, token_ids
from deploy.widen import widen_llama

log = logging.getLogger("specdeploy")

# Bump when the code changes in a way that changes its output (the hashes cover the knobs).
TRAIN_VERSION = 1  # the training (make models REBUILD=1)
BUILD_VERSION = 4  # the served pair built from the shipped weights
WEIGHTS = Path(__file__).parent / "embedded_weights"
"""The trained pair shipped in the repository: tokenizer/, target/, draft/ and training.json."""
PAIR_ENV = "SPECDEPLOY_PAIR"
"""Which target `embedded:target` serves: `cost` (default, the cost-faithful one) or `plumbing`."""


@dataclass(frozen=True)
class Recipe:
    """Every knob of the training (`make models REBUILD=1`). Float32 on every CPU, so that one
    set of shipped weights is what the recipe gives everywhere (up to BLAS rounding)."""

    seed: int = 1234  # torch.manual_seed before each model's init and batch sampling
    threads: int = 2  # torch intra-op threads: fixed and recorded, as BLAS reductions may depend on it
    heldout_percent: int = 5  # files whose path hash mod 100 falls below this are held out
    max_file_kb: int = 300  # skips pydoc_data/topics.py: 0.75 MB of English prose, not code
    vocab_size: int = 1024  # byte-level BPE incl. 3 specials + 256 bytes; small keeps the LM head cheap
    seq_len: int = 256  # training window; 128 made agreement fall from 62% to 44% past position 512
    batch_size: int = 16  # windows per step (4096 tokens)
    lr: float = 6e-3  # AdamW peak learning rate (tiny models tolerate a high one)
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW betas
    weight_decay: float = 0.1  # AdamW decoupled weight decay on matrices (not norms)
    warmup_steps: int = 20  # linear warm-up, then cosine decay to min_lr_ratio * lr
    min_lr_ratio: float = 0.1  # floor of the cosine schedule
    grad_clip: float = 1.0  # global grad-norm clip; guards the high lr early on
    head_dim: int = 64  # attention head size (vLLM CPU attention supports 64)
    max_position_embeddings: int = 2048  # serving uses max_model_len up to 2048
    target_layers: int = 4  # target depth
    target_width: int = 192  # target hidden size (3 heads of 64)
    target_ffn: int = 512  # target SwiGLU inner size
    target_steps: int = 600  # fixed step count (not a time budget) so builds are reproducible
    draft_layers: int = 1  # draft depth
    draft_width: int = 128  # draft hidden size (2 heads of 64)
    draft_ffn: int = 384  # draft SwiGLU inner size
    draft_steps: int = 900  # distillation steps (KL to the target's logits); 300: 65%, 600: 71%, 900: 74% agreement
    draft_lr: float = 6e-3  # peak learning rate of the distillation (1e-2: 49% agreement, 3e-3: same)
    eval_windows: int = 256  # held-out windows of seq_len tokens for the trained models


SERVED_WIDTH = {"bfloat16": 1536, "float32": 768}
"""The served target's hidden size per serving dtype, whatever the trained width: 1,536 in bf16 (the
2M-parameter target of width 192 widened 8x: 102M parameters; 6x, 59M, broke even at batch 32), 768
in float32 on an AVX2 CPU (8x there made a plain step 37 ms at batch 1 and 213 ms at batch 32 and
missed the batch-1 goal, 1.58x; 4x, 28M parameters, met every cost goal: 1.27x, 3.80x, 7.0%)."""


def _trained_width() -> int:
    config = WEIGHTS / "target" / "config.json"
    return json.loads(config.read_text())["hidden_size"] if config.is_file() else 192


def _copies() -> int:
    return SERVED_WIDTH["bfloat16" if native_bf16() else "float32"] // _trained_width()


@dataclass(frozen=True)
class Serving:
    """How the shipped weights become the served pair (every machine, on first use)."""

    target_copies: int = field(default_factory=_copies)
    """Served target = trained target widened this many times, to `SERVED_WIDTH` of the serving dtype."""
    target_kv_copies: int = field(default_factory=lambda: 2 if _copies() % 2 == 0 else 1)
    """Key/value heads copied this many times (a divisor of target_copies): grouped-query attention
    with 3-4 query heads per key/value head, as Llama-class targets have."""
    plumbing_copies: int = 2  # the plumbing target: 6 heads (tensor parallel over 2), a fraction of the cost
    serve_dtype: str = field(default_factory=lambda: "bfloat16" if native_bf16() else "float32")
    """Saved weights: bf16 halves the bytes a decode step reads where the CPU computes bf16; float32
    elsewhere, which is what such a CPU computes in (`dtype: auto`, deploy.cpu_dtype)."""
    eval_windows: int = 64  # held-out windows for the served models: the widened target is 30x slower


RECIPE = Recipe()
COSTS_FILE = "engine_costs.json"
# What makes the pair's costs behave like a real deployment's (checked by `make models`).
GOALS = {
    "verify_batch_1": 1.3,  # verifying K+1 tokens at batch 1, in plain decode steps (at most)
    "verify_batch_32": 3.0,  # verifying 32 x (K+1) tokens, in plain batch-32 steps (at least)
    "draft_step_batch_1": 0.15,  # one draft step, in target steps (at most)
    # What the target knows of code, on the held-out split (the aim beside each goal): deployed code
    # models sit near 0.6-1.0 bits per byte on Python, with top-1 accuracy well above half.
    "bits_per_byte": (1.3, 1.1),  # at most
    "top1_accuracy": (0.40, 0.50),  # at least
    "greedy_agreement": (0.60, 0.85),  # draft argmax = target argmax on held-out code: a real draft's range
    # Greedy, 128 tokens at fixed length: the share of prompts whose output loops (at most), on the
    # 8 held-out prompts and on the code workload's prompts.
    "greedy_degenerate_share": 0.25,
    "build_seconds": 240 if native_bf16() else 300,  # building the served pair on 2 cores (at most)
    # Free-running on held-out prompts at FREE_RUNNING_TEMPERATURE, K=4: acceptance in this range, from
    # output that is text (its distinct 4-grams within 20% of the held-out code's: loadtest.content).
    "free_running_acceptance": (0.50, 0.85),
    "free_running_content": 0.20,
}
FREE_RUNNING_TEMPERATURE = 1.0
"""vLLM's default: what users send. The pair's greedy output, forced to a fixed length, loops."""


@dataclass(frozen=True)
class EmbeddedPair:
    root: Path
    target: Path
    """The cost-faithful target (widened `Serving.target_copies` times)."""
    plumbing_target: Path
    """Same predictions, widened `Serving.plumbing_copies` times: for tests of behaviour."""
    draft: Path
    report: dict

    def served_target(self) -> Path:
        """The target `embedded:target` means here: `$SPECDEPLOY_PAIR` picks cost (default) or plumbing."""
        return self.plumbing_target if pair_kind() == "plumbing" else self.target


def pair_kind() -> str:
    kind = os.environ.get(PAIR_ENV, "cost") or "cost"
    if kind not in ("cost", "plumbing"):
        raise ValueError(f"{PAIR_ENV}={kind!r}: use cost (the default) or plumbing")
    return kind


# ----------------------------------------------------------------------------- corpus & cache


def _stdlib() -> Path:
    return stdlib()


def _corpus(recipe: Recipe) -> dict[str, tuple[Path, ...]]:
    return stdlib_split(recipe)  # type: ignore[arg-type]  # the same knobs: heldout_percent, max_file_kb


def corpus_files(split: str = "train") -> list[Path]:
    """The exact stdlib files the pair is trained on (`train`) or evaluated on (`heldout`)."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', not {split!r}")
    return list(_corpus(RECIPE)[split])


@functools.lru_cache(maxsize=1)
def heldout_tokens() -> tuple[int, ...]:
    """The held-out code as one token stream (files framed by <s> ... </s>), tokenized by the shipped
    tokenizer: the reference text the content check holds the pair's outputs against."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(WEIGHTS / "tokenizer" / "tokenizer.json"))
    return tuple(token_ids(tok, _corpus(RECIPE)["heldout"]))


def _corpus_listing(recipe: Recipe, splits: tuple[str, ...]) -> list[tuple[str, int]]:
    root = _stdlib()
    return [(p.relative_to(root).as_posix(), p.stat().st_size) for split in splits for p in _corpus(recipe)[split]]


def recipe_hash(recipe: Recipe) -> str:
    """The training recipe (`training.json` records the one its weights came from)."""
    blob = json.dumps({"version": TRAIN_VERSION, "recipe": asdict(recipe)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def corpus_hash(recipe: Recipe) -> str:
    """The files the recipe reads here: this machine's stdlib (another Python 3.11 release differs a little)."""
    blob = json.dumps(_corpus_listing(recipe, ("train", "heldout")))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _weights_digest(weights: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in weights.rglob("*") if p.is_file()):
        digest.update(path.relative_to(weights).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _build_hash(serving: Serving, weights: Path) -> str:
    blob = json.dumps({"version": BUILD_VERSION, "serving": asdict(serving), "weights": _weights_digest(weights),
                       "heldout": _corpus_listing(RECIPE, ("heldout",))}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def cache_root() -> Path:
    """specdeploy's cache folder: `$SPECDEPLOY_CACHE`, else `$XDG_CACHE_HOME/specdeploy` or `~/.cache/specdeploy`."""
    if os.environ.get("SPECDEPLOY_CACHE"):
        return Path(os.environ["SPECDEPLOY_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "specdeploy"


@functools.lru_cache(maxsize=None)
def pair_dir() -> Path:
    """Where the pair for the shipped weights and this machine's `Serving` lives (it may not be built yet)."""
    return cache_root() / f"embedded-pair-{_build_hash(Serving(), WEIGHTS)}"


def is_pair_folder(path: str | Path) -> bool:
    """Whether a model folder is one of a built embedded pair's (a running server's model or tokenizer)."""
    return bool(str(path)) and Path(path).expanduser().resolve().parent.name.startswith("embedded-pair-")


def is_built() -> bool:
    # The folder only ever appears by an atomic rename of a finished build, so these suffice.
    root = pair_dir()
    return all((root / name).is_file() for name in ("report.json", "target/config.json", "draft/config.json",
                                                    "plumbing-target/config.json"))


def _load(root: Path) -> EmbeddedPair:
    report = json.loads((root / "report.json").read_text())
    return EmbeddedPair(root=root, target=root / "target", plumbing_target=root / "plumbing-target",
                        draft=root / "draft", report=report)


def _shipped_training() -> dict:
    path = WEIGHTS / "training.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the embedded pair's trained weights are part of the repository "
                                f"(git checkout deploy/embedded_weights), or train them with `make models REBUILD=1`")
    return json.loads(path.read_text())


def _build_locked(root: Path, done: Callable[[], bool], build: Callable[[Path], Any], what: str) -> None:
    """Run `build(tmp)` under a file lock beside `root`, then move tmp into place atomically (unless
    `done()` says another process finished it while this one waited for the lock)."""
    from filelock import FileLock, Timeout

    root.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(root) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("another process is building %s; waiting for it (lock %s.lock)", what, root)
        lock.acquire()
    try:
        if done():
            return
        for stale in root.parent.glob(f".{root.name}.*"):  # left by a killed build; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root.parent / f".{root.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        build(tmp)
        if root.exists():  # --force: swap the old build out, then drop it
            old = root.parent / f".{root.name}.old-{os.getpid()}"
            root.rename(old)
            tmp.rename(root)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(root)
    finally:
        lock.release()


def ensure_pair(force: bool = False) -> EmbeddedPair:
    """The built pair; builds it first from the shipped weights if missing (or if `force`), one
    process at a time."""
    root = pair_dir()
    if not force and is_built():
        return _load(root)
    training = _shipped_training()
    if training.get("recipe_hash") != recipe_hash(RECIPE):
        log.warning("the shipped weights were trained with recipe %s, the code's recipe is %s: "
                    "`make models REBUILD=1` retrains them (about 16 min on 2 cores)",
                    training.get("recipe_hash"), recipe_hash(RECIPE))
    log.info("building the embedded model pair from %s into %s (under a minute; set SPECDEPLOY_CACHE to build "
             "elsewhere)", WEIGHTS, root)
    _build_locked(root, lambda: not force and is_built(),
                  lambda tmp: _build_served(Serving(), WEIGHTS, tmp, root.name), "the embedded pair")
    log.info("embedded pair ready: %s", root)
    return _load(root)


# ----------------------------------------------------------------------------- build


def _train_tokenizer(recipe: Recipe, files: tuple[Path, ...]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=recipe.vocab_size, min_frequency=2, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    texts = (read(p) for p in progress(files, desc="tokenizer: BPE", unit="file"))
    tok.train_from_iterator(texts, trainer=trainer, length=len(files))
    # Prompts get a leading <s> like every training document, as Llama tokenizers do.
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", BOS)])
    return tok


def _encode(tok: Any, files: tuple[Path, ...], desc: str) -> Any:
    """`_token_ids` as the int32 tensor training and evaluation read."""
    import torch

    return torch.tensor(token_ids(tok, files, desc), dtype=torch.int32)


def _batches(recipe: Recipe, stream: Any) -> Iterator[Any]:
    """Endless random windows of seq_len + 1 tokens, from a seeded generator of its own."""
    import torch

    gen = torch.Generator().manual_seed(recipe.seed)
    offsets = torch.arange(recipe.seq_len + 1)
    while True:
        starts = torch.randint(0, len(stream) - recipe.seq_len - 1, (recipe.batch_size, 1), generator=gen)
        yield stream[starts + offsets].long()


def _optimize(recipe: Recipe, model: Any, lr: float, steps: int, loss_fn: Callable[[Any], Any],
              stream: Any, desc: str) -> dict:
    """AdamW + warm-up + cosine for a fixed number of steps; returns loss and speed figures."""
    import torch

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=recipe.betas)

    def schedule(step: int) -> float:
        if step < recipe.warmup_steps:
            return (step + 1) / recipe.warmup_steps
        progress = (step - recipe.warmup_steps) / max(1, steps - recipe.warmup_steps)
        return recipe.min_lr_ratio + (1 - recipe.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    model.train()
    batches, losses, start = _batches(recipe, stream), [], time.perf_counter()
    bar = progress(range(steps), desc=desc, unit="step")
    for step in bar:
        loss = loss_fn(next(batches))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == steps - 1:
            tps = (step + 1) * recipe.batch_size * recipe.seq_len / (time.perf_counter() - start)
            bar.set_postfix(loss=f"{sum(losses[-10:]) / len(losses[-10:]):.3f}", tok_s=f"{tps:,.0f}")
        if step == 20 and (eta := (steps - step) * recipe.batch_size * recipe.seq_len / tps) > 400:
            log.warning("%s: only %s tokens/s, about %.0f min to go for this step alone: other processes "
                        "are using the CPU (vLLM servers spin on their cores); the result will be the same, "
                        "only later", desc, f"{tps:,.0f}", eta / 60)
    seconds = time.perf_counter() - start
    model.eval()
    return {"steps": steps, "seconds": round(seconds, 1), "final_loss": round(sum(losses[-20:]) / 20, 4),
            "tokens_per_s": round(steps * recipe.batch_size * recipe.seq_len / seconds)}


def train(recipe: Recipe, out: Path) -> dict:
    """Tokenizer -> target (next-token loss) -> draft (KL to the target) -> held-out evaluation,
    saved in float32 into `out` (tokenizer/, target/, draft/, training.json)."""
    import torch

    caller_threads = torch.get_num_threads()
    torch.set_num_threads(recipe.threads)
    try:
        return _train(recipe, out)
    finally:
        torch.set_num_threads(caller_threads)  # may run inside a test process


def _train(recipe: Recipe, out: Path) -> dict:
    import tokenizers
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import PreTrainedTokenizerFast

    t0 = time.perf_counter()
    split = _corpus(recipe)
    log.info("corpus: %d train + %d held-out files from %s", len(split["train"]), len(split["heldout"]), _stdlib())
    tok = _train_tokenizer(recipe, split["train"])
    train_stream = _encode(tok, split["train"], "tokenize train")
    heldout = _encode(tok, split["heldout"], "tokenize held-out")
    log.info("tokenizer: %d tokens, %.2fM train / %.2fM held-out tokens (%.0f s)", tok.get_vocab_size(),
             len(train_stream) / 1e6, len(heldout) / 1e6, time.perf_counter() - t0)

    def next_token_loss(model: Any) -> Callable[[Any], Any]:
        return lambda b: F.cross_entropy(model(input_ids=b[:, :-1]).logits.float().flatten(0, 1),
                                         b[:, 1:].flatten())

    target = llama(recipe, recipe.target_layers, recipe.target_width, recipe.target_ffn)
    target_train = _optimize(recipe, target, recipe.lr, recipe.target_steps, next_token_loss(target), train_stream,
                             "train target")
    log.info("target: loss %.3f, %s tokens/s", target_train["final_loss"], f"{target_train['tokens_per_s']:,}")
    target.requires_grad_(False)

    draft = llama(recipe, recipe.draft_layers, recipe.draft_width, recipe.draft_ffn)
    distill_loss = kl_to(target, draft)
    draft_train = _optimize(recipe, draft, recipe.draft_lr, recipe.draft_steps, distill_loss, train_stream,
                            "distill draft")
    log.info("draft: KL to target %.3f, %s tokens/s", draft_train["final_loss"], f"{draft_train['tokens_per_s']:,}")
    from deploy import pair_training

    evaluation = pair_training.evaluate(target, draft, pair_training.heldout_windows(heldout, recipe.seq_len,
                                                                                   recipe.eval_windows),
                                        torch.tensor(pair_training.token_bytes(tok), dtype=torch.float64),
                                        "evaluate trained")

    out.mkdir(parents=True, exist_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            model_max_length=recipe.max_position_embeddings).save_pretrained(out / "tokenizer")
    target.save_pretrained(out / "target")
    draft.save_pretrained(out / "draft")
    training = {
        "recipe_hash": recipe_hash(recipe), "recipe": asdict(recipe), "corpus_hash": corpus_hash(recipe),
        "params": {"target": sum(p.numel() for p in target.parameters()),
                   "draft": sum(p.numel() for p in draft.parameters())},
        "heldout": evaluation, "train": {"target": target_train, "draft": draft_train},
        "corpus": {"stdlib": str(_stdlib()), "train_files": len(split["train"]),
                   "heldout_files": len(split["heldout"]), "train_tokens": len(train_stream),
                   "heldout_tokens": len(heldout)},
        "seconds": round(time.perf_counter() - t0, 1), "threads": recipe.threads, "torch": torch.__version__,
        "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
        "python": sys.version.split()[0], "cpu_bf16": native_bf16(),
    }
    (out / "training.json").write_text(json.dumps(training, indent=2) + "\n")  # written last: marks it complete
    return training


def retrain() -> dict:
    """`make models REBUILD=1`: train the recipe and replace the shipped weights (then commit them)."""
    log.info("training the embedded pair with the recipe into %s (about 16 min on 2 cores)", WEIGHTS)
    _build_locked(WEIGHTS, lambda: False, lambda tmp: train(RECIPE, tmp), "the embedded weights")
    pair_dir.cache_clear()
    return _shipped_training()


def _build_served(serving: Serving, weights: Path, out: Path, build_hash: str) -> dict:
    """Shipped weights -> widened target, plumbing target and draft in the serving dtype, evaluated."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    t0 = time.perf_counter()
    training = _shipped_training()
    tok = AutoTokenizer.from_pretrained(weights / "tokenizer")
    trained = {name: LlamaForCausalLM.from_pretrained(weights / name, torch_dtype=torch.float32).eval()
               for name in ("target", "draft")}
    dtype = getattr(torch, serving.serve_dtype)
    served = {"target": widen_llama(trained["target"], serving.target_copies, serving.target_kv_copies),
              "plumbing-target": widen_llama(trained["target"], serving.plumbing_copies, serving.plumbing_copies),
              "draft": trained["draft"]}
    for name, model in progress(served.items(), desc="save served models", unit="model"):
        model.to(dtype).save_pretrained(out / name)
        tok.save_pretrained(out / name)  # each folder loads on its own (vLLM, AutoTokenizer)
    # Evaluated as a server on this CPU runs them: the saved weights, in float32 where the CPU has
    # no bf16 arithmetic (then the saved weights are float32 already).
    from deploy import pair_training

    heldout = _encode(tok.backend_tokenizer, _corpus(RECIPE)["heldout"], "tokenize held-out")
    windows = pair_training.heldout_windows(heldout, training["recipe"]["seq_len"], serving.eval_windows)
    nbytes = torch.tensor(pair_training.token_bytes(tok.backend_tokenizer), dtype=torch.float64)
    evaluation = pair_training.evaluate(served["target"], served["draft"], windows, nbytes,
                                        f"evaluate served ({serving.serve_dtype})")
    report = {
        "build_hash": build_hash, "build_version": BUILD_VERSION, "serving": asdict(serving),
        "params": {"target": sum(p.numel() for p in served["target"].parameters()),
                   "plumbing_target": sum(p.numel() for p in served["plumbing-target"].parameters()),
                   "trained_target": training["params"]["target"], "draft": training["params"]["draft"]},
        "heldout": evaluation, "training": training, "build_seconds": round(time.perf_counter() - t0, 1),
        "torch": torch.__version__,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")  # written last: marks it complete
    return report


# ----------------------------------------------------------------------------- CLI


def engine_costs(pair: EmbeddedPair) -> dict | None:
    """The step costs measured on the engine for this pair (`make models`), if measured yet."""
    path = pair.root / COSTS_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def check_goals(pair: EmbeddedPair, costs: dict | None) -> list[tuple[str, bool | None]]:
    """(line, met) for each of the pair's goals; met is None where nothing was measured yet."""
    r, out = pair.report, []
    held = r["heldout"]
    bpb, aim = GOALS["bits_per_byte"]
    if held.get("target_bits_per_byte") is None:
        out.append(("target: held-out bits per byte not measured (make models rebuilds the pair)", None))
    else:
        out.append((f"target: held-out {held['target_bits_per_byte']:.2f} bits per byte (goal <= {bpb}, aim {aim})",
                    held["target_bits_per_byte"] <= bpb))
    top1, aim = GOALS["top1_accuracy"]
    out.append((f"target: held-out top-1 accuracy {held['target_top1_accuracy']:.1%} (goal >= {top1:.0%}, "
                f"aim {aim:.0%})", held["target_top1_accuracy"] >= top1))
    agreement, (low, high) = held["greedy_agreement"], GOALS["greedy_agreement"]
    out.append((f"draft: greedy agreement on held-out code {agreement:.1%} (goal {low:.0%}-{high:.0%})",
                low <= agreement <= high))
    out.append((f"served pair built in {r['build_seconds']:.0f} s (goal <= {GOALS['build_seconds']} s; "
                f"training the shipped weights took {r['training']['seconds']:.0f} s)",
                r["build_seconds"] <= GOALS["build_seconds"]))
    ratios = (costs or {}).get("ratios", {})
    checks = [("1", "verify_ratio", "verifying {k1} tokens at batch 1: {v:.2f}x a plain step (goal <= {g}x)",
               "verify_batch_1", lambda v, g: v <= g),
              ("32", "verify_ratio", "verifying 32 x {k1} tokens at batch 32: {v:.2f}x a plain step (goal >= {g}x)",
               "verify_batch_32", lambda v, g: v >= g),
              ("1", "draft_step", "one draft step at batch 1: {v:.1%} of a target step (goal <= {g:.0%})",
               "draft_step_batch_1", lambda v, g: v <= g)]
    for batch, key, text, goal, ok in checks:
        value = ratios.get(batch, {}).get(key)
        if value is None:
            k1 = costs["k"] + 1 if costs else "K+1"
            out.append((text.split(":")[0].format(k1=k1) + ": not measured yet (make models)", None))
        else:
            out.append((text.format(k1=costs["k"] + 1, v=value, g=GOALS[goal]), ok(value, GOALS[goal])))
    out.append(free_running_goal(costs))
    out += greedy_goals(costs)
    return out


def greedy_goals(costs: dict | None) -> list[tuple[str, bool | None]]:
    """Greedy output at a fixed length loops on at most a quarter of the held-out and code prompts."""
    runs = (costs or {}).get("acceptance") or {}
    goal, out = GOALS["greedy_degenerate_share"], []
    for key, what in (("0", "the 8 held-out prompts"), ("greedy_code", "the code workload's prompts")):
        checked = (runs.get(key) or {}).get("content") or {}
        if not checked.get("checked"):
            out.append((f"greedy on {what}: not measured yet (make models)", None))
            continue
        share = checked["degenerate_share"]
        out.append((f"greedy on {what}: {checked['degenerate']} of {checked['checked']} outputs loop "
                    f"(goal at most {goal:.0%})", share <= goal))
    return out


def free_running_goal(costs: dict | None) -> tuple[str, bool | None]:
    """The free-running goal's line: acceptance in range, from output like the held-out code."""
    low, high = GOALS["free_running_acceptance"]
    run = ((costs or {}).get("acceptance") or {}).get(f"{FREE_RUNNING_TEMPERATURE:g}")
    what = f"free-running at T={FREE_RUNNING_TEMPERATURE:g} on held-out prompts"
    if not run or run.get("acceptance_rate") is None:
        return f"{what}: not measured yet (make models)", None
    checked = run.get("content") or {}
    vs = checked.get("vs_reference")
    like = vs is not None and abs(vs - 1) <= GOALS["free_running_content"] and not checked.get("degenerate")
    noise = checked.get("noise")
    like = like and not noise
    text = (f"{what}: acceptance at K={costs['k']} {run['acceptance_rate']:.1%} (goal {low:.0%}-{high:.0%}); "
            + (f"distinct 4-grams {checked['distinct_4']:.2f} against the held-out code's "
               f"{checked['reference']['distinct_4']:.2f} (goal within {GOALS['free_running_content']:.0%}), "
               f"{checked['degenerate']} of {checked['checked']} outputs degenerate (goal none)"
               + (f", {noise} of {checked['noise_checked']} noise (goal none)" if noise is not None
                  else ", noise not checked")
               if vs is not None else "content not checked"))
    return text, low <= run["acceptance_rate"] <= high and like


def _consequence(line: str) -> str | None:
    """What a missed cost goal does to the verdicts measured on this machine."""
    if line.startswith("verifying") and "at batch 32" in line:
        return ("a batch-32 verification costs less here than on a compute-bound GPU, so this CPU's batch-32 "
                "speedups are optimistic: do not read a GPU's batch-32 verdict from them")
    if line.startswith("verifying"):
        return ("verification at batch 1 costs more here than a memory-bound GPU step, so this CPU's batch-1 "
                "speedups are pessimistic")
    if line.startswith("one draft step"):
        return "the draft costs more than a real one would, so every speedup here is pessimistic"
    return None


def goal_lines(pair: EmbeddedPair, costs: dict | None) -> list[str]:
    """The goals as printed lines: `[ok]`, `[MISSED]`, or `[..]` where nothing was measured yet; a
    missed cost goal says what it does to the verdicts measured on this machine."""
    out = []
    for text, met in check_goals(pair, costs):
        out.append(f"  [{'ok' if met else 'MISSED' if met is False else '..'}] {text}")
        what = _consequence(text)
        if met is False and what:
            out.append(f"           -> {what}")
    return out


def _table(pair: EmbeddedPair) -> str:
    r = pair.report
    ev, tr = r["heldout"], r["training"]["train"]
    rows = [
        ("", "target", "draft"),
        ("parameters served", f"{r['params']['target']:,}", f"{r['params']['draft']:,}"),
        ("parameters trained", f"{r['params']['trained_target']:,}", f"{r['params']['draft']:,}"),
        ("held-out perplexity", f"{ev['target_ppl']:.2f}", f"{ev['draft_ppl']:.2f}"),
        ("train tokens/s", f"{tr['target']['tokens_per_s']:,}", f"{tr['draft']['tokens_per_s']:,}"),
        ("train seconds", f"{tr['target']['seconds']:.0f}", f"{tr['draft']['seconds']:.0f}"),
    ]
    lines = [f"{a:<22}{b:>12}{c:>12}" for a, b, c in rows]
    serving = r["serving"]
    lines += [f"served in {serving['serve_dtype']}; the target is the trained one widened {serving['target_copies']}x "
              f"(same predictions, realistic costs); the plumbing target {serving['plumbing_copies']}x "
              f"({r['params']['plumbing_target']:,} parameters, for tests of behaviour)",
              f"served pair built in {r['build_seconds']:.0f} s, torch {r['torch']}; weights trained by recipe "
              f"{r['training']['recipe_hash']} in {r['training']['seconds']:.0f} s",
              f"target: {pair.target}", f"plumbing target: {pair.plumbing_target}", f"draft:  {pair.draft}", "goals:"]
    lines += goal_lines(pair, engine_costs(pair))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.embedded_pair",
                                     description="Build (or show the cached) embedded target/draft pair.")
    parser.add_argument("--force", action="store_true", help="rebuild the served pair even if it is cached")
    parser.add_argument("--retrain", action="store_true",
                        help=f"train the recipe anew and replace the shipped weights in {WEIGHTS} (about 16 min)")
    parser.add_argument("--json", action="store_true", help="print report.json instead of a table")
    opts = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s specdeploy %(levelname)s %(message)s",
                            datefmt="%H:%M:%S")
    if opts.retrain:
        training = retrain()
        print(f"trained in {training['seconds']:.0f} s: held-out agreement "
              f"{training['heldout']['greedy_agreement']:.1%}; commit {WEIGHTS} to ship it")
    cached = not opts.force and not opts.retrain and is_built()
    pair = ensure_pair(force=opts.force or opts.retrain)
    if opts.json:
        print(json.dumps(pair.report, indent=2))
    else:
        print(("cached pair (use --force to rebuild)\n" if cached else "") + _table(pair))
    return 0


if __name__ == "__main__":
    sys.exit(main())
