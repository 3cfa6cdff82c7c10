"""What a sweep plans before it starts (`loadtest.sweeps.plan`), the dry run, the effective K read from the
server's counters, and the speculation `make serve` prints. No engine starts here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from deploy.config import load_config
from deploy.preflight import Machine
from loadtest.measurement import prom
from loadtest.measurement.figures import BenchFigures, ClientFigures, ServerFigures
from loadtest.measurement.results import Closed, LevelResult, Open, SweepResults, VariantResult
from loadtest.sweeps.plan import SweepPlan, Timings, run_order, starts_needed
from loadtest.reports.report import compare_rows, compare_table
from loadtest.sweeps.settings import SweepSettings
from loadtest.traffic.request_settings import RequestSettings
from loadtest.sweeps.runner import Sweep

REPO = Path(__file__).resolve().parent.parent


def plan_of(tmp_path: Path, config: str, **settings) -> SweepPlan:
    """A dry run's plan, with its own (empty) timings file."""
    sweep = Sweep(SweepSettings(config, out=tmp_path / "report", **settings), timings=Timings.load(tmp_path / "t.json"))
    return sweep.plan(dry_run=True)


# ------------------------------------------------------------------------------------ order and starts
def test_the_70b_preset_on_gpus_starts_each_server_once(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "llama70b-7b", users=[1, 32], repeat=3)
    assert [s.name for s in plan.servers] == ["spec-schedule", "baseline"]
    assert {s.device for s in plan.servers} == {"cuda"} and {s.gpus for s in plan.servers} == {8}
    assert plan.order_name == "grouped" and not plan.together
    assert [s.name for s in plan.starts()] == ["spec-schedule", "baseline"]
    # Each variant's three repeats at both levels in a row.
    assert [(r, c.at, s.name) for r, c, s in plan.steps][:6] == [(1, 1, "spec-schedule"), (1, 32, "spec-schedule"), (2, 1, "spec-schedule"),
                                                               (2, 32, "spec-schedule"), (3, 1, "spec-schedule"), (3, 32, "spec-schedule")]
    text = plan.describe(dry_run=True)
    assert "server starts: 2 (spec-schedule 1, baseline 1); --order alternate would take 4" in text
    assert "estimated duration:" in text and "no measured start time yet" in text
    # What this machine lacks is listed, not refused: the plan is for the machine the config describes.
    assert any("NVIDIA GPU" in p or "GPUs per node" in p for p in plan.skipped) or Machine.detect().gpus >= 8


def test_alternating_on_gpus_restarts_the_servers_each_repeat(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "llama70b-7b", users=[1, 32], repeat=3, order="alternate")
    # Who goes first flips every repeat (A B, B A, A B): the server of the last variant of one
    # repeat serves the first of the next, so 3 repeats of 2 variants take 4 starts, not 6.
    assert plan.order_name == "alternate" and [s.name for s in plan.starts()] == ["spec-schedule", "baseline", "spec-schedule",
                                                                                  "baseline"]
    assert [s.name for _, _, s in plan.steps][::2] == ["spec-schedule", "baseline", "baseline", "spec-schedule", "spec-schedule", "baseline"]
    assert "--order grouped would take 2" in plan.describe()


@pytest.mark.parametrize("host_gib, together, starts", [(64.0, True, 2), (4.0, False, 4)])
def test_the_cpu_default_keeps_alternating(tmp_path: Path, monkeypatch, host_gib, together, starts) -> None:
    """On a CPU the variants keep taking turns (a shared CPU drifts): up together where the servers
    fit in memory, started once each; else one at a time, restarted as the turns require."""
    monkeypatch.setattr(Machine, "detect", staticmethod(lambda: Machine(0, 0.0, host_gib, (0, 1))))
    plan = plan_of(tmp_path, "embedded-code", users=[1, 32], repeat=3)
    assert [s.name for s in plan.servers] == ["spec-k4", "baseline"] and {s.device for s in plan.servers} == {"cpu"}
    assert plan.order_name == "alternate" and plan.together is together and len(plan.starts()) == starts
    if together:  # every run, both variants, who goes first flipping
        assert [(r, c.at, s.name) for r, c, s in plan.steps][:4] == [(1, 1, "spec-k4"), (1, 1, "baseline"),
                                                                   (2, 1, "baseline"), (2, 1, "spec-k4")]
    # Up together, both start at once before the first run: the slower start counts, once.
    for server, seconds in zip(plan.servers, (20.0, 30.0)):
        plan.timings.record_start(server.key, seconds)
    start_s = [start for start, _ in plan.step_seconds()]
    assert plan.start_together is together
    assert (start_s[0], sum(start_s)) == ((30.0, 30.0) if together else (20.0, 2 * 20.0 + 2 * 30.0))
    text = plan.describe()
    assert f"server starts: {starts} (spec-k4 {starts // 2}, baseline {starts // 2})" in text
    assert "CPU" in text and "12 runs" in text and "32 requests at c=1, 256 requests at c=32" in text


def test_run_order_and_starts_agree_with_the_runner() -> None:
    order = run_order(["a", "b"], [1, 32], 2, together=False)
    assert order == [(1, 1, "a"), (1, 32, "a"), (1, 1, "b"), (1, 32, "b"),
                     (2, 1, "b"), (2, 32, "b"), (2, 1, "a"), (2, 32, "a")]
    assert starts_needed(order, one_at_a_time=True) == [True, False, True, False, False, False, True, False]
    assert sum(starts_needed(run_order(["a", "b"], [1], 3, together=True), one_at_a_time=False)) == 2
    assert run_order(["a", "b"], [1], 2, together=True, grouped=True) == [(1, 1, "a"), (2, 1, "a"),
                                                                          (1, 1, "b"), (2, 1, "b")]


# ------------------------------------------------------------------------------------ estimates
def test_a_closed_loops_measured_run_is_kept_as_its_cost_per_token_and_an_open_loops_is_not(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "embedded-code", users=[2], repeat=1, warmup=1, request=RequestSettings(max_tokens=16))
    server = plan.servers[0]
    level = Closed(2).level()
    level.status, level.client = "ok", ClientFigures(requests=6)
    level.vllm_bench = BenchFigures(completed=4)
    plan.loop.record_run(plan, server, level, wall_s=3.2)
    # Its wall time over the tokens it asked for: the warm-up (2 users x 1), the measured 6, the benchmark's 4.
    assert plan.timings.seconds_per_token(server.key, 2) == pytest.approx(3.2 / ((2 * 1 + 6 + 4) * 16), abs=1e-6)  # kept to 6 digits
    failed = Closed(4).level()
    failed.status, failed.client = "failed", ClientFigures(requests=6)
    plan.loop.record_run(plan, server, failed, wall_s=1.0)
    assert plan.timings.seconds_per_token(server.key, 4) is None  # not measured: no cost to keep
    rates = plan_of(tmp_path, "embedded-code", rates=[2.0], repeat=1)
    opened = Open(2.0).level()
    opened.status, opened.client = "ok", ClientFigures(requests=6)
    rates.loop.record_run(rates, rates.servers[0], opened, wall_s=3.2)
    assert rates.timings.data["runs"] == plan.timings.data["runs"]  # the open loop kept nothing of its own


def test_measured_timings_replace_the_assumptions(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "llama70b-7b", users=[1, 32], repeat=3)
    assumed = plan.total_s()
    for server in plan.servers:
        plan.timings.record_start(server.key, 300.0)
        for c in (1, 32):
            plan.timings.record_run(server.key, c, 0.01)
    again = Timings.load(tmp_path / "t.json")  # kept in the file
    assert again.start_s(plan.servers[0].key) == 300.0
    plan.timings = again
    text = plan.describe()
    assert "starts in about 5 min (measured here before)" in text and "guess" not in text
    tokens = sum(plan.run_tokens(s, c, r) for r, c, s in plan.steps)
    assert plan.total_s() == pytest.approx(2 * 300 + 0.01 * tokens) != assumed
    # Time left: what the sweep measured replaces the estimates of the steps still to come, and
    # scales those of runs it has not measured yet alike.
    first = plan.servers[0]
    run_1 = 0.01 * plan.run_tokens(first, Closed(1))
    assert plan.left_s(0, {}) == pytest.approx(plan.total_s())
    assert plan.left_s(0, {}, skip_start=True) == pytest.approx(plan.total_s() - 300)
    left = plan.left_s(1, {(first.name, 1, 1): run_1 / 2})  # after the first step, its run twice as fast
    assert left == pytest.approx(300 + (plan.total_s() - 600 - run_1) / 2)


def test_several_temperatures_multiply_the_sweeps(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "llama70b-7b", users=[1, 32], repeat=3)
    one = plan.total_s()
    plan.temperatures = [0.0, 0.7, 1.0]
    assert plan.total_s() == pytest.approx(3 * one)
    assert "server starts: 6 (spec-schedule 3, baseline 3; 2 per temperature)" in plan.describe()


def test_dry_run_prints_the_gpu_plan_and_starts_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SPECDEPLOY_CACHE"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # no measured timings: the stated assumptions
    reports = set((REPO / "reports").glob("*")) if (REPO / "reports").is_dir() else set()
    out = subprocess.run([sys.executable, "-m", "loadtest", "run", "configs/llama70b-7b.yaml", "--users", "1,32",
                          "--dry-run"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "load-test plan (dry run: nothing starts): configs/llama70b-7b.yaml" in out.stdout
    assert "server starts: 2 (spec-schedule 1, baseline 1)" in out.stdout
    assert "estimated duration:" in out.stdout and "estimated, no measured start time yet" in out.stdout
    assert "started vLLM" not in out.stderr
    assert (set((REPO / "reports").glob("*")) if (REPO / "reports").is_dir() else set()) == reports
    assert not (tmp_path / "cache").exists()  # a dry run records nothing


# ------------------------------------------------------------------------------------ effective K
def _vllm_counter_text(steps: list[tuple[int, int]]) -> str:
    """/metrics text as vLLM 0.32 writes it, from its own Prometheus logger of speculation
    (`vllm.v1.spec_decode.metrics.SpecDecodingProm`), after drafts of (draft tokens, accepted)."""
    import prometheus_client
    from vllm.v1.spec_decode.metrics import SpecDecodingProm, SpecDecodingStats

    registry = prometheus_client.CollectorRegistry()

    class Counter(prometheus_client.Counter):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, registry=registry, **kwargs)

    class Logger(SpecDecodingProm):
        _counter_cls = Counter

    logger = Logger(SimpleNamespace(num_speculative_tokens=4), ["model_name", "engine"], {0: ["m", "0"]})
    stats = SpecDecodingStats.new(4)
    for drafted, accepted in steps:
        stats.observe_draft(drafted, accepted)
    logger.observe(stats, 0)
    return prometheus_client.generate_latest(registry).decode()


def test_effective_k_is_draft_tokens_per_drafting_step() -> None:
    # A schedule's K=2 at batch 9-32, K=4 below: a run at 32 users drafts 2 a step, and 4 in its tail.
    before_text = _vllm_counter_text([(4, 3)] * 10)
    after_text = _vllm_counter_text([(4, 3)] * 10 + [(2, 1)] * 30 + [(4, 2)] * 2)
    assert "vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"m\"} 40.0" in before_text
    d = prom.delta(prom.Snapshot(prom.parse_metrics(before_text), 0.0),
                   prom.Snapshot(prom.parse_metrics(after_text), 10.0))
    assert (d.drafts, d.draft_tokens) == (32, 68)
    assert d.effective_k == pytest.approx(68 / 32) == pytest.approx(2.125)
    plain = prom.delta(prom.Snapshot(prom.parse_metrics("vllm:generation_tokens_total 5\n"), 0),
                       prom.Snapshot(prom.parse_metrics("vllm:generation_tokens_total 9\n"), 1))
    assert plain.effective_k is None and "effective_k" not in plain.to_json()


def test_the_report_shows_the_configured_k_beside_the_one_that_ran() -> None:
    def level(configured: int | None, effective: float | None) -> LevelResult:
        return LevelResult(concurrency=32, repeat=1, status="ok", configured_k=configured,
                           client=ClientFigures(ok=4, requests=4, output_tokens_per_s=10.0),
                           server=ServerFigures(effective_k=effective, acceptance_rate=0.5 if effective else None))

    results = SweepResults(variants=[VariantResult(name="spec-schedule", k=4, levels=[level(2, 2.125)]),
                                     VariantResult(name="baseline", levels=[level(None, None)])])
    rows = {r.variant: r for r in compare_rows(results)}
    assert rows["spec-schedule"].k == "2 (2.12)" and rows["baseline"].k == "-"
    assert "K (effective)" in compare_table(results)


def test_the_configured_k_follows_vllms_reading_of_the_schedule() -> None:
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    for schedule in ([[1, 8, 4], [9, 32, 2], [33, 1024, 0]], [[1, 4, 3], [10, 20, 1]], [[1, 2, 3]]):
        spec = load_config("embedded-code", ["speculation.num_speculative_tokens=4",
                                       f"speculation.schedule={schedule}"]).speculation
        lookup = build_dynamic_sd_schedule_lookup(schedule, 64, 4)
        assert [spec.k_at_batch(b) for b in range(1, 65)] == lookup[1:]
    assert load_config("embedded-code").speculation.k_at_batch(32) == 4
    assert load_config("embedded-code", no_speculation=True).speculation.k_at_batch(1) == 0


# ------------------------------------------------------------------------------------ make serve
def test_serve_prints_the_resolved_speculation_and_its_schedule(capsys) -> None:
    from deploy.__main__ import main

    assert main(["serve", "llama70b-7b", "--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == ("speculation: small_model (vLLM's draft_model), draft meta-llama/Llama-2-7b-chat-hf, K=4")
    assert lines[1] == "  K by running batch size: 1-8: 4, 9-32: 2, 33-1024: 0 (no drafts)"
    assert lines[2].startswith("  temperature gate: none, every request drafts; drafts sampled from the draft model")
    flag = lines[3].strip()
    assert flag.startswith("--speculative-config '{\"method\":\"draft_model\"")
    assert flag in out.split("vLLM command:", 1)[1]  # exactly what vLLM is given


def test_serve_names_a_plugin_drafters_temperature_gate(embedded_pair) -> None:
    from deploy import plan_from_config
    from deploy.engine_args import describe_speculation

    resolved, _ = plan_from_config("embedded-bigram", ["speculation.draft_max_temperature=0",
                                                       "speculation.schedule=[[1, 4, 4], [5, 64, 0]]"], plan_only=True)
    text = describe_speculation(resolved)
    assert "specdeploy's plugin plugins.bigram.BigramProposer" in text
    assert "1-4: 4, 5-64: 0 (no drafts) (the plugin reads it from --additional-config)" in text
    assert "requests at T <= 0 draft, hotter ones decode without drafts; drafts sampled by the plugin" in text
    assert describe_speculation(plan_from_config("embedded-code", no_speculation=True, plan_only=True)[0]) == \
        "speculation: off"
