"""Checks that look at the machine and the model files, before any engine starts.

`preflight(config)` resolves model references (`embedded:*`, folders, hub ids), then checks
two kinds of problem, each saying what is wrong and what would fix it:
- the deployment's own: draft and target share a vocabulary, the parallelism splits the models
  the way vLLM 0.32 can (heads and KV heads over tensor ranks, layers over stages, the draft's
  tensor parallelism, speculation and Ray where the platform has them). Always refused.
- this machine's: enough GPUs, the weights plus KV cache fit, the API key variable is set.
  Refused for a real start; a plan (`plan_only`, what `DRY_RUN=1` and `make check` use) keeps
  them as `machine_problems`, so a laptop can print a GPU cluster's command.
It also reads what the server takes from this machine: the bigram drafter's table (built first
for the embedded pair, checked against the target's tokenizer), the API key's value, the
OpenMP library to preload. The result, a `ResolvedDeployment`, is all that `engine_args.py`
needs to turn it into a vLLM command, without touching files or the environment itself.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.cpu_dtype import served_dtype, slow_dtype_warning
from deploy.config import ConfigError, DeploymentConfig
from plugins.drafters import DRAFTERS

log = logging.getLogger("specdeploy")

EMBEDDED_PREFIX = "embedded:"
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "auto": 2}
QUANT_BYTES = {"awq": 0.5, "gptq": 0.5, "fp8": 1, "bitsandbytes": 0.5, "compressed-tensors": 1}
GIB = 1024**3


@dataclass(frozen=True)
class Machine:
    """What the engine can use here."""

    gpus: int
    gpu_memory_gib: float
    """Memory of one GPU (the smallest, if they differ)."""
    host_memory_gib: float
    cpu_ids: tuple[int, ...] = ()
    """The CPUs this process may run on (its affinity), which CPU tensor/pipeline ranks share."""

    @staticmethod
    def detect() -> Machine:
        gpus, per_gpu = 0, 0.0
        if shutil.which("nvidia-smi"):
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=20, check=True).stdout
                sizes = [float(x) / 1024 for x in out.split() if x.strip()]
                gpus, per_gpu = len(sizes), min(sizes, default=0.0)
            except (subprocess.SubprocessError, ValueError):
                pass
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
        return Machine(gpus, per_gpu, host, tuple(sorted(os.sched_getaffinity(0))))


def cpu_binding(cpu_ids: tuple[int, ...], ranks: int) -> str | None:
    """VLLM_CPU_OMP_THREADS_BIND for `ranks` CPU workers: the CPUs split into as many contiguous
    groups (`0|1` on two cores). vLLM's `auto` gives rank N the N-th NUMA node and reserves a core
    per rank for its scheduler, so on one socket rank 1 gets no CPU at all. None: too few CPUs."""
    if ranks <= 1 or len(cpu_ids) < ranks:
        return None
    size = len(cpu_ids) // ranks
    return "|".join(",".join(map(str, cpu_ids[r * size:(r + 1) * size])) for r in range(ranks))


@dataclass(frozen=True)
class ModelInfo:
    """What is known of a checkpoint before loading it."""

    ref: str
    """As written in the config."""
    path: str
    """What vLLM is given: a local folder or a hub id."""
    local: bool
    hf_config: dict[str, Any] | None
    vocab_size: int | None
    tokenizer_vocab: int | None
    """Size of the tokenizer's vocabulary (tokenizer.json), when it can be read."""
    params: float | None
    """Parameter count: computed from config.json, or read from the name (`70B`) as an estimate."""
    tokens: dict[str, int] | None = field(default=None, repr=False)
    """The tokenizer's token -> id map (tokenizer.json), to compare tokens, not just their count."""


@dataclass
class ResolvedDeployment:
    """A validated config bound to this machine: the input of `engine_args.build_launch_plan`."""

    config: DeploymentConfig
    machine: Machine
    device: str
    """`cuda` or `cpu`."""
    target: ModelInfo
    draft: ModelInfo | None
    notes: list[str] = field(default_factory=list)
    """Estimates and warnings to show the user."""
    machine_problems: list[str] = field(default_factory=list)
    """Why this machine cannot run the plan (only kept for a plan: a real start refuses them)."""
    bigram_table: Path | None = None
    """The bigram drafter's table file, checked against the target's tokenizer (`resolve_table_path`)."""
    api_key: str = field(default="", repr=False)
    """The value of `server.api_key_env` here; empty when unset (only a plan gets that far)."""
    ld_preload: str | None = None
    """LD_PRELOAD for a CPU server: Intel OpenMP ahead of the caller's own (`resources.cpu_preload_iomp`)."""
    weight_bytes: float | None = None
    """Target + draft weights as served (`check_fit`'s estimate); None when the size is unknown."""
    plumbing: bool = False
    """The target is the embedded pair's plumbing target (`SPECDEPLOY_PAIR=plumbing`, the test suite's):
    served eager, as its costs mean nothing and compiling each configuration took most of a start."""


def resolve_model_ref(ref: str, config_dir: Path | None = None) -> str:
    """`embedded:target` -> the built folder; a relative path -> absolute; a hub id as is."""
    if ref.startswith(EMBEDDED_PREFIX):
        which = ref.removeprefix(EMBEDDED_PREFIX)
        if which not in ("target", "draft", "code-target", "code-draft"):
            raise ConfigError(ref, [f"unknown embedded model '{which}': use embedded:target or embedded:draft (the "
                                    f"embedded default), embedded:code-target or embedded:code-draft (the kit's code pair)"])
        from models.embedded_pair import ensure_pair, pair_kind

        if which.startswith("code-"):
            which = which.removeprefix("code-")
        elif pair_kind() == "smollm2":
            from models.smollm2 import BuildError, ensure_pair as ensure_smollm2

            try:
                smol = ensure_smollm2()
            except BuildError as exc:
                raise ConfigError(ref, [f"{ref}: {exc}"]) from None
            return str(smol.target if which == "target" else smol.draft)
        pair = ensure_pair()
        return str(pair.served_target() if which == "target" else pair.draft)
    if looks_like_path(ref):
        path = Path(ref).expanduser()
        if not path.is_absolute() and config_dir is not None and not path.exists():
            path = config_dir / path
        return str(path.resolve())
    return ref


def looks_like_path(ref: str) -> bool:
    return ref.startswith(("/", "./", "../", "~")) or Path(ref).expanduser().exists() or ref.count("/") != 1


def inspect_model(ref: str, path: str, field_name: str, revision: str | None = None) -> ModelInfo:
    """Read config.json and tokenizer size of a local folder (or of a hub id's local cache)."""
    local = looks_like_path(path)
    folder: Path | None = Path(path) if local else hub_cache_folder(path, revision)
    if local:
        if not Path(path).is_dir():
            raise ConfigError(field_name, [
                f"{field_name}: model folder {path} does not exist. Fix: point {field_name} at a folder "
                f"holding config.json and weights, or use a hub id (org/name), or `embedded:target`/"
                f"`embedded:draft` for the locally built pair (`make models`)"])
        if not (Path(path) / "config.json").is_file():
            raise ConfigError(field_name, [f"{field_name}: {path} has no config.json; is it a model folder?"])
    # A local folder's files must be sound; a hub cache's are only a hint (the hub has the truth).
    hf_config = _read_json(folder / "config.json", field_name if local else None) if folder else None
    vocab = hf_config.get("vocab_size") if hf_config else None
    if hf_config and vocab is None:
        vocab = (hf_config.get("text_config") or {}).get("vocab_size")
    if vocab is not None and (not isinstance(vocab, int) or isinstance(vocab, bool) or vocab <= 0):
        raise ConfigError(field_name, [f"{field_name}: {folder}/config.json has vocab_size {vocab!r}, not a "
                                       f"positive integer"])
    tokens = _tokenizer_tokens(folder, field_name if local else None) if folder else None
    return ModelInfo(ref, path, local, hf_config, vocab, max(tokens.values()) + 1 if tokens else None,
                     estimate_params(hf_config, path), tokens)


def hub_cache_folder(hub_id: str, revision: str | None = None) -> Path | None:
    """The cached snapshot folder of a hub id at `revision` (default: the cache's `main`), from
    huggingface_hub's own cache look-up; None when its config.json is not cached. No network."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(hub_id, "config.json", revision=revision)
    except Exception:  # noqa: BLE001 - not a valid hub id: nothing cached under it
        return None
    return Path(found).parent if isinstance(found, str) else None


def _read_json(path: Path, field_name: str | None = None) -> dict[str, Any] | None:
    """The JSON object in `path`; None if absent. Malformed: a ConfigError naming `field_name`,
    or None when no field is given (a cache's file is only a hint)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"holds a {type(data).__name__}, not an object")
        return data
    except (OSError, ValueError) as exc:
        if field_name is None:
            return None
        raise ConfigError(field_name, [f"{field_name}: {path} cannot be read: {str(exc)[:200]}"]) from None


def _tokenizer_tokens(folder: Path, field_name: str | None) -> dict[str, int] | None:
    """token -> id of a folder's tokenizer.json (added tokens included), read by the tokenizers
    library as transformers and vLLM will; None without one."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        tokens = Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
    except Exception as exc:  # noqa: BLE001 - the library raises a bare Exception on bad files
        if field_name is None:
            return None
        raise ConfigError(field_name, [f"{field_name}: {path} is malformed ({str(exc).splitlines()[0][:160]})"]
                          ) from None
    return tokens or None


def estimate_params(hf_config: dict[str, Any] | None, name: str) -> float | None:
    """Parameters of a decoder-only transformer from its config, else from a size in its name."""
    if hf_config and hf_config.get("hidden_size") and hf_config.get("num_hidden_layers"):
        h = hf_config["hidden_size"]
        layers = hf_config["num_hidden_layers"]
        inter = hf_config.get("intermediate_size") or 4 * h
        heads = hf_config.get("num_attention_heads") or 1
        kv_heads = hf_config.get("num_key_value_heads") or heads
        head_dim = hf_config.get("head_dim") or h // heads
        vocab = hf_config.get("vocab_size") or 0
        attn = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2
        mlp = 3 * h * inter
        embed = vocab * h * (1 if hf_config.get("tie_word_embeddings") else 2)
        return float(layers * (attn + mlp + 2 * h) + embed)
    match = re.search(r"(\d+(?:\.\d+)?)\s*([bBmM])(?![a-zA-Z])", Path(name).name)
    if match:
        return float(match.group(1)) * (1e9 if match.group(2) in "bB" else 1e6)
    return None


def kv_bytes_per_token(hf_config: dict[str, Any] | None, dtype_bytes: float) -> float | None:
    if not hf_config or not hf_config.get("num_hidden_layers"):
        return None
    heads = hf_config.get("num_attention_heads") or 1
    kv_heads = hf_config.get("num_key_value_heads") or heads
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // heads
    return 2 * hf_config["num_hidden_layers"] * kv_heads * head_dim * dtype_bytes


def _weight_bytes(info: ModelInfo, config: DeploymentConfig, dtype: str) -> float | None:
    if info.params is None:
        return None
    per_param = QUANT_BYTES.get(config.target.quantization or "", DTYPE_BYTES[dtype])
    return info.params * per_param


def check_vocabularies(target: ModelInfo, draft: ModelInfo, drafter: str) -> list[str]:
    """A small-model drafter must speak the target's tokenizer."""
    problems = []
    for what, t, d in (("config vocab_size", target.vocab_size, draft.vocab_size),
                       ("tokenizer vocabulary", target.tokenizer_vocab, draft.tokenizer_vocab)):
        if t is not None and d is not None and t != d:
            problems.append(
                f"speculation.model: the draft's {what} is {d} but the target's is {t}; drafter "
                f"'{drafter}' needs a draft trained with the target's tokenizer (same model family), "
                f"e.g. a smaller model of the same series")
    if target.tokens and draft.tokens and target.tokenizer_vocab == draft.tokenizer_vocab \
            and target.tokens != draft.tokens:
        differ = sorted(t for t in target.tokens.keys() | draft.tokens.keys()
                        if target.tokens.get(t) != draft.tokens.get(t))
        example = differ[0]
        problems.append(
            f"speculation.model: the draft's tokenizer has as many tokens as the target's but not the same ones: "
            f"{len(differ)} tokens differ (e.g. {example!r}: id {draft.tokens.get(example)} in the draft, "
            f"{target.tokens.get(example)} in the target); drafter '{drafter}' needs the target's own tokenizer")
    if target.params and draft.params and draft.params >= target.params:
        problems.append(f"speculation.model: the draft ({draft.params / 1e6:.1f}M parameters) is not smaller than "
                        f"the target ({target.params / 1e6:.1f}M); speculation would only add cost")
    return problems


def check_fit(resolved: ResolvedDeployment) -> list[str]:
    """Weights (target + draft) and a minimal KV cache against the memory this machine has."""
    config, machine = resolved.config, resolved.machine
    par = config.parallelism
    problems: list[str] = []
    # A draft's size read from its name only counts for small-model drafters: an EAGLE head
    # named after its 8B target is itself a few hundred MB.
    models = [resolved.target]
    if resolved.draft and (resolved.draft.hf_config or config.speculation.drafter == "small_model"):
        models.append(resolved.draft)
    dtype = served_dtype(config.target.dtype, resolved.device)
    weights = sum(w for w in (_weight_bytes(m, config, dtype) for m in models) if w)
    resolved.weight_bytes = weights or None
    if not weights:
        resolved.notes.append("memory check skipped: model size unknown (no local config.json, no size in name)")
        return problems
    dtype_bytes = DTYPE_BYTES[dtype]
    kv_token = kv_bytes_per_token(resolved.target.hf_config, dtype_bytes)
    max_len = config.target.max_model_len or (resolved.target.hf_config or {}).get("max_position_embeddings") or 4096
    kv_min = (kv_token or 0) * max_len  # room for one full-length sequence at least
    need_gib = (weights + kv_min) / GIB
    kv_note = f" + one {max_len}-token sequence of KV cache {kv_min / GIB:.2f} GiB" if kv_token else ""
    source = "config.json" if resolved.target.hf_config else "the size in the model name"
    resolved.notes.append(f"memory estimate (from {source}): weights {weights / GIB:.2f} GiB{kv_note}")
    if resolved.device == "cuda":
        gpus_per_node = par.world_size // par.nodes
        if machine.gpus < gpus_per_node:
            problems.append(
                f"parallelism: this config needs {gpus_per_node} GPUs per node (tensor {par.tensor_parallel_size} "
                f"x pipeline {par.pipeline_parallel_size} x data {par.data_parallel_size} / {par.nodes} nodes) "
                f"but this machine has {machine.gpus}. Fix: run it on a machine with {gpus_per_node} GPUs, or "
                f"lower parallelism.* (and pick a smaller model)")
        usable = machine.gpus and machine.gpu_memory_gib * config.resources.gpu_memory_utilization
        # The model is split over tensor x pipeline GPUs, but only over those that exist.
        model_parallel = min(par.tensor_parallel_size * par.pipeline_parallel_size, machine.gpus)
        if usable and need_gib > usable * model_parallel:
            problems.append(
                f"memory: about {need_gib:.1f} GiB are needed but {model_parallel} x {usable:.1f} GiB of GPU "
                f"memory are usable. Fix: raise tensor_parallel_size, quantize (target.quantization), or "
                f"shorten target.max_model_len")
    else:
        ranks = par.world_size // par.nodes
        if ranks > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in config.env:
            if machine.cpu_ids and len(machine.cpu_ids) < ranks:
                problems.append(f"parallelism: {ranks} CPU ranks need a CPU each, but this process may use "
                                f"{len(machine.cpu_ids)}. Fix: lower tensor/pipeline_parallel_size")
            elif machine.cpu_ids:
                resolved.notes.append(f"CPU: {ranks} ranks bound to CPUs {cpu_binding(machine.cpu_ids, ranks)} "
                                      f"(VLLM_CPU_OMP_THREADS_BIND; env: sets it by hand)")
        available = machine.host_memory_gib - config.resources.cpu_kvcache_space_gib
        if need_gib > available:
            hint = (f"this machine has no NVIDIA GPU; run this preset on GPUs (it is sized for "
                    f"{par.world_size})" if par.world_size > 1 or need_gib > 64 else
                    "use a smaller model or lower resources.cpu_kvcache_space_gib")
            problems.append(
                f"memory: the model needs about {need_gib:.1f} GiB but this machine has {machine.host_memory_gib:.1f} "
                f"GiB of RAM ({config.resources.cpu_kvcache_space_gib:g} GiB reserved for the KV cache). Fix: {hint}")
    return problems


def choose_device(config: DeploymentConfig, machine: Machine) -> tuple[str, list[str]]:
    """The device the engine runs on, and why this machine lacks it (if it does)."""
    if config.resources.device == "auto":
        return ("cuda" if machine.gpus else "cpu"), []
    if config.resources.device == "cuda" and not machine.gpus:
        return "cuda", ["resources.device is cuda but this machine has no NVIDIA GPU (nvidia-smi); run it on "
                        "the GPUs it is meant for, or use device: auto or cpu"]
    return config.resources.device, []


def _split(total: int, ranks: int) -> bool:
    """Whether vLLM can spread `total` KV heads over `ranks` tensor ranks: divided, or replicated
    when there are more ranks than heads (`QKVParallelLinear`)."""
    return total % ranks == 0 if ranks <= total else ranks % total == 0


def check_parallelism(config: DeploymentConfig, target: ModelInfo, draft: ModelInfo | None, device: str,
                      notes: list[str]) -> list[str]:
    """vLLM 0.32's rules for splitting the models, checked before anything starts (vLLM itself
    only finds them after loading for a minute, or, for speculation with pipeline stages on the
    CPU, with an AttributeError)."""
    par, spec = config.parallelism, config.speculation
    tp, pp = par.tensor_parallel_size, par.pipeline_parallel_size
    problems: list[str] = []
    draft_tp = spec.draft_tensor_parallel_size
    if spec.enabled and spec.drafter == "small_model" and spec.implementation == "native":
        if draft_tp is not None and draft_tp != tp:
            problems.append(
                f"speculation.draft_tensor_parallel_size is {draft_tp} but parallelism.tensor_parallel_size is {tp}: "
                f"vLLM 0.32's draft-model path needs them equal (ranks would share the draft's compile cache). "
                f"Fix: remove draft_tensor_parallel_size (it then follows the target) or set it to {tp}")
        draft_tp = tp
    elif spec.enabled and draft_tp is not None and draft_tp not in (1, tp):
        problems.append(f"speculation.draft_tensor_parallel_size is {draft_tp}: vLLM takes 1 or the target's "
                        f"tensor_parallel_size ({tp})")
    splits = [("target.model", target, tp)]
    if spec.enabled and draft is not None and spec.drafter == "small_model":
        splits.append(("speculation.model", draft, draft_tp or tp))
    for name, info, ranks in splits:
        hf = info.hf_config
        if not hf:
            if ranks > 1 or (name == "target.model" and pp > 1):
                notes.append(f"{name}: no config.json on this machine, so how its heads and layers split over "
                             f"{ranks} tensor x {pp} pipeline ranks is checked by vLLM at start-up")
            continue
        heads = hf.get("num_attention_heads") or (hf.get("text_config") or {}).get("num_attention_heads")
        kv = hf.get("num_key_value_heads") or heads
        layers = hf.get("num_hidden_layers") or (hf.get("text_config") or {}).get("num_hidden_layers")
        if heads and heads % ranks:
            fit = [n for n in range(1, heads + 1) if heads % n == 0 and _split(kv, n) and n <= 16]
            problems.append(f"parallelism: {name} has {heads} attention heads, which {ranks} tensor-parallel ranks "
                            f"cannot share evenly (vLLM: 'must be divisible by tensor parallel size'). Fix: a "
                            f"tensor_parallel_size of {', '.join(map(str, fit))}")
        elif heads and kv and not _split(kv, ranks):
            problems.append(f"parallelism: {name} has {kv} KV heads; {ranks} tensor-parallel ranks must divide them "
                            f"or be a multiple of them")
        if name == "target.model" and layers and pp > 1:
            if layers < pp:
                problems.append(f"parallelism: target.model has {layers} layers, fewer than pipeline_parallel_size "
                                f"{pp}: every stage needs one. Fix: pipeline_parallel_size <= {layers}")
            elif layers % pp:
                notes.append(f"{layers} layers over {pp} pipeline stages: vLLM gives the first stages one more "
                             f"(VLLM_PP_LAYER_PARTITION sets the split by hand)")
    if spec.enabled and pp > 1 and device == "cpu":
        problems.append(
            "parallelism: speculation with pipeline_parallel_size > 1 does not run on vLLM 0.32's CPU engine (its "
            "runner has no drafter on the stages; start-up fails with \"'CPUModelRunner' object has no attribute "
            "'drafter'\"). Fix: tensor_parallel_size for two CPU ranks, or pipeline stages without speculation. "
            "On GPUs vLLM drafts on the last stage")
    if par.distributed_executor_backend == "ray" and device == "cpu":
        problems.append("parallelism.distributed_executor_backend: vLLM's CPU platform has no Ray support. "
                        "Fix: mp (one node) or leave it unset")
    return problems


def check_environment(config: DeploymentConfig) -> list[str]:
    """What the server needs from the environment it starts in."""
    name = config.server.api_key_env
    if name and not os.environ.get(name):
        return [f"server.api_key_env names {name}, which is not set in the environment; export {name}=<key> first"]
    return []


def target_tokenizer(resolved: ResolvedDeployment) -> str:
    """Where the target's tokenizer is: `target.tokenizer` if set, else the served model."""
    ref = resolved.config.target.tokenizer
    if ref and looks_like_path(ref):
        return str(Path(ref).expanduser().resolve())
    return ref or resolved.target.path


def resolve_table_path(resolved: ResolvedDeployment) -> Path:
    """The checked table file for a bigram deployment, or `ConfigError` before any engine starts.

    No `speculation.bigram.table` on the embedded pair: its table (built on first use). Otherwise
    the configured file, which must exist, be readable, and match the target's tokenizer.
    """
    # Imported here: only bigram deployments need numpy and the tokenizer code.
    from plugins.bigram_table import BUILD_HINT, BigramTableError, load_table, tokenizer_fingerprint

    name = "speculation.bigram.table"
    configured = resolved.config.speculation.bigram.table
    tokenizer = target_tokenizer(resolved)
    if configured is None:
        if not resolved.config.target.model.startswith(EMBEDDED_PREFIX):
            raise ConfigError(name, [
                f"{name}: not set, and only the embedded pair has a built-in table. Build one for the target's "
                f"tokenizer from text like what it will serve: "
                f"`{BUILD_HINT.format(tokenizer=tokenizer, out='bigram.npz')}`, then set {name}: bigram.npz"])
        from models.bigram_tables import embedded_table

        path = embedded_table(ref=resolved.config.target.model)
    else:
        path = Path(configured).expanduser().resolve()
    try:
        expected = tokenizer_fingerprint(tokenizer, resolved.config.target.revision)
    except BigramTableError as exc:
        # A hub tokenizer not in the local cache: the proposer checks again in the server.
        resolved.notes.append(f"bigram table not checked against the tokenizer here ({exc}); "
                              f"the server checks it at start")
        expected = None
    try:
        load_table(path, expected, tokenizer)
    except BigramTableError as exc:
        raise ConfigError(name, [f"{name}: {exc}"]) from None
    return path


def _iomp_library() -> str | None:
    """Intel OpenMP shipped with vllm-cpu, which vLLM asks to preload on x86 CPUs."""
    lib = Path(sys.prefix) / "lib" / "libiomp5.so"
    return str(lib) if lib.is_file() else None


def ld_preload(config: DeploymentConfig, device: str) -> str | None:
    """LD_PRELOAD for the server: Intel OpenMP first, then whatever this process preloads."""
    iomp = _iomp_library() if device == "cpu" and config.resources.cpu_preload_iomp else None
    return ":".join(p for p in (iomp, os.environ.get("LD_PRELOAD", "")) if p) if iomp else None


def preflight(config: DeploymentConfig, config_dir: Path | None = None, machine: Machine | None = None,
              check_memory: bool = True, plan_only: bool = False, environment: bool = True) -> ResolvedDeployment:
    """Resolve and check a config against this machine; raise `ConfigError` listing every problem.
    `plan_only`: what this machine lacks (GPUs, memory, the API key) goes to `machine_problems`
    instead, and the plan is made for the machine the config describes. `environment`: check
    this process's environment and resolve the bigram table here too (off for manifests: pods
    get the key from a Secret, and the manifests refuse plugin drafters)."""
    machine = machine or Machine.detect()
    device, machine_problems = choose_device(config, machine)
    target_path = resolve_model_ref(config.target.model, config_dir)
    target = inspect_model(config.target.model, target_path, "target.model", config.target.revision)
    draft = None
    spec = config.speculation
    problems: list[str] = []
    notes: list[str] = []
    if spec.enabled and spec.model:
        draft_path = resolve_model_ref(spec.model, config_dir)
        draft = inspect_model(spec.model, draft_path, "speculation.model")
        if spec.drafter == "small_model":
            problems += check_vocabularies(target, draft, spec.drafter)
            if target.vocab_size is None or draft.vocab_size is None:
                notes.append("vocabulary check skipped: a model's config.json is not on this machine "
                             "(vLLM checks it again when it loads the models)")
    if spec.plugin_class and DRAFTERS[spec.drafter].takes_model and not (target.local and draft and draft.local):
        problems.append("speculation.implementation: the small-model plugin loads the draft from a local folder")
    problems += check_parallelism(config, target, draft, device, notes)
    from models.embedded_pair import pair_kind

    plumbing = config.target.model in (f"{EMBEDDED_PREFIX}target", f"{EMBEDDED_PREFIX}code-target") \
        and pair_kind() == "plumbing"
    if plumbing:
        notes.append("embedded:target is the plumbing target (SPECDEPLOY_PAIR=plumbing), served eager: same "
                     "predictions at a fraction of the cost and start-up; for tests of behaviour, never for measurements")
    if advice := spec.sampling_advice():
        notes.append(advice)
    if device == "cpu" and (slow := slow_dtype_warning(config.target.dtype)):
        notes.append(slow)
    api_key = os.environ.get(config.server.api_key_env, "") if config.server.api_key_env else ""
    resolved = ResolvedDeployment(config, machine, device, target, draft, notes, api_key=api_key,
                                  ld_preload=ld_preload(config, device), plumbing=plumbing)
    if check_memory:
        machine_problems += check_fit(resolved)
    if environment:
        machine_problems += check_environment(config)
        if config.parallelism.multi_node_mp and not config.parallelism.master_addr:
            problems.append("parallelism: nodes > 1 with the mp backend needs master_addr, the address of node 0 "
                            "that the other nodes reach (or distributed_executor_backend: ray with a Ray cluster)")
    if plan_only:
        resolved.machine_problems = machine_problems
    else:
        problems += machine_problems
    if problems:
        raise ConfigError(config.name, problems)
    if environment and spec.drafter == "bigram":  # after the checks above: building a table takes a while
        resolved.bigram_table = resolve_table_path(resolved)
    return resolved
