"""Which floating-point type a CPU computes fast: bf16 only where the CPU has bf16 instructions.

x86 CPUs without AVX-512 BF16 or AMX (AVX2-only machines, many AMD EPYCs before Zen 4) have no
bf16 arithmetic: oneDNN refuses a bf16 matmul there, so vLLM falls back to torch's, far slower
than float32 on such a machine (docs/results.md, R16).
On them the kit trains in float32 and serves `dtype: auto` as float32 (`deploy.cpu_dtype`).
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
