"""The step profile (plugins/step_profile.py): where an engine step's time goes.

The engine test serves the bigram drafter with the profile on and checks the timers saw real
steps; the others check the arithmetic a report is made of. A sweep reads it around every run
(tests/test_loadtest.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests

from conftest import LOG_DIR, complete
from deploy import free_port, plan_from_config, start_server
from plugins import step_profile


def figures(**seconds_and_calls: tuple[int, float]) -> dict[str, dict[str, float]]:
    return {phase: {"calls": calls, "seconds": seconds} for phase, (calls, seconds) in seconds_and_calls.items()}


def test_per_step_ms_is_the_difference_of_two_reads_split_by_phase() -> None:
    before = figures(step=(10, 1.0), schedule=(10, 0.01), forward=(10, 0.8), sample_tokens=(10, 0.1),
                     sample=(10, 0.02), bookkeeping=(10, 0.01), propose=(10, 0.05), update=(10, 0.02),
                     post_step=(10, 0.01))
    after = figures(step=(30, 3.0), schedule=(30, 0.03), forward=(30, 2.2), sample_tokens=(30, 0.5),
                    sample=(30, 0.06), bookkeeping=(30, 0.03), propose=(30, 0.35), update=(30, 0.06),
                    post_step=(30, 0.05))
    ms = step_profile.per_step_ms(before, after)
    assert ms["steps"] == 20
    assert ms["step"] == pytest.approx(100.0) and ms["forward"] == pytest.approx(70.0)
    assert ms["propose"] == pytest.approx(15.0) and ms["post_step"] == pytest.approx(2.0)
    # sample_tokens 20 ms = sample 2 + bookkeeping 1 + propose 15 + 2 of glue
    assert ms["sample_tokens_other"] == pytest.approx(2.0)
    # step 100 = schedule 1 + forward 70 + sample_tokens 20 + update 2 + 7 elsewhere
    assert ms["other"] == pytest.approx(7.0)
    assert step_profile.per_step_ms(after, after) == {}  # no step between the reads: nothing to divide


def test_read_profile_sums_processes_and_skips_a_file_being_replaced(tmp_path: Path) -> None:
    for pid, calls in ((1, 3), (2, 4)):
        (tmp_path / f"steps-{pid}.json").write_text(json.dumps(
            {"pid": pid, "phases": {"step": {"calls": calls, "seconds": calls / 10}}}))
    (tmp_path / "steps-3.json").write_text('{"pid": 3, "pha')  # half written
    total = step_profile.read_profile(tmp_path)
    assert total == {"step": {"calls": 7, "seconds": pytest.approx(0.7)}}
    assert step_profile.read_profile(tmp_path / "absent") == {}


def test_install_wraps_each_method_once_and_names_what_it_cannot_find(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    for module, cls, name in step_profile.PHASES.values():  # restored after the test
        owner = getattr(importlib.import_module(module), cls)
        monkeypatch.setattr(owner, name, owner.__dict__[name])
    monkeypatch.setitem(step_profile.PHASES, "gone", ("vllm.v1.engine.core", "EngineCore", "no_such_method"))
    assert step_profile.install(tmp_path) == ["gone"]
    from vllm.v1.core.sched.scheduler import Scheduler

    wrapped = Scheduler.__dict__["schedule"]
    assert wrapped.__specdeploy_timed__ and wrapped.__wrapped__.__name__ == "schedule"
    step_profile.install(tmp_path)
    assert Scheduler.__dict__["schedule"] is wrapped  # not wrapped twice


@pytest.mark.engine
@pytest.mark.full
def test_a_served_drafter_reports_where_its_steps_go(tmp_path: Path, measurement) -> None:
    """With SPECDEPLOY_STEP_PROFILE set, vLLM loads the timers through the general-plugin entry point
    in the engine process; one request's steps show up with a target forward and a drafter."""
    from dataclasses import replace

    _, plan = plan_from_config("embedded-bigram", [f"server.port={free_port()}"])
    plan = replace(plan, env={**plan.env, step_profile.ENV: str(tmp_path)})
    with start_server(plan, LOG_DIR / "step-profile.log", progress=False) as server:
        complete(server, "def main():\n", max_tokens=8)  # warm-up
        before = step_profile.read_settled(tmp_path)
        began = time.perf_counter()
        complete(server, "import os\nimport sys\n\n\ndef main():\n", max_tokens=64)
        took = time.perf_counter() - began
        after = step_profile.read_settled(tmp_path)
        requests.get(f"{server.base_url}/health", timeout=10).raise_for_status()
    ms = step_profile.per_step_ms(before, after)
    assert ms, f"no engine step was timed; files: {sorted(p.name for p in tmp_path.iterdir())}"
    assert 64 / 9 <= ms["steps"] <= 64  # K = 4 drafts, so at most 5 tokens a step; at least one
    assert ms["forward"] > 0 and ms["propose"] > 0 and ms["sample"] > 0
    assert ms["forward"] < ms["step"] and ms["propose"] < ms["sample_tokens"]
    # The timed steps account for most of the request's time (the rest is HTTP and detokenising).
    assert 0.5 < ms["steps"] * (ms["step"] + ms["post_step"]) / 1000 / took <= 1.0
