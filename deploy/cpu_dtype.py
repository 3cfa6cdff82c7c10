"""Which floating-point type a CPU computes fast: bf16 only where the CPU has bf16 instructions.

x86 CPUs without AVX-512 BF16 or AMX (AVX2-only machines, many AMD EPYCs before Zen 4) have no
bf16 arithmetic: oneDNN refuses a bf16 matmul there, so vLLM falls back to torch's, which
measured 45x slower than float32 on such a machine (a 1024x1024 matmul, 2.9 s against 65 ms).
On them the kit trains in float32 and serves `dtype: auto` as float32.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path


@functools.lru_cache(maxsize=None)
def native_bf16() -> bool:
    """True when this CPU has bf16 arithmetic (x86 AVX-512 BF16 or AMX BF16, Arm's BF16 extension).

    Read from /proc/cpuinfo where there is one, so that reading a config does not import torch."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        flags = set(re.findall(r"\S+", " ".join(re.findall(r"^(?:flags|Features)\s*:(.*)$", cpuinfo.read_text(),
                                                           re.MULTILINE))))
        return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    import torch

    capabilities = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    return any(capabilities.get(name, False) for name in ("avx512_bf16", "amx_bf16", "bf16"))


def served_dtype(dtype: str, device: str) -> str:
    """The dtype a server on `device` runs for the config's `dtype`: on a CPU, `auto` becomes
    bfloat16 where the CPU computes it and float32 elsewhere; on a GPU `auto` stays vLLM's (the
    checkpoint's). An explicit dtype is kept (preflight warns when a CPU is slow at it)."""
    if dtype != "auto" or device != "cpu":
        return dtype
    return "bfloat16" if native_bf16() else "float32"


def slow_dtype_warning(dtype: str) -> str | None:
    """A line a person can act on when the config asks a CPU for a type it has no arithmetic for."""
    if dtype in ("bfloat16", "float16") and not native_bf16():
        return (f"target.dtype {dtype} on a CPU without bf16 arithmetic (no AVX-512 BF16 or AMX): vLLM falls back "
                f"to torch's emulated matmuls, ~45x slower than float32 here; set target.dtype: auto (float32 on "
                f"this CPU) or float32")
    return None
