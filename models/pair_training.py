"""The embedded pair's training recipe (`make models REBUILD=1`): corpus, tokenizer, target, draft.

Hours on a small CPU (docs/results.md, R39), so it is built to be left running: a progress bar
with an ETA, a checkpoint every few minutes under `$SPECDEPLOY_CACHE/training/<recipe hash>/` from
which an interrupted run resumes (same batches, same schedule: the result is the one an
uninterrupted run gives), and a loss curve (train loss, held-out bits per byte) kept in
`training.json` and drawn beside it.

The recipe's knobs are `models.recipe`'s, its corpus and tokenizer `models.corpus`'s, and its
AdamW loop `models.training`'s. Windows are drawn from the standard library with probability
`stdlib_weight`, else from site-packages.

Schedule: warm-up, a long constant learning rate, then a linear decay over the last
`decay_fraction` of the steps (warmup-stable-decay): a stable-phase checkpoint can be cooled down
and evaluated at any time, and a longer run only moves the decay.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator

from models.cache import cache_root
from models.cpu_dtype import native_bf16
from models.corpus import (BOS, EOS, PAD, corpus, corpus_hash, site_packages, stdlib, token_bytes, token_ids,
                           train_tokenizer)
from models.recipe import RECIPE, TRAIN_VERSION, Recipe, recipe_hash
from models.training import Checkpoints, Loop, autocast, progress

log = logging.getLogger("specdeploy")


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


def optimize(recipe: Recipe, model: Any, *, lr: float, steps: int, loss_fn: Callable[[Any], Any], batches: Windows,
             desc: str, checkpoints: Checkpoints, phase: str, bf16: bool,
             curve: Callable[[], float] | None = None, stop: int | None = None) -> dict:
    """AdamW (`models.training.Loop`, weight decay on matrices only) under `lr_factor` for a fixed
    number of steps, resuming from the phase's checkpoint; `stop`: end after that many steps of the
    same schedule (a prefix of the full run)."""
    loop = Loop(model, lr=lr, weight_decay=recipe.weight_decay, betas=recipe.betas, matrices_only=True,
                schedule=lambda s: lr_factor(recipe, s, steps), grad_clip=recipe.grad_clip, bf16=bf16)
    run = PhaseRun(recipe, model, loop, batches, checkpoints, phase, desc, steps)
    end = steps if stop is None else min(stop, steps)
    run.start(end, curve)
    bar = progress(range(run.start_step, end), desc=desc, unit="step", initial=run.start_step, total=end)
    loop.run(batches, loss_fn, bar, on_step=lambda step, loss: run.after_step(step, loss, bar))
    run.save(end)
    return run.summary()


class PhaseRun:
    """One phase of the recipe (the target's training, the draft's distillation) across checkpoints:
    resumed from the phase's checkpoint if there is one; after each step its loss, the held-out
    curve, the progress bar's figures and a checkpoint every `checkpoint_every_s`."""

    def __init__(self, recipe: Recipe, model: Any, loop: Loop, batches: Windows, checkpoints: Checkpoints,
                 phase: str, desc: str, steps: int):
        self.recipe, self.model, self.loop, self.batches = recipe, model, loop, batches
        self.checkpoints, self.phase, self.steps = checkpoints, phase, steps
        self.history: dict[str, list] = {"loss": [], "curve": []}
        self.start_step, self.spent = 0, 0.0
        if (state := checkpoints.load(phase)) is not None:
            model.load_state_dict(state["model"])
            loop.load_state_dict(state)
            batches.gen.set_state(state["generator"])
            self.start_step, self.spent, self.history = state["step"], state["seconds"], state["history"]
            log.info("%s: resuming from step %d of %d (%s)", desc, self.start_step, steps, checkpoints.path(phase))

    def start(self, end: int, curve: Callable[[], float] | None) -> None:
        """The clock starts; steps run up to `end`; `curve()`: the held-out figure the curve plots."""
        self.end, self.curve = end, curve
        self.t0 = self.last_save = time.perf_counter()
        self.tokens = self.batches.batch * self.batches.seq_len

    def save(self, step: int) -> None:
        self.checkpoints.save(self.phase, {"model": self.model.state_dict(), **self.loop.state_dict(),
                                           "generator": self.batches.gen.get_state(), "step": step,
                                           "seconds": self.spent + time.perf_counter() - self.t0,
                                           "history": self.history})

    def after_step(self, step: int, loss: float, bar: Any) -> None:
        recipe, history = self.recipe, self.history
        history["loss"].append(round(loss, 4))
        if self.curve is not None and ((step + 1) % recipe.curve_every == 0 or step + 1 == self.end):
            self.model.eval()
            history["curve"].append([step + 1, round(self.curve(), 4)])
            self.model.train()
        if step % 10 == 0 or step == self.steps - 1:
            done = step + 1 - self.start_step
            rate = done * self.tokens / (time.perf_counter() - self.t0)
            last = history["loss"][-20:]
            post = {"loss": f"{sum(last) / len(last):.3f}", "tok_s": f"{rate:,.0f}"}
            if history["curve"]:
                post["heldout_bpb"] = f"{history['curve'][-1][1]:.3f}"
            bar.set_postfix(post)
        if time.perf_counter() - self.last_save >= recipe.checkpoint_every_s and step + 1 < self.end:
            self.save(step + 1)
            self.last_save = time.perf_counter()

    def summary(self) -> dict:
        """What `training.json` keeps of the phase."""
        seconds = self.spent + time.perf_counter() - self.t0
        losses = self.history["loss"]
        return {"steps": self.end, "seconds": round(seconds, 1),
                "final_loss": round(sum(losses[-50:]) / len(losses[-50:]), 4),
                "tokens_per_s": round((self.end - self.start_step) * self.tokens
                                      / max(1e-9, time.perf_counter() - self.t0)),
                "loss_every_50": _every(losses, 50),
                "heldout_bpb_curve": self.history["curve"]}


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
    import torch
    import torch.nn.functional as F

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

    draft, draft_train = _distill_draft(recipe, target, Windows(recipe, parts, weights, recipe.draft_seq_len,
                                                                recipe.draft_batch_size), checkpoints, bf16)
    # Evaluated as shipped: 16-bit storage (the repository stays small), computed in float32.
    for model in (target, draft):
        model.to(torch.bfloat16).to(torch.float32)
    windows = heldout_windows(streams["heldout"], recipe.seq_len, recipe.eval_windows)
    evaluation = evaluate(target, draft, windows, nbytes, "evaluate trained", bf16=False)

    _save_weights(recipe, tok, target, draft, out)
    training = _training_record(recipe, streams, evaluation, {"target": target_train, "draft": draft_train},
                                {"target": target, "draft": draft}, bf16)
    plot_curve(training, out / "loss_curve.png")
    (out / "training.json").write_text(json.dumps(training, indent=2) + "\n")  # written last: marks it complete
    return training


def _distill_draft(recipe: Recipe, target: Any, batches: Windows, checkpoints: Checkpoints,
                   bf16: bool) -> tuple[Any, dict]:
    """The draft, started from the target's layers and distilled to it (KL), and its phase's summary."""
    draft = llama(recipe, recipe.draft_layers, recipe.draft_width, recipe.draft_ffn)
    init_from_layers(draft, target, recipe.draft_init_layers)
    distill_loss = kl_to(target, draft)
    draft_train = optimize(
        recipe, draft, lr=recipe.draft_lr, steps=recipe.draft_steps, loss_fn=distill_loss, batches=batches,
        desc="distill draft", checkpoints=checkpoints, phase="draft", bf16=bf16)
    log.info("draft: KL to target %.3f, %s tokens/s", draft_train["final_loss"], f"{draft_train['tokens_per_s']:,}")
    return draft, draft_train


def _save_weights(recipe: Recipe, tok: Any, target: Any, draft: Any, out: Path) -> None:
    """The tokenizer, and the target and draft in bf16 (the repository stays small)."""
    import torch
    from transformers import PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            model_max_length=recipe.max_position_embeddings).save_pretrained(out / "tokenizer")
    target.to(torch.bfloat16).save_pretrained(out / "target")
    draft.to(torch.bfloat16).save_pretrained(out / "draft")


def _training_record(recipe: Recipe, streams: dict[str, Any], evaluation: dict, train: dict[str, dict],
                     models: dict[str, Any], bf16: bool) -> dict:
    """`training.json`: the recipe, the corpus, each phase's curve, the held-out figures, the versions."""
    import tokenizers
    import torch
    import transformers

    split = corpus(recipe)
    return {
        "recipe_hash": recipe_hash(recipe), "recipe": asdict(recipe), "corpus_hash": corpus_hash(recipe),
        "params": {name: sum(p.numel() for p in model.parameters()) for name, model in models.items()},
        "heldout": evaluation, "train": train,
        "corpus": {"stdlib": str(stdlib()), "site_packages": str(site_packages()),
                   "train_files": len(split["train"]), "extra_files": len(split["extra"]),
                   "heldout_files": len(split["heldout"]), "train_tokens": len(streams["train"]),
                   "extra_tokens": len(streams["extra"]), "heldout_tokens": len(streams["heldout"])},
        "seconds": round(train["target"]["seconds"] + train["draft"]["seconds"], 1),
        "threads": recipe.threads, "precision": "bf16 autocast" if bf16 else "float32",
        "torch": torch.__version__, "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
        "python": sys.version.split()[0], "cpu_bf16": bf16,
    }


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
    """`python -m models.pair_training [--out DIR]`: run (or resume) the recipe into DIR."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m models.pair_training", description=main.__doc__)
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
