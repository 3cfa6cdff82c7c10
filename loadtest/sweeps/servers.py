"""A sweep's servers: each variant's server planned from its config (`prepare`), or found already
running at a URL (`running_servers`), what the plan shows of it (`server_info`), its health, its
stop, and its variant's status once the sweep is over. Starting a server is the sweep's
(`Sweep._launch` and `_await`: it keeps the start's time for later plans)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from deploy import ConfigError, Override, Server, free_port, load_config, plan_from_config
from models.embedded_pair import served_pair_built
from deploy.preflight import GIB, Machine, ResolvedDeployment, choose_device
from loadtest.measurement.results import VariantResult
from loadtest.sweeps.plan import ServerInfo, server_key
from loadtest.sweeps.settings import SweepSettings, Variant, is_embedded
from loadtest.traffic.endpoint import EndpointError, RemoteServer, discover

log = logging.getLogger("specdeploy.loadtest")


@dataclass
class Running:
    """A variant's server and what the sweep knows of it."""

    entry: VariantResult
    plan: Any = None
    server: Server | RemoteServer | None = None
    """The sweep's own server while it runs, or a running server given by URL (never stopped here)."""
    served_name: str = ""
    tokenizer: str = ""
    api_key_env: str = ""
    startup_timeout_s: float = 900
    broken: str | None = None
    """Why this variant runs no more levels (failed start, server died)."""
    died: bool = False
    """Its server died after starting: the levels it misses are recorded as skipped."""
    resolved: ResolvedDeployment | None = None
    """Its config bound to this machine, set with `plan` (preflight's weight estimate, the host's memory)."""
    embedded: bool = False
    """It serves the embedded pair: the content check holds its outputs against the pair's held-out code."""
    plan_notes: list[str] = field(default_factory=list)
    """What the plan should say of this server (weights to download, a pair to build)."""
    step_profile: Path | None = None
    """Where its engine writes its step timers (`plugins.step_profile`), when the sweep started it
    and its steps run in one process (a CPU or a single GPU)."""


def prepare(settings: SweepSettings, variant: Variant, plan_only: bool = False) -> tuple[Running, ServerInfo | None]:
    """The variant's server planned (`plan_only`: for the machine its config describes, as a dry
    run shows it; the embedded pair is not built for it), and what the plan shows of it (None
    where its config failed: the state says why). Its log's path is relative to the sweep's folder."""
    entry = VariantResult(name=variant.name, label=variant.label, k=variant.k, drafter=variant.drafter)
    state = Running(entry)
    overrides = [*settings.overrides, *variant.overrides, Override("server.port", free_port())]
    try:
        config = load_config(settings.config, overrides, variant.no_speculation)
        model = str(config.target.model)
        if plan_only and model.startswith("embedded:") and not served_pair_built(model):
            state.plan_notes.append("the embedded pair is not built yet: the sweep builds it first (`make models`, "
                                    "about a minute), so its weights' size is not known here")
            return state, server_info(settings, variant, config, None)
        resolved, plan = plan_from_config(settings.config, overrides, variant.no_speculation, plan_only=plan_only)
    except (ConfigError, OSError, ValueError) as exc:
        entry.status, entry.error = "failed", f"config: {exc}"
        state.broken = entry.error
        return state, None
    cfg = resolved.config
    state = Running(entry, plan, served_name=plan.served_name, resolved=resolved, embedded=is_embedded(cfg),
                    tokenizer=cfg.target.tokenizer or resolved.target.path, api_key_env=cfg.server.api_key_env or "",
                    startup_timeout_s=settings.startup_timeout_s or cfg.server.startup_timeout_s)
    server_log = Path("logs") / f"server-{variant.name}.log"  # under the sweep's folder
    entry.served_model, entry.speculative_config = plan.served_name, plan.speculative_config
    entry.device, entry.command, entry.server_log = plan.device, plan.describe(), str(server_log)
    if plan.device == "cuda":
        entry.gpus = cfg.parallelism.world_size
        entry.price_per_gpu_hour = cfg.resources.price_per_gpu_hour
    return state, server_info(settings, variant, cfg, resolved)


def on_gpus(plan: Any, gpus: tuple[int, ...]) -> Any:
    """A launch plan confined to the node's GPUs `gpus` (`CUDA_VISIBLE_DEVICES`), for a server side
    by side with others on one node; vLLM numbers them from 0 inside."""
    return replace(plan, env={**plan.env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))})


def running_servers(settings: SweepSettings) -> Iterator[tuple[Variant, Running, ServerInfo]]:
    """Variants for servers already running (`url`, `baseline_url`), one at a time: what each
    serves and whether it speculates come from the server; the YAML, when given, names the model
    and key. Raises EndpointError (an unreachable server, a baseline that speculates, two servers
    without speculation) before yielding the server in question."""
    s = settings
    config = load_config(s.config, s.overrides) if s.config else None
    key_env = s.api_key_env if s.api_key_env is not None else (config.server.api_key_env or "" if config else "")
    model = s.model or (config.served_name if config else "")
    tokenizer = s.tokenizer or (config.target.tokenizer or "" if config else "")
    names: set[str] = set()
    for url, role in ((s.url, "url"), (s.baseline_url, "baseline_url")):
        if not url:
            continue
        remote = discover(url, model, key_env, tokenizer)
        variant = _running_variant(remote, role, url, bool(s.baseline_url), config)
        entry = VariantResult(
            name=variant.name, label=variant.label, k=variant.k, drafter=variant.drafter, status="running",
            url=remote.base_url, served_model=remote.served_name, metrics=remote.metrics,
            speculative_config={"num_speculative_tokens": remote.spec_k} if remote.speculates else None)
        if variant.name in names:
            raise EndpointError("--url and --baseline-url both serve without speculation; give the "
                                "speculative server as --url")
        names.add(variant.name)
        info = ServerInfo(variant.name, variant.label, "cuda", 0, remote.served_name, "", url=remote.base_url)
        yield variant, Running(entry, server=remote, served_name=remote.served_name, tokenizer=remote.tokenizer,
                               api_key_env=key_env, embedded=is_embedded(config, remote.tokenizer)), info
        log.info("%s: %s serves '%s', %s; /metrics %s", variant.name, remote.base_url, remote.served_name,
                 variant.label, "readable" if remote.metrics else "NOT readable: engine figures will be missing")


def _running_variant(remote: RemoteServer, role: str, url: str, with_baseline_url: bool, config: Any) -> Variant:
    """The variant a running server is: the baseline, `spec-kK` where it speculates, else
    `baseline` (or `server` beside a `baseline_url`)."""
    if role == "baseline_url":
        if remote.speculates:
            raise EndpointError(f"the baseline server at {url} speculates (K={remote.spec_k}); start it "
                                f"with speculation off (make serve NO_SPEC=1)")
        return Variant("baseline", "no speculation (running server)", (), True, None, None)
    if remote.speculates:
        return Variant(f"spec-k{remote.spec_k}", f"speculation K={remote.spec_k} (running server)", (),
                       False, remote.spec_k, config.speculation.drafter if config else None)
    name = "baseline" if not with_baseline_url else "server"
    return Variant(name, "no speculation (running server)", (), True, None, None)


def server_info(settings: SweepSettings, variant: Variant, config: Any,
                resolved: ResolvedDeployment | None) -> ServerInfo:
    """What the plan shows and estimates of a variant's server."""
    device = resolved.device if resolved else choose_device(config, Machine.detect())[0]
    spec = config.speculation
    models = config.target.model + (f" + draft {spec.model}" if spec.enabled and spec.model else "")
    par = config.parallelism
    weights = resolved.weight_bytes if resolved else None
    return ServerInfo(
        variant.name, variant.label, device, par.world_size // par.nodes if device == "cuda" else 0, models,
        server_key(config.name, variant.name, device, settings.overrides, bool(resolved and resolved.plumbing)),
        weight_gib=weights / GIB if weights is not None else None,
        kv_gib=config.resources.cpu_kvcache_space_gib if device == "cpu" else 0.0)


def health(state: Running) -> str | None:
    """None while the variant's server answers /health, else why not (a server not started yet is
    not asked)."""
    if state.broken:
        return state.broken
    server = state.server
    if server is None:
        return None
    if isinstance(server, Server):
        return None if server.alive() and server.healthy() else (
            server.exit_reason() if not server.alive() else f"server at {server.base_url} does not answer /health")
    return None if server.alive() else server.exit_reason()


def stop(state: Running) -> None:
    """Stop the variant's server if the sweep started it (one given by URL is not ours to stop)."""
    if isinstance(state.server, Server):
        state.entry.server_exit_code = state.server.stop()
        state.server = None


def finish_variant(state: Running) -> None:
    """The variant's status from its levels' (and its error, from the failed ones' problems)."""
    entry = state.entry
    if entry.status in ("failed", "skipped") and not entry.levels:
        return
    failed = [lv for lv in entry.levels if lv.status in ("failed", "skipped")]
    entry.status = "failed" if failed or not entry.levels else (
        "flagged" if any(lv.status == "flagged" for lv in entry.levels) else "ok")
    if failed:
        entry.error = "; ".join(dict.fromkeys(p for lv in failed for p in lv.problems[:2]))
