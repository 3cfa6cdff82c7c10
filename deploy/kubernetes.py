"""Kubernetes manifests for a deployment: vLLM's server as a Deployment (one node) or a
LeaderWorkerSet (several nodes), and a Service.

The container runs exactly the vLLM arguments `engine_args.py` derives for the config (so a
pod serves what `make serve` would), on the official vLLM image, with GPUs requested for
tensor x pipeline parallelism, `/health` as readiness and liveness probe, and the API key
taken from a Secret. Across nodes it follows vLLM's documented LeaderWorkerSet layout with
its own launcher: every pod of a group runs the same engine with `--nnodes`, its
`--node-rank` ($(LWS_WORKER_INDEX)) and the leader's address ($(LWS_LEADER_ADDRESS)); the
leader serves the API, the workers run `vllm serve --headless`. Ray across pods is refused
with a pointer rather than rendered half right.
"""

from __future__ import annotations

import math
from typing import Any

import yaml

from deploy.config import ConfigError, DeploymentConfig
from deploy.engine_args import (AUTH_MIDDLEWARE, OPEN_PATHS_ENV, SERVER_MODULE, engine_arguments, is_secret,
                                open_paths, vllm_flags)
from deploy.footprint import START_SLACK, first_start_s
from deploy.preflight import EMBEDDED_PREFIX, ResolvedDeployment, looks_like_path

DEFAULT_IMAGE = "vllm/vllm-openai:v0.32.0"
CONTAINER_PORT = 8000


def check_cluster_models(config: DeploymentConfig) -> None:
    """Refuse models a pod cannot reach (this machine's folders, the embedded pair), before any build."""
    refs = [config.target.model] + ([config.speculation.model] if config.speculation.enabled and
                                    config.speculation.model else [])
    local = [r for r in refs if r.startswith(EMBEDDED_PREFIX) or looks_like_path(r)]
    if local:
        raise ConfigError(config.name, [f"{', '.join(local)}: a pod cannot see this machine's folders; use hub ids "
                                        f"(org/name) or bake the models into the image"])


def startup_seconds(resolved: ResolvedDeployment) -> float:
    """How long the start-up probe waits: the config's `server.startup_timeout_s`, or longer where the
    weights need it: a first start with their download (`footprint.first_start_s`: a pod's first start
    finds an empty cache, a claim's too), with the same slack `make check` advises."""
    gb = (resolved.weight_bytes or 0) / 1e9
    return max(resolved.config.server.startup_timeout_s, START_SLACK * first_start_s(gb))


def cache_claim(resolved: ResolvedDeployment, name: str, shared: bool) -> dict[str, Any]:
    """A PersistentVolumeClaim for the model cache: the weights and a fifth again for vLLM's
    compile cache and the tokenizer, at least 20 GiB; ReadWriteMany where several pods share it."""
    gib = max(20, math.ceil((resolved.weight_bytes or 0) * 1.2 / 2**30))
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteMany" if shared else "ReadWriteOnce"],
                     "resources": {"requests": {"storage": f"{gib}Gi"}}}}


def render_manifests(resolved: ResolvedDeployment, image: str = DEFAULT_IMAGE, replicas: int = 1,
                     api_key_secret: str = "specdeploy-api-key", cache_pvc: str | None = None) -> str:
    """Deployment + Service YAML for a GPU cluster. `cache_pvc`: the model cache on this
    PersistentVolumeClaim (rendered too) instead of an emptyDir, so a restarted pod finds its
    weights (the start-up probe still allows the first start's download)."""
    config = resolved.config
    par = config.parallelism
    if par.nodes > 1 and not par.multi_node_mp:
        raise ConfigError(config.name, ["parallelism.nodes > 1 with Ray: manifests use vLLM's own multi-node "
                                        "launcher in a LeaderWorkerSet; set distributed_executor_backend: mp"])
    check_cluster_models(config)
    if config.speculation.plugin_class:  # the stock image cannot import specdeploy's proposers
        raise ConfigError(config.name, ["plugin drafters need specdeploy installed in the image: build one FROM "
                                        f"{image} with `pip install .` and pass it as --image"])
    args = engine_arguments(resolved)
    args.update(host="0.0.0.0", port=CONTAINER_PORT)
    if par.multi_node_mp:  # LeaderWorkerSet puts each pod's place and the leader's address in its env
        args.update(node_rank="$(LWS_WORKER_INDEX)", master_addr="$(LWS_LEADER_ADDRESS)")
    warnings = []
    if args.get("middleware") == AUTH_MIDDLEWARE and image == DEFAULT_IMAGE:
        # The stock image cannot import specdeploy's middleware: vLLM then guards /v1 only.
        del args["middleware"]
        warnings.append(f"# WARNING: on the stock image {image} the API key guards /v1 only; /tokenize, "
                        f"/invocations, /metrics and /docs answer anyone. Build an image FROM it with "
                        f"`pip install .` and pass it as --image to guard every route.\n")
    gpus = par.world_size // par.nodes  # per pod: one pod per node
    name = config.name.lower().replace(".", "-").replace("_", "-")
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "specdeploy"}
    secrets = sorted(k for k in config.env if is_secret(k))
    if secrets:
        raise ConfigError(config.name, [f"env: {', '.join(secrets)} look like secrets, which a manifest would hold in "
                                        f"plain text; create a Kubernetes Secret and reference it instead"])
    # The root filesystem is read-only; vLLM, Hugging Face, Triton and torch write under /cache and /tmp.
    writable = {"HOME": "/cache/home", "XDG_CACHE_HOME": "/cache", "HF_HOME": "/cache/huggingface",
                "VLLM_CACHE_ROOT": "/cache/vllm", "TRITON_CACHE_DIR": "/cache/triton"}
    keep_alive = {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": str(config.server.keep_alive_timeout_s)}
    env: list[dict[str, Any]] = [{"name": k, "value": v}
                                 for k, v in sorted({**writable, **keep_alive, **config.env}.items())]
    if config.server.api_key_env:
        env.append({"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": api_key_secret, "key": "key"}}})
        env.append({"name": OPEN_PATHS_ENV, "value": ",".join(open_paths(config))})
    env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token",
                                                                    "optional": True}}})
    # /health answers from the API server's event loop: under load it can take seconds, and the
    # default 1 s timeout would restart a busy, healthy pod.
    probe = {"httpGet": {"path": "/health", "port": CONTAINER_PORT}, "periodSeconds": 10, "timeoutSeconds": 10}
    container = {
        "name": "vllm",
        "image": image,
        "command": ["python3", "-m", SERVER_MODULE],
        "args": vllm_flags(args),
        "ports": [{"containerPort": CONTAINER_PORT, "name": "http"}],
        "env": env,
        # A scheduler that knows the pod's CPU and memory: vLLM runs a process per GPU, loads the
        # weights through host memory, and tokenizes on the CPU.
        "resources": {"limits": {"nvidia.com/gpu": gpus, "memory": f"{32 * gpus}Gi"},
                      "requests": {"nvidia.com/gpu": gpus, "cpu": str(4 * gpus), "memory": f"{16 * gpus}Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        # Loading a large model takes minutes: readiness gates traffic, liveness starts late.
        # The first start of a pod on an empty cache downloads the weights: the probe allows it.
        "startupProbe": {**probe, "failureThreshold": math.ceil(startup_seconds(resolved) / 10)},
        "readinessProbe": probe,
        "livenessProbe": {**probe, "failureThreshold": 6},
        # Tensor parallelism exchanges activations through shared memory.
        "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}, {"name": "cache", "mountPath": "/cache"},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }
    if par.multi_node_mp:
        serving = {**labels, "role": "leader"}
        # The workers serve no HTTP: vLLM's own `serve --headless` (the stock image's console
        # script), the same engine arguments, no probes (the leader's /health covers the group).
        worker = {**container, "name": "vllm-worker", "command": ["vllm", "serve"],
                  "args": vllm_flags({**args, "headless": True})}
        for key in ("ports", "startupProbe", "readinessProbe", "livenessProbe"):
            del worker[key]
        workload = {
            "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "replicas": replicas,
                "leaderWorkerTemplate": {
                    "size": par.nodes,
                    # One engine over all pods of a group: a lost pod restarts the whole group.
                    "restartPolicy": "RecreateGroupOnPodRestart",
                    "leaderTemplate": {"metadata": {"labels": serving}, "spec": _pod_spec(container, cache_pvc)},
                    "workerTemplate": {"metadata": {"labels": labels}, "spec": _pod_spec(worker, cache_pvc)},
                },
            },
        }
    else:
        serving = labels
        workload = {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": _pod_spec(container, cache_pvc)},
            },
        }
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {"selector": serving, "ports": [{"name": "http", "port": config.server.port,
                                                 "targetPort": CONTAINER_PORT}]},
    }
    claim = [cache_claim(resolved, cache_pvc, replicas > 1 or par.nodes > 1)] if cache_pvc else []
    return "".join(warnings) + yaml.dump_all([*claim, workload, service], Dumper=_PlainDumper, sort_keys=False)


def _pod_spec(container: dict[str, Any], cache_pvc: str | None = None) -> dict[str, Any]:
    return {
        # The server never talks to the Kubernetes API: no token to steal.
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                            "fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container], "volumes": [
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
            {"name": "cache", **({"persistentVolumeClaim": {"claimName": cache_pvc}} if cache_pvc else {"emptyDir": {}})},
            {"name": "tmp", "emptyDir": {}}]}


class _PlainDumper(yaml.SafeDumper):
    """Writes repeated objects (labels, probes) out in full: anchors confuse manifest readers."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
