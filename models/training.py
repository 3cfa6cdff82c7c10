"""The one AdamW training loop: the embedded pair's training (`models.pair_training`) and distill's
fine-tuning (`distill.train`) both run it, with what differs passed in.

    loop = Loop(model, lr=1e-3, weight_decay=0.01, schedule=lambda step: 1.0)
    loop.run(batches, loss_fn, range(steps), on_step=lambda step, loss: ...)

A step: the loss of a batch (under bf16 autocast where asked), gradients, clipped to a norm, an
AdamW step, a scheduler step. What the caller decides: the parameter groups (all weights decayed,
or matrices only), the learning-rate schedule (a factor of the peak by step), the batches and the
loss, which steps run (a resumed run starts later; a progress bar can be the steps' iterable), and
what happens after each step (logging, a held-out curve, checkpoints). `state_dict` and
`load_state_dict` carry the optimizer and the schedule across a checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Iterable


def progress(iterable: Any = None, **kwargs: Any) -> Any:
    """tqdm on stderr, redrawn every 2 s: the bar of every long step (training, tokenizing, building)."""
    from tqdm import tqdm

    return tqdm(iterable, file=sys.stderr, mininterval=2.0, dynamic_ncols=True, **kwargs)


def autocast(enabled: bool) -> Any:
    """bf16 autocast on the CPU where `enabled`, else a context that changes nothing."""
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


class Loop:
    """AdamW under a learning-rate schedule, with gradient clipping; `run` trains."""

    def __init__(self, model: Any, *, lr: float, weight_decay: float, schedule: Callable[[int], float],
                 betas: tuple[float, float] = (0.9, 0.999), matrices_only: bool = False, grad_clip: float = 1.0,
                 bf16: bool = False):
        """`schedule(step)`: the factor of `lr` at a step (torch's LambdaLR). `matrices_only`: weight
        decay on parameters of 2 or more dimensions only (two parameter groups), else on all (one)."""
        import torch

        self.model, self.grad_clip, self.bf16 = model, grad_clip, bf16
        if matrices_only:
            decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
            no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
            self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                          {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=betas)
        else:
            self.opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=betas)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, schedule)

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's and the schedule's state (a checkpoint's `optimizer` and `scheduler`)."""
        return {"optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])

    def run(self, batches: Iterable[Any], loss_fn: Callable[[Any], Any], steps: Iterable[int],
            on_step: Callable[[int, float], None] | None = None) -> None:
        """One step per item of `steps` (a batch drawn from `batches` for each, none beyond the
        last step), then `on_step(step, loss)`; the model is left in eval mode."""
        import torch

        self.model.train()
        for step, batch in zip(steps, batches):
            with autocast(self.bf16):
                loss = loss_fn(batch)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
            self.opt.step()
            self.sched.step()
            if on_step is not None:
                on_step(step, loss.item())
        self.model.eval()


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
