"""The step profile (plugins/step_profile.py) and the drafter benchmark's summary (issue 12).

The engine test serves the bigram drafter with the profile on and checks the timers saw real
steps; the others check the arithmetic a report is made of.
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
from tuning.bench_drafters import DrafterResult, markdown, settled_profile, summarize


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


def result(name: str, round_: int, tok_s: float, speedup: float | None, accepted: float | None,
           step: float, post_step: float = 0.0) -> DrafterResult:
    return DrafterResult(name, 100, 100 / tok_s, tok_s, 10, 40, 30, accepted, 4.0 if accepted else None,
                         speedup=speedup, round=round_,
                         step_ms={"step": step, "forward": step * 0.9, "post_step": post_step})


def test_summary_gives_medians_over_rounds_and_the_spread() -> None:
    results = [result("none", 0, 50, 1.0, None, 20), result("bigram", 0, 150, 3.0, 0.8, 25),
               result("bigram", 1, 120, 2.5, 0.7, 26), result("none", 1, 48, 1.0, None, 21),
               result("bigram", 2, 160, 3.2, 0.9, 24), result("none", 2, 50, 1.0, None, 19)]
    none, bigram = summarize(results, ["none", "bigram"])
    assert bigram["rounds"] == 3 and bigram["speedup"] == 3.0 and bigram["speedup_range"] == [2.5, 3.2]
    assert bigram["tokens_per_s"] == 150 and bigram["tokens_per_s_range"] == [120, 160]
    assert bigram["acceptance_rate"] == 0.8 and bigram["step_ms"]["step"] == 25
    assert none["acceptance_rate"] is None and none["step_ms"]["forward"] == pytest.approx(18.0)
    assert summarize(results, ["ngram"]) == []  # not run: no row
    assert bigram["vs_reference_at_equal_tokens"] is None  # no ngram in the run: nothing to hold it against


def test_each_drafter_is_held_against_ngram_at_equal_tokens_per_step() -> None:
    """ngram's step time (with post-step) over the drafter's, round by round: a drafter 25% slower
    per step in one round and 10% faster in the other has the median of 0.8 and 1.1."""
    results = [result("ngram", 0, 100, 2.0, 0.8, 20), result("bigram", 0, 110, 2.2, 0.9, 24, post_step=1),
               result("ngram", 1, 100, 2.0, 0.8, 21, post_step=1), result("bigram", 1, 110, 2.2, 0.9, 20),
               result("bigram", 2, 110, 2.2, 0.9, 40),  # round 2 has no ngram run: not compared
               result("none", 0, 50, 1.0, None, 18)]
    none, ngram, bigram = summarize(results, ["none", "ngram", "bigram"])
    assert none["vs_reference_at_equal_tokens"] is None  # one token a step: no draft to compare
    assert bigram["vs_reference_at_equal_tokens"] == pytest.approx(0.95)
    assert bigram["vs_reference_at_equal_tokens_range"] == pytest.approx([0.8, 1.1])
    assert ngram["vs_reference_at_equal_tokens"] == 1.0
    cost = {"median_us": 170, "steps": 80, "min_us": 160, "p90_us": 200, "cpu_median_us": 170, "load_average": 1}
    meta = {"prompts": 8, "max_tokens": 256, "k": 4, "machine": "test", "rounds": 3}
    assert "| 0.950x [0.800-1.100] |" in markdown([ngram, bigram], cost, meta)


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
        before = settled_profile(str(tmp_path))
        began = time.perf_counter()
        complete(server, "import os\nimport sys\n\n\ndef main():\n", max_tokens=64)
        took = time.perf_counter() - began
        after = settled_profile(str(tmp_path))
        requests.get(f"{server.base_url}/health", timeout=10).raise_for_status()
    ms = step_profile.per_step_ms(before, after)
    assert ms, f"no engine step was timed; files: {sorted(p.name for p in tmp_path.iterdir())}"
    assert 64 / 9 <= ms["steps"] <= 64  # K = 4 drafts, so at most 5 tokens a step; at least one
    assert ms["forward"] > 0 and ms["propose"] > 0 and ms["sample"] > 0
    assert ms["forward"] < ms["step"] and ms["propose"] < ms["sample_tokens"]
    # The timed steps account for most of the request's time (the rest is HTTP and detokenising).
    assert 0.5 < ms["steps"] * (ms["step"] + ms["post_step"]) / 1000 / took <= 1.0


@pytest.mark.engine
@pytest.mark.full
def test_bench_drafters_on_the_engine(tmp_path: Path, measurement) -> None:
    """`make bench-drafters`, shortened: every drafter served in each of two rounds beside the
    baseline; the small model pays at batch 1 in both, and every step is timed by phase."""
    import json
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "tuning", "bench-drafters", "--prompts", "4", "--max-tokens", "96",
                          "--rounds", "2", "--drafters", "none", "small_model (native)", "bigram",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=2400)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = {row["drafter"]: row for row in json.loads((tmp_path / "results.json").read_text())["summary"]}
    assert set(summary) == {"none", "small_model (native)", "bigram"}
    assert all(row["rounds"] == 2 and row["step_ms"]["step"] > 0 for row in summary.values())
    assert summary["none"]["acceptance_rate"] is None
    small = summary["small_model (native)"]
    assert small["acceptance_rate"] > 0.3 and small["speedup_range"][0] > 1, small
    assert summary["bigram"]["acceptance_rate"] > 0
    # Sampled at T=1 (the default), every output checked and none loops: the acceptance is prediction.
    for row in summary.values():
        assert row["content"]["checked"] == 8 and row["content"]["degenerate"] == 0, row["content"]
        assert row["content"]["reference"]["source"] == "the embedded pair's held-out code"
    assert small["content"]["acceptance_valid"] == pytest.approx(small["acceptance_rate"], abs=0.1)
