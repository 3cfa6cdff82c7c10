"""specdeploy's deployment layer: config file -> validated config -> engine arguments -> server.

    from deploy import plan_from_config, start_server
    resolved, plan = plan_from_config("default", overrides=["speculation.num_speculative_tokens=2"])
    with start_server(plan) as server:
        ...  # server.base_url
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from deploy.config import ConfigError, DeploymentConfig, Override, load_config, resolve_config_path
from deploy.engine_args import LaunchPlan, build_launch_plan
from deploy.launcher import Server, ServerStartError, free_port, start_server
from deploy.preflight import ResolvedDeployment, preflight


def plan_from_config(
    config: str | Path | DeploymentConfig = "default",
    overrides: Sequence[Override | str] = (),
    no_speculation: bool = False,
    check_memory: bool = True,
    plan_only: bool = False,
    node_rank: int = 0,
) -> tuple[ResolvedDeployment, LaunchPlan]:
    """Load (unless given), check against this machine, and translate a config to a launch plan.
    `overrides`: `Override`s or their `section.field=value` texts (`load_config`).
    `plan_only`: keep what this machine lacks in `resolved.machine_problems` instead of refusing.
    `node_rank`: which node's command, for a deployment over several nodes."""
    config_dir = None
    if not isinstance(config, DeploymentConfig):
        config_dir = resolve_config_path(config).parent
        config = load_config(config, overrides, no_speculation)
    elif no_speculation:
        config = config.without_speculation()
    resolved = preflight(config, config_dir, check_memory=check_memory, plan_only=plan_only)
    return resolved, build_launch_plan(resolved, node_rank=node_rank)


__all__ = [
    "ConfigError", "DeploymentConfig", "LaunchPlan", "Override", "ResolvedDeployment", "Server", "ServerStartError",
    "build_launch_plan", "free_port", "load_config", "plan_from_config", "preflight", "start_server",
]
