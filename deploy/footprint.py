"""What a deployment's first start costs before vLLM serves anything: the weights it downloads (how
much, to where, for how long against `server.startup_timeout_s`) and, on GPUs, what the vLLM 0.32
wheel needs of them. Shown in the dry runs' plans and by `make check`; docs/scaling.md has the
same per preset.
"""

from __future__ import annotations

from deploy.preflight import DTYPE_BYTES, QUANT_BYTES, ModelInfo, ResolvedDeployment, hub_cache_folder

LINK_GBIT_S = (1.0, 10.0)
"""Download speeds the first start is shown at: a common office link, a data centre's."""
LOAD_S = (120.0, 1.0)
"""A GPU start besides the download: fixed seconds (engine, compiling, CUDA graphs) plus seconds per GB
loaded, the load-test plan's assumption (loadtest/sweeps/plan.py ASSUMED_START)."""
HEADS = ("eagle", "eagle3", "medusa", "mlp_speculator", "mtp")
"""Drafters whose checkpoint is a small head: a size in its name is its target's, not its own."""
GPU_NEEDS = ("vLLM 0.32 on GPUs (make venv: pip install vllm==0.32.0): NVIDIA GPUs of compute capability 7.5 or "
             "higher (T4, A10, L4, A100, H100, B200), a driver for the CUDA 13.0 build of torch 2.13 it pins "
             "(R580 or newer: nvidia-smi shows CUDA Version 13.0 or higher), Linux x86-64, Python 3.11")


START_SLACK = 1.5
"""What a timeout for a first start allows beyond its estimate (`first_start_s`)."""


def first_start_s(gb: float, link_gbit_s: float = LINK_GBIT_S[0]) -> float:
    """Seconds a GPU server's first start takes with `gb` GB of weights to download at `link_gbit_s`:
    the download, then loading and compiling (`LOAD_S`)."""
    return gb * 8 / link_gbit_s + LOAD_S[0] + LOAD_S[1] * gb


def cache_dir() -> str:
    """Where hub downloads go (huggingface_hub's cache: HF_HUB_CACHE, else HF_HOME/hub)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _gb(info: ModelInfo, resolved: ResolvedDeployment, head: bool) -> float | None:
    """Bytes on disk, in GB, of a hub checkpoint (its parameters at the served width)."""
    if info.params is None or (head and info.hf_config is None):
        return None
    config = resolved.config
    width = QUANT_BYTES.get(config.target.quantization or "", DTYPE_BYTES.get(config.target.dtype, 2))
    return info.params * width / 1e9


def _time(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def first_start_lines(resolved: ResolvedDeployment) -> list[str]:
    """The weights a first start downloads and what that means for start-up; on GPUs, what the
    wheel needs. Empty for a deployment whose models are all folders on this machine."""
    spec = resolved.config.speculation
    models = [(resolved.target, False)]
    if resolved.draft is not None and spec.enabled:
        models.append((resolved.draft, spec.drafter in HEADS))
    hub = [(m, head) for m, head in models if not m.local]
    lines: list[str] = []
    if hub:
        parts, total, unknown, cached = [], 0.0, False, []
        for info, head in hub:
            gb = _gb(info, resolved, head)
            if hub_cache_folder(info.path, resolved.config.target.revision if info is resolved.target else None):
                cached.append(info.path)
            if gb is None:
                unknown = True
                parts.append(f"{info.path} " + ("(a draft head, under 1 GB)" if head else "(size unknown)"))
            else:
                total += gb
                parts.append(f"{info.path} about {gb:.0f} GB" if gb >= 1 else f"{info.path} about {gb:.1f} GB")
        where = f"downloaded on the first start into the Hugging Face cache {cache_dir()} (HF_HOME or HF_HUB_CACHE moves it)"
        have = (" (in the cache already: " + ", ".join(cached) + ")") if cached else ""
        lines.append(f"weights: {'; '.join(parts)}: {'over' if unknown else 'about'} {total:.0f} GB of disk, "
                     f"{where}{have}")
        if total and len(cached) < len(hub):
            load_s = LOAD_S[0] + LOAD_S[1] * total
            times = ", ".join(f"{_time(total * 8 / speed)} at {speed:g} Gbit/s "
                              f"({total * 8 / speed / (total * 8 / speed + load_s):.0%} of the start)"
                              for speed in LINK_GBIT_S)
            timeout = resolved.config.server.startup_timeout_s
            slow = first_start_s(total)
            advice = (f"a first start on a slow link outlasts it: download first (`hf download <model>`, "
                      f"HF_TOKEN for gated ones) or raise it "
                      f"(SET='server.startup_timeout_s={round(slow * START_SLACK, -2):.0f}')"
                      if slow > timeout else "enough for a first start at 1 Gbit/s")
            lines.append(f"first start: the download takes {times}, besides about {_time(load_s)} of "
                         f"loading and compiling; "
                         f"server.startup_timeout_s ({timeout:g} s) counts the whole start, download included: {advice}")
    if resolved.config.resources.device == "cuda" or resolved.device == "cuda":
        lines.append(GPU_NEEDS)
        if resolved.config.parallelism.tensor_parallel_size > 2:
            lines.append(f"tensor parallelism over {resolved.config.parallelism.tensor_parallel_size} GPUs exchanges "
                         f"activations at every layer: GPUs joined by NVLink/NVSwitch (as in an 8-GPU HGX node), not "
                         f"PCIe alone")
    return lines
