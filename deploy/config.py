"""The deployment config: one YAML file per deployment, validated into typed sections.

Reading a file gives a `DeploymentConfig` or a `ConfigError` that lists every problem with
the path of the field at fault (and, for an unknown key, the nearest valid one). Nothing
here touches models, GPUs or vLLM: checks that look at the machine live in `preflight.py`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from plugins.drafters import DRAFTERS
from deploy.vllm_args import known_args, speculative_config_fields

CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_CONFIG = "default.yaml"

DrafterKind = Literal[tuple(DRAFTERS)]  # type: ignore[valid-type]  # the registry's names, in its order
BIGRAM_DEFAULTS = DRAFTERS["bigram"].options


class ConfigError(ValueError):
    """A config that cannot be used; the message says what is wrong and how to fix it."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid config {source}:\n{lines}")


class Section(BaseModel):
    # Unknown keys are errors, not silently ignored settings; .inf and .nan are not numbers here.
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True,
                              allow_inf_nan=False)


class TargetConfig(Section):
    model: str
    """The served model: a local folder with config.json, a hub id (`org/name`), or
    `embedded:target` for the small pair built locally by `make models`."""
    tokenizer: str | None = None
    """Tokenizer folder or hub id when it differs from `model`."""
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    """Weight and activation dtype. `auto` on a GPU: the checkpoint's (vLLM's rule); on a CPU:
    bfloat16 where the CPU has bf16 arithmetic (AVX-512 BF16, AMX), float32 elsewhere."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Longest prompt + output in tokens; smaller values need less KV cache."""
    quantization: str | None = None
    """vLLM quantization method (`awq`, `gptq`, `fp8`, ...) or none."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) for hub ids."""
    trust_remote_code: bool = False
    """Allow model code shipped with a hub checkpoint to run."""


class BigramOptions(Section):
    """Options of specdeploy's bigram drafter (`plugins/`)."""

    table: str | None = None
    """Bigram table file (.npz) built for the target's tokenizer by `python -m models.bigram_tables
    --tokenizer MODEL_DIR --out FILE TEXT_FILES...` (a relative path is taken from the working
    directory); default: the table of the embedded pair's corpus (built on first use)."""
    context_weight: float = Field(default=BIGRAM_DEFAULTS["context_weight"], ge=0)
    """Weight of counts from the request's own context against the corpus table (0 = table only)."""
    min_probability: float = Field(default=BIGRAM_DEFAULTS["min_probability"], ge=0, le=1)
    """A draft chain stops before a successor whose probability is below this."""
    max_batch_size: int = Field(default=BIGRAM_DEFAULTS["max_batch_size"], ge=0)
    """Above this many running requests the drafter proposes nothing (0 = never stops)."""


class SpeculationConfig(Section):
    drafter: DrafterKind = "none"
    """Who proposes draft tokens: `none` (plain decoding), `small_model` (a smaller model with the
    target's tokenizer), `bigram` (specdeploy's plugin), or one of vLLM's methods `ngram`, `suffix`,
    `eagle`, `eagle3`, `mtp`, `medusa`, `mlp_speculator`. `probe` is for measuring, not serving: it
    drafts K tokens the target rejects, so each step costs a full verification of K + 1 tokens."""
    model: str | None = None
    """Draft checkpoint (folder, hub id or `embedded:draft`) for small_model, eagle, eagle3, medusa
    and mlp_speculator."""
    implementation: Literal["native", "plugin"] = "native"
    """For small_model: vLLM's own draft-model path (`native`) or specdeploy's plugin (`plugin`)."""
    num_speculative_tokens: int = Field(default=4, ge=1, le=32)
    """K: draft tokens proposed per step and verified in one target forward pass."""
    schedule: list[tuple[int, int, int]] | None = None
    """Optional K by running batch size: `[[min_batch, max_batch, K], ...]`, inclusive ranges
    (`make tune` writes one); vLLM's `num_speculative_tokens_per_batch_size`, which the plugin
    drafters honour themselves (vLLM gives custom proposers no schedule). The running batch size
    counts prefilling requests too, as vLLM's scheduler does."""
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1)
    """Tensor parallelism of the draft model (default: the target's). vLLM 0.32 takes 1 or the
    target's `tensor_parallel_size`, and its draft-model path (`small_model`, native) only the
    target's (`vllm/v1/spec_decode/draft_model.py`: ranks would share one compile cache)."""
    prompt_lookup_min: int | None = Field(default=None, ge=1)
    """ngram: shortest n-gram matched in the prompt."""
    prompt_lookup_max: int | None = Field(default=None, ge=1)
    """ngram: longest n-gram matched in the prompt."""
    draft_sampling: Literal["greedy", "probabilistic"] = "greedy"
    """How the drafter picks its tokens for sampled requests; the output keeps the target's
    distribution either way, only acceptance differs. `greedy`: the draft's argmax, which at
    temperature > 0 survives only with the target's probability of that one token. `probabilistic`:
    sampled from the drafter's distribution at the request's temperature, top-k and top-p, and
    verified against it, far more often accepted at T > 0 (docs/results.md, R12), at the cost
    of keeping the draft's probabilities (K x vocabulary floats per request). vLLM's
    `draft_sample_method` for its draft-model drafters (small_model native, eagle, eagle3, mtp);
    specdeploy's plugins (small_model plugin, bigram) sample themselves and hand vLLM their
    probabilities (docs/custom-proposer-probabilities.md). Greedy requests draft greedily either way."""
    temperatures: list[float] = Field(default_factory=lambda: [0.0], min_length=1)
    """The sampling temperatures this deployment's users send, which its drafting was chosen for;
    `make loadtest ... LOADTEST_ARGS='--temperature 0,0.7,1'` measures acceptance at each."""
    draft_max_temperature: float | None = Field(default=None, ge=0)
    """Plugin drafters only (bigram, small_model with implementation: plugin): draft just for
    requests whose temperature is at most this; the others decode as on a plain server and cost the
    drafter nothing. For temperatures where a drafter does not pay: with greedy drafts any T > 0
    (rarely accepted there, docs/results.md, R12), with sampled drafts the temperatures above those
    measured (docs/drafters.md). `make tune` writes the largest of `temperatures` here, so a
    tuned plugin config speculates only at the temperatures it was tuned for. None: every request
    drafts."""
    bigram: BigramOptions = Field(default_factory=BigramOptions)
    """Options of the bigram drafter."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Further fields of vLLM's speculative_config, checked against its field list."""

    @property
    def enabled(self) -> bool:
        return self.drafter != "none"

    @field_validator("schedule")
    @classmethod
    def _check_schedule(cls, schedule: list[tuple[int, int, int]] | None) -> list[tuple[int, int, int]] | None:
        if not schedule:
            return schedule
        previous_end = 0
        for start, end, k in sorted(schedule):
            if start < 1 or end < start:
                raise ValueError(f"range [{start}, {end}] must satisfy 1 <= min_batch <= max_batch")
            if start <= previous_end:
                raise ValueError(f"range [{start}, {end}] overlaps the range before it")
            if k < 0:
                raise ValueError(f"K must be >= 0 in [{start}, {end}, {k}]")
            previous_end = end
        return sorted(schedule)

    @field_validator("extra")
    @classmethod
    def _check_extra(cls, extra: dict[str, Any]) -> dict[str, Any]:
        for key in extra:
            if key in OWNED_SPECULATIVE_FIELDS:
                raise ValueError(f"'{key}' is set by the typed fields of `speculation`, not in `extra`")
            if key not in speculative_config_fields():
                raise ValueError(unknown_key_message(key, speculative_config_fields(), "vLLM's speculative_config"))
        return extra

    @model_validator(mode="after")
    def _check_drafter(self) -> SpeculationConfig:
        if not self.enabled:
            return self
        drafter = DRAFTERS[self.drafter]
        if drafter.takes_model and not self.model:
            raise ValueError(f"drafter '{self.drafter}' needs a draft checkpoint: set speculation.model")
        if not drafter.takes_model and self.model:
            raise ValueError(f"drafter '{self.drafter}' takes no draft model; remove speculation.model "
                             f"or use drafter: small_model")
        if self.implementation == "plugin" and not drafter.has_implementations:
            both = [d.name for d in DRAFTERS.values() if d.has_implementations]
            raise ValueError(f"implementation: plugin applies to drafter {', '.join(both)} only")
        if self.schedule and max(k for _, _, k in self.schedule) > self.num_speculative_tokens:
            raise ValueError("a schedule's K cannot exceed num_speculative_tokens")
        if self.draft_max_temperature is not None and not self.plugin_class:
            raise ValueError(
                f"draft_max_temperature applies to specdeploy's plugin drafters (bigram, small_model with "
                f"implementation: plugin), not {self.drafter}{' (native)' if drafter.has_implementations else ''}: "
                f"vLLM drafts for every request of its own drafters; remove draft_max_temperature")
        if (self.prompt_lookup_min or self.prompt_lookup_max) and self.drafter != "ngram":
            raise ValueError("prompt_lookup_min/max apply to drafter ngram only")
        if self.prompt_lookup_min and self.prompt_lookup_max and self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("prompt_lookup_min must be <= prompt_lookup_max")
        if self.draft_sampling == "probabilistic" and not self.samples_drafts:
            raise ValueError(
                f"draft_sampling: probabilistic needs a drafter that samples from a draft distribution "
                f"({', '.join(sorted(d.name for d in DRAFTERS.values() if d.samples_drafts))}), not "
                f"{self.drafter}, whose drafts are deterministic: remove draft_sampling")
        return self

    @field_validator("temperatures")
    @classmethod
    def _check_temperatures(cls, temperatures: list[float]) -> list[float]:
        if any(t < 0 for t in temperatures):
            raise ValueError("temperatures must be >= 0 (0 is greedy decoding)")
        return sorted(set(temperatures))

    def k_at_batch(self, batch: int) -> int:
        """K a step gets at this running batch size, read as vLLM reads the schedule
        (`build_dynamic_sd_schedule_lookup`): a gap between ranges and the sizes past the last
        range keep the K before them, and no K exceeds num_speculative_tokens."""
        k = self.num_speculative_tokens
        if not self.enabled:
            return 0
        last = k
        for start, end, range_k in self.schedule or []:
            if batch < start:
                break
            last = range_k
            if batch <= end:
                break
        return min(k, last)

    @property
    def samples_drafts(self) -> bool:
        """Whether this drafter can draw its drafts from a distribution vLLM then verifies against."""
        return DRAFTERS[self.drafter].samples_drafts

    @property
    def plugin_class(self) -> str | None:
        """specdeploy's proposer that vLLM loads for this drafter (`method: custom_class`), None when
        vLLM drafts itself."""
        return DRAFTERS[self.drafter].plugin(self.implementation) if self.enabled else None

    def sampling_advice(self) -> str | None:
        """Why this drafter will accept little at the config's temperatures > 0, and what to do."""
        # Requests above draft_max_temperature draft nothing, so their acceptance does not matter.
        hot = [t for t in self.temperatures
               if t > 0 and (self.draft_max_temperature is None or t <= self.draft_max_temperature)]
        if not self.enabled or not hot or self.draft_sampling == "probabilistic":
            return None
        listed = ", ".join(f"{t:g}" for t in hot)
        at = f"at temperature {listed}" if len(hot) == 1 else f"at temperatures {listed}"
        if self.samples_drafts:
            return (f"speculation.temperatures: {at} greedy drafts survive only with the target's probability of "
                    f"the draft's argmax (docs/drafters.md); set speculation.draft_sampling: probabilistic")
        return None


class ParallelismConfig(Section):
    tensor_parallel_size: int = Field(default=1, ge=1)
    """GPUs that split each layer (vLLM tensor parallelism); usually the GPUs of one node."""
    pipeline_parallel_size: int = Field(default=1, ge=1)
    """Stages that split the layers; with nodes > 1, usually the number of nodes."""
    data_parallel_size: int = Field(default=1, ge=1)
    """Independent engine replicas behind one server."""
    distributed_executor_backend: Literal["mp", "ray", "uni"] | None = None
    """`mp`: vLLM's own worker processes, on one node or on each of `nodes` (vLLM's `--nnodes`);
    `ray`: a Ray cluster started beforehand (GPUs only); None: vLLM's default (`mp`)."""
    nodes: int = Field(default=1, ge=1)
    """Machines the deployment spans. With `mp` every node runs `make serve NODE_RANK=r` (node 0
    serves the API, the others run headless workers); with `ray` only the head node does."""
    master_addr: str | None = None
    """With nodes > 1 and `mp`: the address of node 0 that the other nodes reach (`--master-addr`).
    Needed to serve; Kubernetes manifests take the leader pod's address instead."""
    master_port: int = Field(default=29501, ge=1, le=65535)
    """With nodes > 1 and `mp`: the torch.distributed port on node 0 (`--master-port`)."""

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    @property
    def multi_node_mp(self) -> bool:
        """Several nodes joined by vLLM's own launcher (`--nnodes`, `--node-rank`, `--headless`)."""
        return self.nodes > 1 and self.distributed_executor_backend in (None, "mp")

    @model_validator(mode="after")
    def _check_nodes(self) -> ParallelismConfig:
        if self.nodes > 1 and self.distributed_executor_backend == "uni":
            raise ValueError("nodes > 1 needs distributed_executor_backend mp (vLLM's --nnodes) or ray")
        if self.world_size % self.nodes:
            raise ValueError(f"tensor x pipeline x data parallel = {self.world_size} GPUs does not split "
                             f"evenly over {self.nodes} nodes")
        return self


class ServerConfig(Section):
    host: str = "127.0.0.1"
    """Address to listen on; loopback by default, `0.0.0.0` to accept remote clients."""
    port: int = Field(default=8000, ge=1, le=65535)
    """TCP port of the OpenAI-compatible API."""
    served_model_name: str | None = None
    """Model name clients send; default: the config's `name`."""
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Name of the environment variable that holds the API key (the key itself never goes in a file)."""
    startup_timeout_s: float = Field(default=900, gt=0)
    """How long to wait for the server to report healthy."""
    keep_alive_timeout_s: int = Field(default=65, ge=1)
    """Seconds an idle HTTP connection stays open (VLLM_HTTP_TIMEOUT_KEEP_ALIVE). Longer than a
    load balancer's idle timeout (60 s on common cloud ones), so the server never closes a
    connection a client is about to reuse: with vLLM's default of 5 s, a busy API server that
    reads a reused connection late drops the request unanswered."""
    public_metrics: bool = False
    """With an API key: `/metrics` answers without it too (for a Prometheus that cannot send one).
    Every other route but `/health` wants the key (`plugins/auth.py`), not only vLLM's `/v1`."""
    allow_unauthenticated: bool = False
    """Listen on a non-loopback address without an API key. Refused unless set: anyone who can
    reach the port could use the model, tokenize, and read the metrics."""

    @model_validator(mode="after")
    def _check_exposure(self) -> ServerConfig:
        if not (self.api_key_env or self.allow_unauthenticated or is_loopback(self.host)):
            raise ValueError(
                f"host '{self.host}' accepts remote clients but no API key is set: set server.api_key_env to "
                f"the name of an environment variable holding a key, or server.allow_unauthenticated: true "
                f"to serve anyone who can reach the port")
        return self


def _finite(value: Any) -> bool:
    """No inf/NaN anywhere inside (YAML's .inf and .nan would reach vLLM as 'inf' and 'nan')."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (`""` and `::` mean every interface)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


class ResourcesConfig(Section):
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """`auto` uses NVIDIA GPUs when present, else the CPU."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """Fraction of each GPU's memory vLLM may use (weights + KV cache)."""
    cpu_kvcache_space_gib: float = Field(default=2, gt=0)
    """KV cache size on CPU in GiB, passed as vLLM's `--kv-cache-memory-bytes` (exact; vLLM's older
    `VLLM_CPU_KVCACHE_SPACE` sets the same field in whole GiB only); fractions allowed."""
    max_num_seqs: int | None = Field(default=None, ge=1)
    """Most requests decoded together (the largest batch)."""
    price_per_gpu_hour: float | None = Field(default=None, gt=0)
    """What one GPU costs an hour, in your currency: load-test reports then give each variant's
    GPU-hours and its cost per million output tokens at each batch size."""
    cpu_preload_iomp: bool = True
    """On CPU, preload Intel OpenMP (vLLM recommends it, and warns without it with speculation)."""
    cpu_start: Literal["fork", "spawn"] = "fork"
    """On CPU, how vLLM starts its engine-core and worker processes. `fork`: as copies of the API
    server, as vLLM does on GPUs (plugins/cpu_start.py); `spawn`: vLLM's CPU default, where each
    engine process imports vLLM and torch anew, so a server is slower to start."""


class TrafficConfig(Section):
    """The traffic this deployment's model is measured with: `make loadtest`, `capacity`, `advise` and
    `tune` send it unless their options say otherwise (`LOADTEST_ARGS='--workload code'`, ...), and
    their plans and reports say which traffic ran."""

    workload: str = Field(default="code", pattern=r"\S")
    """The prompts: a built-in set (`code`: code completion; `chat`: questions as chat messages;
    `edit`: text to copy or edit; `mixed`) or a JSONL / ShareGPT file (docs/load-tests.md). A chat
    model is measured on chat prompts: code completion is not what it serves."""
    api: Literal["auto", "completions", "chat"] = "auto"
    """The API the prompts go through: `chat` (`/v1/chat/completions`, the model's chat template),
    `completions` (`/v1/completions`, plain text), `auto` (the chat API for chat messages, the
    completions API for plain prompts)."""
    lengths: Literal["fixed", "natural"] = "fixed"
    """How long outputs are. `natural`: each request ends at the model's end of text, at most
    `max_tokens` (what users see). `fixed`: exactly `max_tokens` (vLLM's `ignore_eos`), so both
    variants do equal work; past its answer a chat model writes text drafts predict unusually well,
    so a fixed length can overstate speculation's speedup on chat models."""
    max_tokens: int = Field(default=128, ge=1)
    """Output tokens per request: the length with `lengths: fixed`, the most with `natural`."""
    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature of every request (1 is vLLM's default when a request sets none; 0 is
    greedy). `speculation.temperatures` lists all the temperatures users send;
    `LOADTEST_ARGS='--temperature 0,0.7,1'` measures each."""
    requests_per_user: int = Field(default=8, ge=1)
    """Measured requests per user in each closed-loop run (`--requests` replaces the count) ..."""
    requests_min: int = Field(default=32, ge=1)
    """... and at least this many: a model that decodes slowly here measures fewer, so that a sweep
    stays practical."""

    @property
    def fixed_length(self) -> bool:
        return self.lengths == "fixed"


class DeploymentConfig(Section):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """Short name of the deployment; the default served model name."""
    description: str = ""
    """What this deployment is for."""
    target: TargetConfig
    """The model that answers requests."""
    speculation: SpeculationConfig = Field(default_factory=SpeculationConfig)
    """The drafter and K; `drafter: none` is the baseline."""
    alternatives: dict[str, SpeculationConfig] = Field(default_factory=dict)
    """Other drafters to measure against the same baseline in one sweep (`make loadtest DRAFTERS=all`
    or a list of names), by name: each a whole `speculation` section, whose omitted fields take their
    defaults, not the main drafter's. Serving (`make serve`) uses `speculation` alone."""
    parallelism: ParallelismConfig = Field(default_factory=ParallelismConfig)
    """How the engine spreads over GPUs and nodes."""
    server: ServerConfig = Field(default_factory=ServerConfig)
    """The HTTP server."""
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    """Memory and device."""
    traffic: TrafficConfig = Field(default_factory=TrafficConfig)
    """The requests the load tests send this deployment by default."""
    engine_args: dict[str, Any] = Field(default_factory=dict)
    """Further vLLM server arguments by their Python name (`enforce_eager: true`), checked against
    vLLM's own argument list."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the server process (not those the typed fields own, nor
    ones that load code into it: see REFUSED_ENV)."""

    @field_validator("engine_args")
    @classmethod
    def _check_engine_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        for key, value in args.items():
            if key in OWNED_ENGINE_ARGS:
                raise ValueError(f"'{key}' is a typed field: set {OWNED_ENGINE_ARGS[key]} instead")
            if key in REFUSED_ENGINE_ARGS:
                raise ValueError(f"'{key}' is refused: {REFUSED_ENGINE_ARGS[key]}")
            if key not in known_args():
                raise ValueError(unknown_key_message(key, known_args(), "vLLM's server arguments"))
            if not _finite(value):
                raise ValueError(f"'{key}': {value!r} holds an infinite or NaN number")
            if known_args()[key].kind in ("bool", "store_true") and not isinstance(value, bool):
                raise ValueError(f"'{key}' takes true or false, not {value!r}")
            for item in value if isinstance(value, list) else []:
                if isinstance(item, str) and re.match(r"-+[A-Za-z]", item):
                    # A list becomes separate command-line words: "--host" would be a flag of its own.
                    raise ValueError(f"'{key}': list item {item!r} would reach vLLM as a flag of its own; "
                                     f"set that option by its own key")
        return args

    @field_validator("env")
    @classmethod
    def _check_env(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"'{name}' is not an environment variable name (letters, digits, '_')")
            if name in REFUSED_ENV:
                raise ValueError(f"'{name}' is refused: {REFUSED_ENV[name]}")
        return env

    @field_validator("alternatives")
    @classmethod
    def _check_alternatives(cls, alternatives: dict[str, SpeculationConfig]) -> dict[str, SpeculationConfig]:
        for name, alternative in alternatives.items():
            if not re.fullmatch(ALTERNATIVE_NAME, name) or name in RESERVED_VARIANTS or name.startswith("spec-"):
                raise ValueError(f"alternative '{name}': a name is lower-case letters, digits, '.', '_' and '-', "
                                 f"and not {', '.join(RESERVED_VARIANTS)} nor spec-... (the sweep's own variants)")
            if not alternative.enabled:
                raise ValueError(f"alternative '{name}' drafts nothing (drafter: none): the sweep measures the "
                                 f"baseline anyway; remove it")
        return alternatives

    def alternative_override(self, name: str) -> Override:
        """The override that serves alternative `name` in place of `speculation`: its section as written."""
        return Override(("speculation",), self.alternatives[name].model_dump(exclude_unset=True))

    @model_validator(mode="after")
    def _check_traffic(self) -> DeploymentConfig:
        limit = self.target.max_model_len
        if limit is not None and self.traffic.max_tokens >= limit:
            raise ValueError(f"traffic.max_tokens {self.traffic.max_tokens} leaves no room for a prompt within "
                             f"target.max_model_len {limit}; lower it")
        return self

    @property
    def served_name(self) -> str:
        return self.server.served_model_name or self.name

    def without_speculation(self) -> DeploymentConfig:
        """The same deployment as a baseline: plain decoding, same name plus `-nospec`."""
        return self.model_copy(update={"speculation": SpeculationConfig()}, deep=True)


ALTERNATIVE_NAME = r"[a-z0-9][a-z0-9._-]*"
RESERVED_VARIANTS = ("baseline", "server", "all")
"""Names a sweep gives its own variants (and `--drafters all`), which an alternative cannot take."""


# vLLM arguments that the typed sections own, and where to set them.
OWNED_ENGINE_ARGS = {
    "model": "target.model", "tokenizer": "target.tokenizer", "dtype": "target.dtype",
    "max_model_len": "target.max_model_len", "quantization": "target.quantization",
    "revision": "target.revision", "trust_remote_code": "target.trust_remote_code",
    "speculative_config": "the speculation section", "spec_method": "speculation.drafter",
    "spec_model": "speculation.model", "spec_tokens": "speculation.num_speculative_tokens",
    "tensor_parallel_size": "parallelism.tensor_parallel_size",
    "pipeline_parallel_size": "parallelism.pipeline_parallel_size",
    "data_parallel_size": "parallelism.data_parallel_size",
    "distributed_executor_backend": "parallelism.distributed_executor_backend",
    "host": "server.host", "port": "server.port", "served_model_name": "server.served_model_name",
    "api_key": "server.api_key_env (the name of an environment variable holding the key)",
    "gpu_memory_utilization": "resources.gpu_memory_utilization", "max_num_seqs": "resources.max_num_seqs",
}


# Fields of vLLM's speculative_config that typed `speculation` fields of the same name set, and
# that engine_args.py passes as they are.
SPECULATIVE_FIELDS_AS_IS = ("draft_tensor_parallel_size", "prompt_lookup_min", "prompt_lookup_max")
# Every field of vLLM's speculative_config the typed `speculation` fields set (never `extra`), and which.
OWNED_SPECULATIVE_FIELDS = {
    "method": "speculation.drafter", "model": "speculation.model",
    "num_speculative_tokens": "speculation.num_speculative_tokens",
    "num_speculative_tokens_per_batch_size": "speculation.schedule",
    "draft_sample_method": "speculation.draft_sampling",
    **{name: f"speculation.{name}" for name in SPECULATIVE_FIELDS_AS_IS},
}


# engine_args that would bypass the kit's checks, import code, or put a secret on the command line.
REFUSED_ENGINE_ARGS = {
    "config": "it reads a whole vLLM config file past these checks; put its settings in this config",
    "hf_token": "a token on the command line shows in `ps` and logs; export HF_TOKEN in the environment",
    "middleware": "it imports code into the API server",
    "worker_cls": "it imports code into the engine workers",
    "worker_extension_cls": "it imports code into the engine workers",
    "logits_processors": "it imports code into the engine",
    "tool_parser_plugin": "it imports code into the API server",
    "allowed_local_media_path": "it lets clients read files of the server's machine",
}
# env entries that would switch off authentication, load code, or override a typed field.
REFUSED_ENV = {
    "VLLM_API_KEY": "set server.api_key_env to the name of a variable holding the key",
    "SPECDEPLOY_OPEN_PATHS": "set server.public_metrics",
    "LD_PRELOAD": "it loads code into the server (the kit preloads Intel OpenMP itself: "
                  "resources.cpu_preload_iomp)",
    "LD_LIBRARY_PATH": "it changes which libraries the server loads",
    "LD_AUDIT": "it loads code into the server",
    "PYTHONPATH": "it changes which code the server imports; install packages into the environment instead",
    "PYTHONSTARTUP": "it runs code in the server", "PYTHONHOME": "it changes which Python runs",
    "PYTHONINSPECT": "it leaves an interactive interpreter behind the server",
    "VLLM_CPU_KVCACHE_SPACE": "set resources.cpu_kvcache_space_gib",
    "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "set server.keep_alive_timeout_s",
    "VLLM_TARGET_DEVICE": "set resources.device",
    "CUDA_VISIBLE_DEVICES": "set resources.device, or pick GPUs outside the kit (the kit counts them)",
}


def unknown_key_message(key: str, valid: Any, where: str) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"unknown key '{key}' in {where}{hint}"


def _section_fields(model: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    """Valid keys at `path` inside the config schema (for 'did you mean')."""
    for part in path:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def _describe(error: dict[str, Any]) -> str:
    loc = tuple(error["loc"])
    path = ".".join(str(p) for p in loc) or "(top level)"
    if error["type"] == "extra_forbidden":
        parent, key = loc[:-1], str(loc[-1])
        where = ".".join(str(p) for p in parent) or "the top level"
        if key == "api_key":
            return (f"{path}: API keys are never written in config files; put the key in an environment "
                    f"variable and set server.api_key_env to its name")
        return f"{path}: {unknown_key_message(key, _section_fields(DeploymentConfig, parent), where)}"
    if error["type"] == "missing":
        return f"{path}: required field is missing"
    message = error["msg"].removeprefix("Value error, ")
    given = error.get("input")
    shown = "" if isinstance(given, dict) or given is None else f" (got {given!r})"
    return f"{path}: {message}{shown}"


def parse_config(data: Any, source: str = "<config>") -> DeploymentConfig:
    """Validate a config already read from YAML."""
    if not isinstance(data, dict):
        raise ConfigError(source, [f"the file must hold a mapping of sections, not {type(data).__name__}"])
    try:
        return DeploymentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, [_describe(e) for e in exc.errors()]) from None


def resolve_config_path(name_or_path: str | Path) -> Path:
    """A path as given, or a bare name (`llama70b-7b`, `llama70b-7b.yaml`) under `configs/`."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    for candidate in (CONFIGS_DIR / path.name, CONFIGS_DIR / f"{path.name}.yaml"):
        if len(path.parts) == 1 and candidate.is_file():
            return candidate
    presets = ", ".join(sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml")))
    raise ConfigError(str(name_or_path), [f"no such config file; presets in {CONFIGS_DIR}: {presets}"])


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error: plain YAML keeps
    the last one silently, so half of a section written twice would be lost unseen."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"'{key}' appears twice in one mapping (lines {seen[key].start_mark.line + 1} "
                    f"and {key_node.start_mark.line + 1}); keep one", key_node.start_mark)
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: what is wrong and where (PyYAML's own message spans several, with a caret)."""
    problem = getattr(exc, "problem", None) or str(exc)
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return " ".join(f"{problem}{where}".split())


@dataclasses.dataclass(frozen=True)
class Override:
    """One config field set from outside the file: `--set section.field=value` on a command line
    (the Makefile's `SET=`), or a variant's change made in code. Parsed once, where it enters
    (`Override.parse`), then carried as data and applied to the file's data before validation."""

    path: tuple[str, ...]
    """The field's keys, section first: ("speculation", "num_speculative_tokens"); given as a
    dotted string ("speculation.num_speculative_tokens"), it is split."""
    value: Any
    """The field's new value, as YAML reads it (None: YAML's null, or nothing after `=`)."""
    text: str = dataclasses.field(default="", compare=False, repr=False)
    """How it was written (`parse`'s text), which `str()` gives back byte for byte; empty for an
    override made in code, which `str()` writes as `path=value`."""

    def __post_init__(self) -> None:
        if isinstance(self.path, str):
            object.__setattr__(self, "path", tuple(k for k in self.path.split(".") if k))

    @classmethod
    def parse(cls, text: str) -> Override:
        """`section.field=value` (the value read as YAML); ConfigError, with the command line's
        wording, for text of another form."""
        if "=" not in text:
            raise ConfigError("--set", [f"'{text}' is not of the form section.field=value"])
        dotted, raw = text.split("=", 1)
        keys = [k for k in dotted.strip().split(".") if k]
        if not keys or not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) for k in keys):
            raise ConfigError("--set", [f"'{dotted}' is not a dotted field path"])
        try:
            value = yaml.load(raw, Loader=_StrictLoader) if raw.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError("--set", [f"'{text}': the value is not YAML ({_yaml_problem(exc)}); quote it: "
                                        f"{dotted}='\"...\"'"]) from None
        return cls(tuple(keys), value, text)

    @property
    def dotted(self) -> str:
        """The field's path as written (before `=`), for messages."""
        return self.text.split("=", 1)[0] if self.text else ".".join(self.path)

    def __str__(self) -> str:
        return self.text or f"{'.'.join(self.path)}={_value_text(self.value)}"


def _value_text(value: Any) -> str:
    """A value as `--set` would take it back: a string as itself where YAML reads it so, anything
    else (and a string YAML would read otherwise: `null`, `4`) in JSON, which YAML reads."""
    if isinstance(value, str):
        try:
            if yaml.safe_load(value) == value:
                return value
        except yaml.YAMLError:
            pass
    return json.dumps(value)


def as_overrides(items: Iterable[Override | str]) -> list[Override]:
    """Overrides as data: texts (`section.field=value`) parsed, overrides kept as they are."""
    return [item if isinstance(item, Override) else Override.parse(item) for item in items]


def overrides_as_text(value: Any) -> Any:
    """`value` with every Override in it (inside lists and tuples too) as its text: how result
    files and people read them."""
    if isinstance(value, Override):
        return str(value)
    if isinstance(value, (list, tuple)):
        return type(value)(overrides_as_text(v) for v in value)
    return value


def apply_override(data: dict[str, Any], override: Override | str) -> None:
    """Set an override's field in raw config data, in place (a `section.field=value` text is
    parsed first)."""
    if isinstance(override, str):
        override = Override.parse(override)
    node = data
    for key in override.path[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError("--set", [f"'{override.dotted}': {key} is not a section"])
        node = child
    # A copy: one override applies to many loads, and what one load does to its data stays there.
    node[override.path[-1]] = copy.deepcopy(override.value)


def load_config(
    name_or_path: str | Path = DEFAULT_CONFIG, overrides: Sequence[Override | str] = (),
    no_speculation: bool = False,
) -> DeploymentConfig:
    """Read, override and validate a config file.

    `overrides` are `Override`s or their `section.field=value` texts (parsed here); `no_speculation`
    turns any drafter off so a preset runs as its own baseline.
    """
    path = resolve_config_path(name_or_path)
    try:
        data = yaml.load(path.read_bytes().decode("utf-8"), Loader=_StrictLoader) or {}
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), [f"not UTF-8 text (byte {exc.start}); save the file as UTF-8"]) from None
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read it: {exc.strerror or exc}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), [f"not valid YAML: {_yaml_problem(exc)}"]) from None
    if isinstance(data, dict):
        for override in overrides:
            apply_override(data, override)
    config = parse_config(data, str(path))
    return config.without_speculation() if no_speculation else config
