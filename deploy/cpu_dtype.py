"""The dtype a server runs on a CPU: `dtype: auto` is bf16 only where the CPU has bf16 arithmetic.

Whether it has is `models.cpu_dtype.native_bf16` (the pair's training and build ask it too): on a
CPU without it, vLLM's bf16 matmuls fall back to torch's, far slower than float32 (docs/results.md, R16).
"""

from __future__ import annotations

from models.cpu_dtype import native_bf16


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
