"""The prompts a draft is distilled on, and the held-out prompts its acceptance is measured on.

A user's file is a load-test workload (JSONL with `prompt` or `messages`, or ShareGPT; see
`loadtest.traffic.workloads`), read and checked by the same code. Chat messages become the plain text
the completions API is sent (the same text both for training and for the measurement). Without
a separate held-out file, every fifth prompt is held out: never trained on, only measured.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from loadtest.files import write_atomic
from loadtest.traffic.workloads import Item, load_workload

HELD_OUT_EVERY = 5
MIN_TRAIN = 8
MIN_HELD_OUT = 2


@dataclass(frozen=True)
class DistillData:
    source: str
    """The data file as given."""
    sha256: str
    train: tuple[str, ...]
    held_out: tuple[str, ...]


def prompt_text(item: Item) -> str:
    if item.prompt is not None:
        return item.prompt
    return "".join(f"{m.get('content', '')}\n" for m in item.messages or ())


def load_data(path: str | Path, held_out: str | Path | None = None) -> DistillData:
    """Train and held-out prompts; a file that cannot be used raises ValueError with the reason."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"data file {path} does not exist (give DATA=prompts.jsonl: one {{\"prompt\": ...}} a line)")
    items = [prompt_text(i) for i in load_workload(str(path)).items]
    prompts = list(dict.fromkeys(p for p in items if p.strip()))  # a repeated prompt teaches nothing new
    if held_out is not None:
        held = list(dict.fromkeys(prompt_text(i) for i in load_workload(str(held_out)).items))
        measured = set(held)
        train = [p for p in prompts if p not in measured]
    else:
        held = prompts[HELD_OUT_EVERY - 1::HELD_OUT_EVERY]
        train = [p for n, p in enumerate(prompts) if n % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
    if len(train) < MIN_TRAIN or len(held) < MIN_HELD_OUT:
        raise ValueError(f"{path}: {len(train)} distinct training and {len(held)} held-out prompts; distillation "
                         f"needs at least {MIN_TRAIN} and {MIN_HELD_OUT} (every {HELD_OUT_EVERY}th prompt is "
                         f"held out unless --held-out gives a file)")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return DistillData(str(path), digest, tuple(train), tuple(held))


def write_prompts(prompts: tuple[str, ...] | list[str], path: Path) -> Path:
    """Prompts as a workload file (what the load test reads)."""
    return write_atomic(path, "".join(json.dumps({"prompt": p}) + "\n" for p in prompts))


def stdlib_test_prompts(path: Path, count: int = 300, chars: int = 400, seed: int = 0) -> Path:
    """A domain the embedded pair never saw: windows of the standard library's own tests
    (`Lib/test`, which its build skips), each starting at a line, as a workload file."""
    root = Path(sysconfig.get_paths()["stdlib"]) / "test"
    files = sorted(p for p in root.glob("test_*.py") if p.stat().st_size > 4 * chars)
    if not files:
        raise ValueError(f"no test files under {root} to make prompts from (Python {sys.version.split()[0]}); "
                         f"give DATA=prompts.jsonl")
    rng = random.Random(seed)
    prompts = []
    for file in rng.sample(files, min(count, len(files))) * (count // len(files) + 1):
        text = file.read_text(encoding="utf-8", errors="replace")
        start = text.find("\n", rng.randrange(0, len(text) - chars)) + 1
        window = text[start:start + chars]
        if window.strip():
            prompts.append(window)
        if len(prompts) == count:
            break
    return write_prompts(prompts, path)
