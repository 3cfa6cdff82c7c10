"""Variants' GPU servers side by side on one node: groups that fit, disjoint GPUs, the order and
starts they take, and the plan a node with 8 GPUs gets (a stand-in nvidia-smi)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from deploy.engine_args import LaunchPlan
from loadtest.sweeps.plan import ServerInfo, gpu_groups, gpu_text, run_order, starts_needed
from loadtest.sweeps.servers import on_gpus

REPO = Path(__file__).resolve().parent.parent


def server(name: str, gpus: int, device: str = "cuda") -> ServerInfo:
    return ServerInfo(name, name, device, gpus, "m", f"k|{name}")


def test_servers_are_packed_in_order_into_groups_that_fit_the_node() -> None:
    four = [server(n, 4) for n in ("a", "b", "c", "base")]
    groups = gpu_groups(four, 8)
    assert [[s.name for s in g] for g in groups] == [["a", "b"], ["c", "base"]]
    assert [[s.gpu_set for s in g] for g in groups] == [[(0, 1, 2, 3), (4, 5, 6, 7)]] * 2
    odd = gpu_groups([server("a", 2), server("b", 4), server("c", 4), server("base", 2)], 8)
    assert [[(s.name, gpu_text(s.gpu_set)) for s in g] for g in odd] == [[("a", "0-1"), ("b", "2-5")],
                                                                        [("c", "0-3"), ("base", "4-5")]]
    # Nothing fits beside anything: one at a time, as without placement; a CPU or running servers: none.
    assert gpu_groups([server("a", 8), server("base", 8)], 8) == []
    assert gpu_groups([server("a", 4), server("base", 4)], 4) == []
    assert gpu_groups([server("a", 0, "cpu"), server("base", 0, "cpu")], 8) == []


def test_a_group_takes_turns_run_by_run_and_starts_once() -> None:
    a, b, c, base = "a", "b", "c", "base"
    order = run_order([a, b, c, base], [1, 32], 2, together=False, groups=[[a, b], [c, base]])
    assert order[:4] == [(1, 1, a), (1, 1, b), (2, 1, b), (2, 1, a)]  # who goes first flips
    assert [v for _, _, v in order[8:]] == [c, base, base, c, c, base, base, c]
    assert [v for (_, _, v), start in zip(order, starts_needed(order, True, [[a, b], [c, base]])) if start] == [
        a, b, c, base]


def test_a_server_side_by_side_sees_only_its_gpus() -> None:
    plan = LaunchPlan(["vllm", "serve"], {"VLLM_API_KEY": "x"}, "0.0.0.0", 8000, "m", None, "cuda")
    placed = on_gpus(plan, (4, 5, 6, 7))
    assert placed.env == {"VLLM_API_KEY": "x", "CUDA_VISIBLE_DEVICES": "4,5,6,7"} and plan.env == {"VLLM_API_KEY": "x"}


def test_a_node_of_eight_gpus_runs_two_70b_servers_at_a_time(tmp_path: Path) -> None:
    """`make loadtest CONFIG=llama70b-1b.yaml USERS=1,32 DRAFTERS=all DRY_RUN=1` on a node whose
    nvidia-smi lists 8 H100s: two groups of two servers, each on 4 GPUs, within the hour."""
    stand_in = tmp_path / "bin" / "nvidia-smi"
    stand_in.parent.mkdir()
    stand_in.write_text("#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo 81559; done\n")
    stand_in.chmod(0o755)
    env = {**os.environ, "PATH": f"{stand_in.parent}:{os.environ['PATH']}", "SPECDEPLOY_API_KEY": "k"}
    run = subprocess.run([sys.executable, "-m", "loadtest", "run", "llama70b-1b.yaml", "--drafters", "all",
                          "--users", "1,32", "--dry-run"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "side by side: spec-k5 + eagle3; then ngram + baseline" in out, out
    for name, gpus in (("spec-k5", "0-3"), ("eagle3", "4-7"), ("ngram", "0-3"), ("baseline", "4-7")):
        assert any(line.strip().startswith(name) and line.endswith(f"GPUs {gpus}") for line in out.splitlines()), out
    minutes = next(line for line in out.splitlines() if "estimated duration" in line)
    assert "h" not in minutes.split("(")[0] and int(minutes.split(":")[1].split("min")[0]) <= 60, minutes
    # Asked to run one server at a time, it does.
    grouped = subprocess.run([sys.executable, "-m", "loadtest", "run", "llama70b-1b.yaml", "--drafters", "all",
                              "--order", "grouped", "--dry-run"], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=120)
    assert "one at a time" in grouped.stdout and "GPUs 0-3" not in grouped.stdout
