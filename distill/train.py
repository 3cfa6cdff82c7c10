"""Fine-tune the draft on the target's continuations: at every generated position the draft's
distribution is pulled toward the target's (its top log-probabilities, renormalised), or toward
the generated token where the server returned none. Speculative acceptance is the overlap of the
two distributions, so matching the target's, not only its argmax, is what raises it.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from distill.collect import Example
from loadtest.measurement.serial import Serial
from models.training import Loop


@dataclass(frozen=True)
class TrainSettings:
    epochs: int = 6
    """On the embedded pair, held-out greedy agreement gained little beyond 6 epochs at this `lr`."""
    lr: float = 2e-3
    """Peak learning rate (AdamW), after a warm-up of 5% of the steps, then cosine to a tenth."""
    batch_size: int = 16
    weight_decay: float = 0.01
    seed: int = 0
    max_len: int = 1024
    """Longest sequence trained on (prompt + continuation, cut from the left)."""


def load_draft(folder: str | Path, device: str = "cpu") -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).to(device)


def _batches(examples: Sequence[Example], size: int, seed: int, epochs: int) -> Iterator[list[Example]]:
    rng = random.Random(seed)
    for _ in range(epochs):
        order = list(examples)
        rng.shuffle(order)
        for i in range(0, len(order), size):
            yield order[i:i + size]


@dataclass(frozen=True)
class Positions:
    """A batch's inputs, and per generated position: where its prediction is read (`rows`, `cols`), the
    target's top tokens and their probabilities (`ids`, `probs`) and its mass beyond them (`rest`)."""

    input_ids: Any
    attention_mask: Any
    rows: Any
    cols: Any
    ids: Any
    probs: Any
    rest: Any


@dataclass
class TrainStats(Serial):
    """`loss_first`, `loss_last`: the mean loss over the first and the last tenth of the steps."""

    steps: int
    seconds: float
    loss_first: float
    loss_last: float


@dataclass
class Offline(Serial):
    """Teacher-forced on the target's held-out continuations."""

    greedy_agreement: float
    """Share of positions where the draft's argmax is the target's most likely token."""
    loss: float
    positions: int


def position_tensors(batch: list[Example], pad_id: int, max_len: int, device: str) -> Positions:
    """Inputs (prompt + continuation minus its last token, right-padded), and for each generated
    position: where it is, the target's probabilities of its top tokens, and the mass left over."""
    import torch

    rows, where, ids, probs = [], [], [], []
    width = max(len(e.top[0]) if e.top else 1 for e in batch)
    for b, e in enumerate(batch):
        seq = list(e.prompt_ids + e.completion_ids)[-(max_len + 1):]
        first = len(seq) - len(e.completion_ids)  # index of the first generated token in `seq`
        rows.append(seq[:-1])
        for i, token in enumerate(e.completion_ids):
            if first + i - 1 < 0:
                continue  # its context was cut
            where.append((b, first + i - 1))  # the position whose output predicts it
            if e.top:
                top = sorted(e.top[i].items(), key=lambda kv: -kv[1])[:width]
                ids.append([t for t, _ in top] + [token] * (width - len(top)))
                probs.append([math.exp(lp) for _, lp in top] + [0.0] * (width - len(top)))
            else:
                ids.append([token] * width)
                probs.append([1.0] + [0.0] * (width - 1))
    longest = max(map(len, rows))
    inputs = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for b, row in enumerate(rows):
        inputs[b, :len(row)] = torch.tensor(row)
        mask[b, :len(row)] = 1
    pos = torch.tensor(where, dtype=torch.long)
    p = torch.tensor(probs)
    return Positions(inputs.to(device), mask.to(device), pos[:, 0].to(device), pos[:, 1].to(device),
                     torch.tensor(ids).to(device), p.to(device), (1 - p.sum(-1)).clamp_min(0).to(device))


def answer_logits(model: Any, t: Positions) -> Any:
    """The draft's logits at the answer positions, one row each."""
    return model(input_ids=t.input_ids, attention_mask=t.attention_mask).logits[t.rows, t.cols]


def top_kl(picked: Any, t: Positions) -> Any:
    """KL(target || draft) over the target's top tokens plus one bucket for all the others (up to
    a constant), from the draft's logits at the answer positions (`picked`). The bucket matters:
    renormalising the top tokens instead taught the embedded draft to leave out the target's mass
    beyond them, and its acceptance of sampled (T=1) drafts fell while greedy acceptance rose."""
    import torch
    import torch.nn.functional as F

    logq = F.log_softmax(picked.float(), dim=-1)
    top = logq.gather(1, t.ids)
    # log of the draft's mass outside the top tokens (duplicated padding ids counted once)
    seen = torch.zeros_like(logq, dtype=torch.bool).scatter_(1, t.ids, True)
    logrest = torch.logsumexp(logq.masked_fill(seen, float("-inf")), dim=-1)
    return -((t.probs * top).sum(-1) + t.rest * logrest).mean()


def fine_tune(model: Any, examples: Sequence[Example], settings: TrainSettings, pad_id: int,
              device: str = "cpu") -> TrainStats:
    """Train in place (`models.training`'s loop); the loss at the start and the end, steps and seconds."""
    import torch

    torch.manual_seed(settings.seed)
    steps = settings.epochs * math.ceil(len(examples) / settings.batch_size)
    # At least 10 steps of warm-up: AdamW's first steps move every weight by about the learning
    # rate, and a few steps at full rate made a small data set's draft worse.
    warmup = max(10, steps // 20)
    loop = Loop(model, lr=settings.lr, weight_decay=settings.weight_decay, grad_clip=1.0,
                schedule=lambda s: (s + 1) / warmup if s < warmup else
                0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, steps - warmup))))
    losses: list[float] = []
    started = time.perf_counter()
    with tqdm(total=steps, desc="fine-tune draft", unit="step") as bar:
        def note(step: int, loss: float) -> None:
            losses.append(loss)
            bar.update()
            bar.set_postfix(loss=f"{sum(losses[-10:]) / len(losses[-10:]):.3f}")

        batches = (position_tensors(batch, pad_id, settings.max_len, device)
                   for batch in _batches(examples, settings.batch_size, settings.seed, settings.epochs))
        loop.run(batches, lambda t: top_kl(answer_logits(model, t), t), range(steps), on_step=note)
    head = losses[:max(1, len(losses) // 10)]
    tail = losses[-max(1, len(losses) // 10):]
    return TrainStats(steps, round(time.perf_counter() - started, 1), round(sum(head) / len(head), 4),
                      round(sum(tail) / len(tail), 4))


def evaluate(model: Any, examples: Sequence[Example], pad_id: int, device: str = "cpu",
             max_len: int = 1024) -> Offline:
    """Teacher-forced on the target's continuations: how often the draft's argmax is the target's
    token (greedy acceptance, position by position) and the loss the training minimises."""
    import torch

    agree = total = 0
    loss_sum = 0.0
    with torch.inference_mode():
        for i in range(0, len(examples), 16):
            t = position_tensors(list(examples[i:i + 16]), pad_id, max_len, device)
            picked = answer_logits(model, t).float()
            # ids[:, 0]: the target's most likely token (its sorted top list's first; the generated
            # token where none came back), which greedy decoding generates.
            agree += (picked.argmax(-1) == t.ids[:, 0]).sum().item()
            total += len(picked)
            loss_sum += top_kl(picked, t).item() * len(picked)
    return Offline(agree / total if total else 0.0, loss_sum / total if total else 0.0, total)


def save_draft(model: Any, source: str | Path, out: Path) -> Path:
    """The trained draft in the source's dtype, with the source's tokenizer files: a folder vLLM loads."""
    import torch
    from transformers import AutoTokenizer

    declared = json.loads((Path(source) / "config.json").read_text())
    name = declared.get("dtype") or declared.get("torch_dtype")  # transformers renamed the key
    dtype = getattr(torch, name, torch.float32) if isinstance(name, str) else torch.float32
    out.mkdir(parents=True, exist_ok=True)
    model.to(dtype).save_pretrained(out)
    AutoTokenizer.from_pretrained(str(source)).save_pretrained(out)
    return out
