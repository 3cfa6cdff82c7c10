"""Whether a distillation fits this machine, decided before any work: memory for the draft's
training state, and the time its arithmetic takes at a rate this kind of device sustains."""

from __future__ import annotations

from dataclasses import dataclass

from deploy.preflight import Machine
from loadtest.measurement.serial import Serial

TRAIN_BYTES_PER_PARAM = 16
"""fp32 weights (4) + gradients (4) + AdamW's two moments (8); activations come on top."""
FLOPS_PER_PARAM_TOKEN = 6
"""Forward (2) and backward (4) multiply-adds per parameter and token."""
SUSTAINED_FLOPS = {"cpu": 2e10, "cuda": 5e13}
"""Per CPU core / per GPU, training in fp32 (CPU) or mixed precision (GPU): rough, on the safe side."""


@dataclass
class Needs(Serial):
    memory_gib: float
    minutes: float
    device: str


def needs(params: float, tokens: int, epochs: int, device: str, cores: int) -> Needs:
    memory = params * TRAIN_BYTES_PER_PARAM * 1.25 / 2**30  # a quarter more for activations
    rate = SUSTAINED_FLOPS[device] * (cores if device == "cpu" else 1)
    return Needs(memory, FLOPS_PER_PARAM_TOKEN * params * tokens * epochs / rate / 60, device)


def fit_problems(params: float, tokens: int, epochs: int, machine: Machine, max_minutes: float) -> tuple[Needs, list[str]]:
    """What fine-tuning needs here, and why it would not fit (empty: it fits)."""
    device = "cuda" if machine.gpus else "cpu"
    need = needs(params, tokens, epochs, device, max(1, len(machine.cpu_ids)))
    have = machine.gpu_memory_gib if device == "cuda" else 0.7 * machine.host_memory_gib
    problems = []
    gpu_need = needs(params, tokens, epochs, "cuda", 1)
    where = (f"run the same command on a machine with a GPU of at least {gpu_need.memory_gib:.0f} GiB "
             f"(about {gpu_need.minutes:.0f} min there)")
    if need.memory_gib > have:
        problems.append(f"fine-tuning a {params / 1e9:.2f}B-parameter draft needs about {need.memory_gib:.1f} GiB "
                        f"(fp32 weights, gradients and AdamW state) and this machine's {device} has "
                        f"{have:.1f} GiB to give: {where}, or distil a smaller draft")
    elif need.minutes > max_minutes:
        problems.append(f"fine-tuning a {params / 1e6:.1f}M-parameter draft on {tokens:,} tokens x {epochs} epochs "
                        f"would take about {need.minutes:.0f} min on this machine's {device} (limit "
                        f"--max-minutes {max_minutes:g}): {where}, or give fewer prompts or tokens")
    return need, problems
