"""Kubernetes manifests carry the same vLLM arguments as `make serve`, sized for the pod."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def k8s(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy", "k8s", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)


def test_manifests_for_a_multi_gpu_preset() -> None:
    result = k8s("llama70b-7b", "--replicas", "2")
    assert result.returncode == 0, result.stderr
    deployment, service = yaml.safe_load_all(result.stdout)
    assert deployment["kind"] == "Deployment" and service["kind"] == "Service"
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    args = container["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "8"
    assert args[args.index("--host") + 1] == "0.0.0.0"
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec["method"] == "draft_model" and spec["model"] == "meta-llama/Llama-2-7b-chat-hf"
    key = next(e for e in container["env"] if e["name"] == "VLLM_API_KEY")
    assert key["valueFrom"]["secretKeyRef"]["name"] == "specdeploy-api-key"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == "65"  # outlives a load balancer's 60 s idle timeout
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert "&id" not in result.stdout, "anchors make manifests hard to read"


def test_manifests_run_locked_down() -> None:
    """Non-root, no privilege escalation, read-only root with writable caches, no service-account
    token, CPU and memory sized, probes that survive a busy server, a warning where the stock
    image cannot guard every route with the key."""
    result = k8s("llama70b-7b")
    assert result.returncode == 0, result.stderr
    deployment, _ = yaml.safe_load_all(result.stdout)
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    sec = container["securityContext"]
    assert sec["allowPrivilegeEscalation"] is False and sec["readOnlyRootFilesystem"] is True
    assert sec["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert {"/tmp", "/cache"} <= mounts and env["HF_HOME"].startswith("/cache")
    assert set(container["resources"]["requests"]) == {"nvidia.com/gpu", "cpu", "memory"}
    assert "memory" in container["resources"]["limits"]
    assert all(container[p]["timeoutSeconds"] >= 5 for p in ("readinessProbe", "livenessProbe", "startupProbe"))
    assert result.stdout.startswith("# WARNING: on the stock image") and "--middleware" not in container["args"]
    own = k8s("llama70b-7b", "--image", "registry.example/specdeploy:1")
    container = next(yaml.safe_load_all(own.stdout))["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][container["args"].index("--middleware") + 1] == "plugins.auth.GuardEveryRoute"
    assert not own.stdout.startswith("#")
    secret = k8s("llama70b-7b", "--set", "env={HF_TOKEN: hf_abc}")
    assert secret.returncode == 2 and "look like secrets" in secret.stderr and "hf_abc" not in secret.stderr


def test_manifests_refuse_what_a_pod_cannot_run() -> None:
    result = k8s("embedded-code")
    assert result.returncode == 2 and "a pod cannot see this machine's folders" in result.stderr
    result = k8s("llama70b-7b", "--set", "parallelism.tensor_parallel_size=1")
    assert result.returncode == 2 and "GiB of GPU memory are usable" in result.stderr


KUBERNETES = "1.30"


def _validate(document: dict) -> None:
    """Kubernetes' own OpenAPI schema, offline and strict (unknown fields fail)."""
    import kubernetes_validate

    kubernetes_validate.validate(document, KUBERNETES, strict=True)


def test_single_node_manifests_pass_the_kubernetes_schema() -> None:
    result = k8s("llama70b-7b")
    assert result.returncode == 0, result.stderr
    for document in yaml.safe_load_all(result.stdout):
        _validate(document)


def test_the_schema_check_catches_a_broken_manifest() -> None:
    import kubernetes_validate
    import pytest

    deployment, _ = yaml.safe_load_all(k8s("llama70b-7b").stdout)
    deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(deployment)


def test_multi_node_manifests_follow_vllms_leaderworkerset_layout() -> None:
    """Two nodes of 8 GPUs: a LeaderWorkerSet of groups of 2 pods running one engine with vLLM's
    own launcher; the leader serves the API behind the Service, the worker runs headless."""
    result = k8s("llama70b-7b", "--set", "parallelism.nodes=2", "--set", "parallelism.pipeline_parallel_size=2",
                 "--replicas", "3")
    assert result.returncode == 0, result.stderr
    lws, service = yaml.safe_load_all(result.stdout)
    assert (lws["apiVersion"], lws["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    assert lws["spec"]["replicas"] == 3
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 2 and group["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert set(group) == {"size", "restartPolicy", "leaderTemplate", "workerTemplate"}
    leader, worker = (group[t]["spec"]["containers"][0] for t in ("leaderTemplate", "workerTemplate"))
    for container in (leader, worker):
        args = container["args"]
        assert args[args.index("--nnodes") + 1] == "2"
        assert args[args.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
        assert args[args.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
        assert args[args.index("--tensor-parallel-size") + 1] == "8"
        assert args[args.index("--pipeline-parallel-size") + 1] == "2"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 8  # one node's GPUs per pod
    assert leader["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--headless" not in leader["args"] and leader["readinessProbe"]["httpGet"]["path"] == "/health"
    assert worker["command"] == ["vllm", "serve"] and "--headless" in worker["args"]
    assert "ports" not in worker and "readinessProbe" not in worker
    assert service["spec"]["selector"] == group["leaderTemplate"]["metadata"]["labels"]
    assert service["spec"]["selector"]["role"] == "leader"
    # The pods are core Kubernetes objects: validated as pod templates; the Service as it is.
    for template in ("leaderTemplate", "workerTemplate"):
        _validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                   "template": group[template]})
    _validate(service)
    ray = k8s("llama70b-7b", "--set", "parallelism.nodes=2", "--set", "parallelism.pipeline_parallel_size=2",
              "--set", "parallelism.distributed_executor_backend=ray")
    assert ray.returncode == 2 and "set distributed_executor_backend: mp" in ray.stderr


def test_every_plugin_drafter_is_refused_on_the_stock_image() -> None:
    greedy = ["--set", "speculation.model=", "--set", "speculation.draft_sampling=greedy"]
    for drafter in ("bigram", "probe"):
        result = k8s("qwen3-4b-0.6b", "--set", f"speculation.drafter={drafter}", *greedy)
        assert result.returncode == 2 and "plugin drafters need specdeploy installed" in result.stderr, drafter


def test_the_model_cache_can_live_on_a_claim_and_the_start_up_probe_allows_the_download() -> None:
    """`--cache-pvc`: the cache volume is a PersistentVolumeClaim (rendered, sized from the weights,
    shared by the replicas), valid by the Kubernetes schema; either way the start-up probe allows
    the first start's download of the weights (140 GB at 1 Gbit/s: more than the config's 900 s)."""
    result = k8s("llama70b-7b", "--replicas", "2", "--cache-pvc", "llama-cache")
    assert result.returncode == 0, result.stderr
    claim, deployment, _ = yaml.safe_load_all(result.stdout)
    _validate(claim)
    _validate(deployment)
    assert claim["kind"] == "PersistentVolumeClaim" and claim["metadata"]["name"] == "llama-cache"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # two replicas mount it
    size = int(claim["spec"]["resources"]["requests"]["storage"].removesuffix("Gi"))
    assert 140e9 * 1.2 / 2**30 <= size < 200
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["cache"] == {"name": "cache", "persistentVolumeClaim": {"claimName": "llama-cache"}}
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    assert probe["failureThreshold"] * probe["periodSeconds"] >= 140e9 * 8 / 1e9  # the download alone
    plain, _ = yaml.safe_load_all(k8s("llama70b-7b").stdout)
    assert {v["name"]: v for v in plain["spec"]["template"]["spec"]["volumes"]}["cache"]["emptyDir"] == {}
