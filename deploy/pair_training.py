"""The embedded pair's training recipe (`make models REBUILD=1`): corpus, tokenizer, target, draft.

Hours on 2 cores, so it is built to be left running: a progress bar with an ETA, a checkpoint
every few minutes under `$SPECDEPLOY_CACHE/training/<recipe hash>/` from which an interrupted run
resumes (same batches, same schedule: the result is the one an uninterrupted run gives), and a
loss curve (train loss, held-out bits per byte) kept in `training.json` and drawn beside it.

Corpus: the Python standard library's training split (the held-out split is fixed by a hash of
each file's path) plus the sources of the packages installed beside the engine (`Recipe.packages`:
torch, transformers, vLLM, numpy...: tens of millions of tokens), tests excluded, exact duplicates dropped, and any file
whose text equals a held-out file's dropped. Windows are drawn from the standard library with
probability `stdlib_weight`, so the style the held-out split is in is not drowned out.

Schedule: warm-up, a long constant learning rate, then a linear decay over the last
`decay_fraction` of the steps (warmup-stable-decay): a stable-phase checkpoint can be cooled down
and evaluated at any time, and a longer run only moves the decay.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

log = logging.getLogger("specdeploy")

TRAIN_VERSION = 3  # bump when the code changes what a recipe produces (the hash covers the knobs)
SPECIALS = ("<s>", "</s>", "<pad>")  # ids 0, 1, 2: bos, eos, pad
BOS, EOS, PAD = 0, 1, 2
# Never train on tests (they are mostly fixtures).
SKIP_DIRS = frozenset({"test", "tests", "idle_test", "testing", "__pycache__"})
STDLIB_SKIP_DIRS = SKIP_DIRS | {"site-packages", "dist-packages"}


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
    # (2,800 steps reached 0.99 bits/byte against 1.1 here, in 75% more time)
    draft_layers: int = 2  # half the target's depth: a 2x128 draft trained from scratch agreed only 44%
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


def progress(iterable: Any = None, **kwargs: Any) -> Any:
    from tqdm import tqdm

    return tqdm(iterable, file=sys.stderr, mininterval=2.0, dynamic_ncols=True, **kwargs)


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


# ----------------------------------------------------------------------------- models & loop


def llama(recipe: Recipe, layers: int, width: int, ffn: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=recipe.vocab_size, hidden_size=width, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=width // recipe.head_dim, num_key_value_heads=width // recipe.head_dim,
        head_dim=recipe.head_dim, max_position_embeddings=recipe.max_position_embeddings,
        tie_word_embeddings=True, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    with torch.random.fork_rng():  # identical init on every build, caller's RNG untouched
        torch.manual_seed(recipe.seed)
        return LlamaForCausalLM(config)


class Windows:
    """Endless random training windows: from the stdlib stream with probability `stdlib_weight`,
    else from site-packages; its generator's state is checkpointed with the model."""

    def __init__(self, recipe: Recipe, streams: list[Any], weights: list[float], seq_len: int, batch: int):
        import torch

        self.streams, self.seq_len, self.batch = streams, seq_len, batch
        self.weights = torch.tensor(weights, dtype=torch.float64)
        self.gen = torch.Generator().manual_seed(recipe.seed)
        self.offsets = torch.arange(seq_len + 1)

    def __next__(self) -> Any:
        import torch

        which = torch.multinomial(self.weights, self.batch, replacement=True, generator=self.gen)
        rows = []
        for w in which.tolist():
            stream = self.streams[w]
            start = int(torch.randint(0, len(stream) - self.seq_len - 1, (1,), generator=self.gen))
            rows.append(stream[start:start + self.seq_len + 1])
        return torch.stack(rows).long()

    def __iter__(self) -> Iterator[Any]:
        return self


def lr_factor(recipe: Recipe, step: int, steps: int) -> float:
    """Warm-up, constant, then a linear decay over the last `decay_fraction` of the steps."""
    if step < recipe.warmup_steps:
        return (step + 1) / recipe.warmup_steps
    decay_start = int(steps * (1 - recipe.decay_fraction))
    if step < decay_start:
        return 1.0
    progress_ = (step - decay_start) / max(1, steps - decay_start)
    return 1.0 - (1.0 - recipe.min_lr_ratio) * progress_


def autocast(enabled: bool) -> Any:
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


class Checkpoints:
    """One file per training phase under the run's folder, written atomically."""

    def __init__(self, folder: Path):
        self.folder = folder

    def path(self, phase: str) -> Path:
        return self.folder / f"{phase}.pt"

    def load(self, phase: str) -> dict | None:
        import torch

        path = self.path(phase)
        return torch.load(path, weights_only=False) if path.is_file() else None

    def save(self, phase: str, state: dict) -> None:
        import torch

        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.path(phase).with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(self.path(phase))


def optimize(recipe: Recipe, model: Any, *, lr: float, steps: int, loss_fn: Callable[[Any], Any], batches: Windows,
             desc: str, checkpoints: Checkpoints, phase: str, bf16: bool,
             curve: Callable[[], float] | None = None, stop: int | None = None) -> dict:
    """AdamW under `lr_factor` for a fixed number of steps, resuming from the phase's checkpoint;
    `stop`: end after that many steps of the same schedule (a prefix of the full run)."""
    import torch

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=recipe.betas)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(recipe, s, steps))
    history: dict[str, list] = {"loss": [], "curve": []}
    start_step, spent = 0, 0.0
    if (state := checkpoints.load(phase)) is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        batches.gen.set_state(state["generator"])
        start_step, spent, history = state["step"], state["seconds"], state["history"]
        log.info("%s: resuming from step %d of %d (%s)", desc, start_step, steps, checkpoints.path(phase))

    def save(step: int) -> None:
        checkpoints.save(phase, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                                 "scheduler": sched.state_dict(), "generator": batches.gen.get_state(),
                                 "step": step, "seconds": spent + time.perf_counter() - t0, "history": history})

    model.train()
    t0 = last_save = time.perf_counter()
    end = steps if stop is None else min(stop, steps)
    bar = progress(range(start_step, end), desc=desc, unit="step", initial=start_step, total=end)
    tokens = batches.batch * batches.seq_len
    for step in bar:
        batch = next(batches)
        with autocast(bf16):
            loss = loss_fn(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        opt.step()
        sched.step()
        history["loss"].append(round(loss.item(), 4))
        if curve is not None and ((step + 1) % recipe.curve_every == 0 or step + 1 == end):
            model.eval()
            history["curve"].append([step + 1, round(curve(), 4)])
            model.train()
        if step % 10 == 0 or step == steps - 1:
            done = step + 1 - start_step
            rate = done * tokens / (time.perf_counter() - t0)
            last = history["loss"][-20:]
            post = {"loss": f"{sum(last) / len(last):.3f}", "tok_s": f"{rate:,.0f}"}
            if history["curve"]:
                post["heldout_bpb"] = f"{history['curve'][-1][1]:.3f}"
            bar.set_postfix(post)
        if time.perf_counter() - last_save >= recipe.checkpoint_every_s and step + 1 < end:
            save(step + 1)
            last_save = time.perf_counter()
    save(end)
    model.eval()
    seconds = spent + time.perf_counter() - t0
    return {"steps": end, "seconds": round(seconds, 1),
            "final_loss": round(sum(history["loss"][-50:]) / len(history["loss"][-50:]), 4),
            "tokens_per_s": round((end - start_step) * tokens / max(1e-9, time.perf_counter() - t0)),
            "loss_every_50": _every(history["loss"], 50),
            "heldout_bpb_curve": history["curve"]}


def init_from_layers(draft: Any, target: Any, layers: tuple[int, ...]) -> None:
    """Copy the target's embeddings, final norm and the chosen decoder layers into the draft
    (same width and feed-forward size; the head is tied to the embeddings)."""
    import torch

    if not layers:
        return
    if len(layers) != len(draft.model.layers):
        raise ValueError(f"draft_init_layers names {len(layers)} layers for a {len(draft.model.layers)}-layer draft")
    with torch.no_grad():
        draft.model.embed_tokens.load_state_dict(target.model.embed_tokens.state_dict())
        draft.model.norm.load_state_dict(target.model.norm.state_dict())
        for mine, theirs in zip(draft.model.layers, layers):
            mine.load_state_dict(target.model.layers[theirs].state_dict())


def kl_to(teacher: Any, student: Any) -> Callable[[Any], Any]:
    """The distillation loss of a batch: KL(teacher || student) over next-token distributions."""
    import torch
    import torch.nn.functional as F

    def loss(b: Any) -> Any:
        x = b[:, :-1]
        with torch.no_grad():
            target = F.log_softmax(teacher(input_ids=x).logits.float().flatten(0, 1), -1)
        own = F.log_softmax(student(input_ids=x).logits.float().flatten(0, 1), -1)
        return F.kl_div(own, target, log_target=True, reduction="batchmean")

    return loss


def _every(values: list[float], n: int) -> list[float]:
    return [round(sum(values[i:i + n]) / len(values[i:i + n]), 4) for i in range(0, len(values), n)]


def heldout_windows(stream: Any, seq_len: int, windows: int) -> Any:
    """Windows spread evenly over the held-out stream (not its first files only: they sort alphabetically)."""
    import torch

    n = min(windows, (len(stream) - 1) // seq_len)
    starts = torch.linspace(0, len(stream) - seq_len - 1, n).long()
    return torch.stack([stream[i: i + seq_len + 1] for i in starts.tolist()]).long()


def evaluate(target: Any, draft: Any | None, windows: Any, nbytes: Any, desc: str | None = None,
             batch_size: int = 8, bf16: bool = False) -> dict:
    """Held-out figures, teacher-forced: nats and bits per byte of each model, the target's top-1
    accuracy, and the draft's greedy agreement with the target."""
    import torch
    import torch.nn.functional as F

    t0 = time.perf_counter()
    totals = {"nll_t": 0.0, "nll_d": 0.0, "agree": 0.0, "top1": 0.0, "bytes": 0.0, "tokens": 0}
    batches = windows.split(batch_size)
    with torch.inference_mode(), autocast(bf16):
        for batch in progress(batches, desc=desc, unit="batch") if desc else batches:
            x, y = batch[:, :-1], batch[:, 1:].reshape(-1)
            lt = target(input_ids=x).logits.float().reshape(y.numel(), -1)
            totals["nll_t"] += F.cross_entropy(lt, y, reduction="sum").item()
            totals["top1"] += (lt.argmax(-1) == y).sum().item()
            totals["bytes"] += nbytes[y].sum().item()
            totals["tokens"] += y.numel()
            if draft is not None:
                ld = draft(input_ids=x).logits.float().reshape(y.numel(), -1)
                totals["nll_d"] += F.cross_entropy(ld, y, reduction="sum").item()
                totals["agree"] += (lt.argmax(-1) == ld.argmax(-1)).sum().item()
    n, b = totals["tokens"], totals["bytes"]
    out = {"tokens": n, "bytes_per_token": round(b / n, 3),
           "target_ppl": round(math.exp(totals["nll_t"] / n), 3),
           "target_bits_per_byte": round(totals["nll_t"] / math.log(2) / b, 4),
           "target_top1_accuracy": round(totals["top1"] / n, 4)}
    if draft is not None:
        out.update({"draft_ppl": round(math.exp(totals["nll_d"] / n), 3),
                    "draft_bits_per_byte": round(totals["nll_d"] / math.log(2) / b, 4),
                    "greedy_agreement": round(totals["agree"] / n, 4)})
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


# ----------------------------------------------------------------------------- the run


def run_folder(recipe: Recipe) -> Path:
    from deploy.embedded_pair import cache_root

    return cache_root() / "training" / f"{recipe_hash(recipe)}-{corpus_hash(recipe)}"


def train(recipe: Recipe, out: Path, stop_after: int | None = None) -> dict:
    """Tokenizer -> target (next-token loss) -> draft (KL to the target) -> held-out evaluation,
    saved in float32 into `out` (tokenizer/, target/, draft/, training.json, loss_curve.png).
    `stop_after`: train the target that many steps only and return its curve (the reproduction test)."""
    import torch

    caller_threads = torch.get_num_threads()
    torch.set_num_threads(recipe.threads)
    try:
        return _train(recipe, out, stop_after)
    finally:
        torch.set_num_threads(caller_threads)  # may run inside a test process


def _streams(recipe: Recipe) -> tuple[Any, dict[str, Any]]:
    """The tokenizer and the token streams, cached by what decides them (a resumed run skips them)."""
    import numpy as np
    import torch
    from tokenizers import Tokenizer

    from deploy.embedded_pair import cache_root

    split = corpus(recipe)
    knobs = {k: getattr(recipe, k) for k in ("heldout_percent", "max_file_kb", "packages", "vocab_size",
                                             "tokenizer_sample_mb")}
    key = hashlib.sha256(json.dumps([TRAIN_VERSION, knobs, corpus_hash(recipe)], sort_keys=True).encode())
    folder = cache_root() / "training" / f"tokens-{key.hexdigest()[:12]}"
    folder.mkdir(parents=True, exist_ok=True)
    tok_file, arrays = folder / "tokenizer.json", folder / "streams.npz"
    if tok_file.is_file() and arrays.is_file():
        tok = Tokenizer.from_file(str(tok_file))
        with np.load(arrays) as data:
            return tok, {k: torch.from_numpy(data[k].astype(np.int32)) for k in data.files}
    log.info("corpus: %d stdlib train + %d held-out files from %s, %d files from %s", len(split["train"]),
             len(split["heldout"]), stdlib(), len(split["extra"]), site_packages())
    tok = train_tokenizer(recipe, split)
    streams = {name: np.array(token_ids(tok, split[name], f"tokenize {name}"), dtype=np.uint16)
               for name in ("train", "heldout", "extra")}
    np.savez(arrays, **streams)
    tok.save(str(tok_file))
    return tok, {k: torch.from_numpy(v.astype(np.int32)) for k, v in streams.items()}


def _train(recipe: Recipe, out: Path, stop_after: int | None) -> dict:
    import tokenizers
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import PreTrainedTokenizerFast

    from deploy.cpu_dtype import native_bf16

    bf16 = native_bf16()
    folder = run_folder(recipe) if stop_after is None else out / "run"
    checkpoints = Checkpoints(folder)
    tok, streams = _streams(recipe)
    nbytes = torch.tensor(token_bytes(tok), dtype=torch.float64)
    log.info("tokens: %.1fM stdlib train, %.1fM site-packages, %.2fM held-out; run folder %s (resumable)",
             len(streams["train"]) / 1e6, len(streams["extra"]) / 1e6, len(streams["heldout"]) / 1e6, folder)
    curve_windows = heldout_windows(streams["heldout"], recipe.seq_len, recipe.curve_windows)

    def next_token_loss(model: Any) -> Callable[[Any], Any]:
        return lambda b: F.cross_entropy(model(input_ids=b[:, :-1]).logits.float().flatten(0, 1),
                                         b[:, 1:].flatten())

    parts = [streams["train"]] + ([streams["extra"]] if len(streams["extra"]) > recipe.seq_len else [])
    weights = [recipe.stdlib_weight, 1 - recipe.stdlib_weight] if len(parts) == 2 else [1.0]
    target = llama(recipe, recipe.target_layers, recipe.target_width, recipe.target_ffn)
    target_train = optimize(
        recipe, target, lr=recipe.lr, steps=recipe.target_steps, stop=stop_after,
        loss_fn=next_token_loss(target), batches=Windows(recipe, parts, weights, recipe.seq_len, recipe.batch_size),
        desc="train target", checkpoints=checkpoints, phase="target", bf16=bf16,
        curve=lambda: evaluate(target, None, curve_windows, nbytes, bf16=bf16)["target_bits_per_byte"])
    if stop_after is not None and stop_after < recipe.target_steps:
        return {"recipe_hash": recipe_hash(recipe), "train": {"target": target_train}}
    log.info("target: loss %.3f, %s tokens/s", target_train["final_loss"], f"{target_train['tokens_per_s']:,}")
    target.requires_grad_(False)

    draft = llama(recipe, recipe.draft_layers, recipe.draft_width, recipe.draft_ffn)
    init_from_layers(draft, target, recipe.draft_init_layers)
    distill_loss = kl_to(target, draft)
    draft_train = optimize(
        recipe, draft, lr=recipe.draft_lr, steps=recipe.draft_steps, loss_fn=distill_loss,
        batches=Windows(recipe, parts, weights, recipe.draft_seq_len, recipe.draft_batch_size),
        desc="distill draft", checkpoints=checkpoints, phase="draft", bf16=bf16)
    log.info("draft: KL to target %.3f, %s tokens/s", draft_train["final_loss"], f"{draft_train['tokens_per_s']:,}")
    # Evaluated as shipped: 16-bit storage (the repository stays small), computed in float32.
    for model in (target, draft):
        model.to(torch.bfloat16).to(torch.float32)
    windows = heldout_windows(streams["heldout"], recipe.seq_len, recipe.eval_windows)
    evaluation = evaluate(target, draft, windows, nbytes, "evaluate trained", bf16=False)

    out.mkdir(parents=True, exist_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            model_max_length=recipe.max_position_embeddings).save_pretrained(out / "tokenizer")
    target.to(torch.bfloat16).save_pretrained(out / "target")
    draft.to(torch.bfloat16).save_pretrained(out / "draft")
    split = corpus(recipe)
    training = {
        "recipe_hash": recipe_hash(recipe), "recipe": asdict(recipe), "corpus_hash": corpus_hash(recipe),
        "params": {"target": sum(p.numel() for p in target.parameters()),
                   "draft": sum(p.numel() for p in draft.parameters())},
        "heldout": evaluation, "train": {"target": target_train, "draft": draft_train},
        "corpus": {"stdlib": str(stdlib()), "site_packages": str(site_packages()),
                   "train_files": len(split["train"]), "extra_files": len(split["extra"]),
                   "heldout_files": len(split["heldout"]), "train_tokens": len(streams["train"]),
                   "extra_tokens": len(streams["extra"]), "heldout_tokens": len(streams["heldout"])},
        "seconds": round(target_train["seconds"] + draft_train["seconds"], 1),
        "threads": recipe.threads, "precision": "bf16 autocast" if bf16 else "float32",
        "torch": torch.__version__, "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
        "python": sys.version.split()[0], "cpu_bf16": bf16,
    }
    plot_curve(training, out / "loss_curve.png")
    (out / "training.json").write_text(json.dumps(training, indent=2) + "\n")  # written last: marks it complete
    return training


def plot_curve(training: dict, path: Path) -> None:
    """Train loss (nats a token) and held-out bits per byte over the target's steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tr = training["train"]["target"]
    fig, left = plt.subplots(figsize=(7, 3.6))
    xs = [50 * i + 25 for i in range(len(tr["loss_every_50"]))]
    left.plot(xs, tr["loss_every_50"], color="tab:blue", label="train loss (nats/token)")
    left.set_xlabel("step")
    left.set_ylabel("train loss (nats/token)", color="tab:blue")
    right = left.twinx()
    if tr["heldout_bpb_curve"]:
        cx, cy = zip(*tr["heldout_bpb_curve"])
        right.plot(cx, cy, "o-", color="tab:red", markersize=3, label="held-out bits/byte")
    right.set_ylabel("held-out bits per byte", color="tab:red")
    left.set_title(f"embedded target: {training['params']['target'] / 1e6:.1f}M parameters, "
                   f"{training['recipe']['target_steps']} steps of "
                   f"{training['recipe']['batch_size'] * training['recipe']['seq_len']:,} tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """`python -m deploy.pair_training [--out DIR]`: run (or resume) the recipe into DIR."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m deploy.pair_training", description=main.__doc__)
    parser.add_argument("--out", type=Path, default=None,
                        help="where the trained weights go (default: the run folder's weights/)")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s specdeploy %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    out = opts.out or run_folder(RECIPE) / "weights"
    log.info("recipe %s: run folder %s; interrupt at any time, the same command resumes", recipe_hash(RECIPE),
             run_folder(RECIPE))
    training = train(RECIPE, out)
    print(f"trained in {training['seconds']:.0f} s: held-out {training['heldout']['target_bits_per_byte']:.3f} "
          f"bits/byte, top-1 {training['heldout']['target_top1_accuracy']:.1%}, draft agreement "
          f"{training['heldout']['greedy_agreement']:.1%}; weights in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
