"""Tensor and pipeline parallelism on the real CPU engine: the embedded pair split over two ranks.

vLLM's multiprocess executor runs one worker per rank, each bound to its own core
(`VLLM_CPU_OMP_THREADS_BIND`, set by the kit). Greedy output must not depend on the split."""

from __future__ import annotations

import psutil
import pytest

from conftest import CODE_PROMPTS, LOG_DIR, metric_total
from deploy import free_port, plan_from_config, start_server
from deploy.launcher import port_is_free
from test_serve_e2e import greedy_token_ids

pytestmark = pytest.mark.engine
PROMPTS = CODE_PROMPTS[:3]


def _serve_and_stop(config: str, overrides: list[str], log_name: str, prompts: list[str]) -> tuple[list, float, int]:
    """Greedy tokens, accepted draft tokens, and worker processes of a server started and stopped here:
    after the stop neither the workers nor the port are left behind."""
    port = free_port()
    _, plan = plan_from_config(config, [*overrides, f"server.port={port}"])
    server = start_server(plan, LOG_DIR / f"{log_name}.log", progress=False)
    try:
        tokens = greedy_token_ids(server, prompts)
        accepted = metric_total(server, "vllm:spec_decode_num_accepted_tokens_total")
        assert server.process is not None
        processes = psutil.Process(server.process.pid).children(recursive=True)
    finally:
        server.stop()
    left = [p.pid for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes left after stopping the {log_name} server: {left}"
    assert port_is_free("127.0.0.1", port)
    return tokens, accepted, len(processes)


def test_tensor_parallel_2_with_speculation_matches_one_rank(servers) -> None:
    one_rank = greedy_token_ids(servers.get("default"), PROMPTS)
    two_ranks, accepted, processes = _serve_and_stop("default", ["parallelism.tensor_parallel_size=2"],
                                                     "default-tp2", PROMPTS)
    assert accepted > 0, "no draft token was accepted with two ranks"
    for prompt, a, b in zip(PROMPTS, one_rank, two_ranks):
        assert a == b, f"{prompt!r}: tensor parallel 2 changed the greedy output"
    assert processes >= 3  # the engine core and a worker per rank, at least


def test_pipeline_parallel_2_without_speculation_matches_one_stage(servers) -> None:
    one_stage = greedy_token_ids(servers.get("default", ["speculation.drafter=none"]), PROMPTS)
    two_stages, _, _ = _serve_and_stop("default", ["speculation.drafter=none", "parallelism.pipeline_parallel_size=2"],
                                       "default-pp2", PROMPTS)
    for prompt, a, b in zip(PROMPTS, one_stage, two_stages):
        assert a == b, f"{prompt!r}: pipeline parallel 2 changed the greedy output"


def test_two_nodes_over_loopback_serve_like_one_rank(servers) -> None:
    """vLLM's own multi-node launch (`--nnodes 2`, node 1 `--headless`) from one YAML, both
    "nodes" on this machine: one tensor rank each, joined over loopback."""
    from deploy import Server
    from deploy.engine_args import node_plans

    one_rank = greedy_token_ids(servers.get("default"), PROMPTS)
    port = free_port()
    resolved, _ = plan_from_config("default", [
        "parallelism.tensor_parallel_size=2", "parallelism.nodes=2", "parallelism.master_addr=127.0.0.1",
        f"parallelism.master_port={free_port()}", f"server.port={port}",
        # Both "nodes" share two cores: let the OS place each one's single rank.
        "env={VLLM_CPU_OMP_THREADS_BIND: nobind}"])
    leader_plan, worker_plan = node_plans(resolved)
    worker = Server(worker_plan, LOG_DIR / "default-node1.log").start()
    try:
        leader = start_server(leader_plan, LOG_DIR / "default-node0.log", progress=False)
        try:
            two_nodes = greedy_token_ids(leader, PROMPTS)
        finally:
            leader.stop()
        assert worker.process is not None
        assert worker.process.wait(timeout=120) is not None, "node 1 kept running after node 0 stopped"
    finally:
        worker.stop()
    for prompt, a, b in zip(PROMPTS, one_rank, two_nodes):
        assert a == b, f"{prompt!r}: two nodes changed the greedy output"
    assert port_is_free("127.0.0.1", port)
