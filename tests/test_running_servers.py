"""Load-testing servers that are already running (`--url`), service targets and the load
generator's own lag: the parts on plain data, then sweeps of real servers the test started
outside the runner."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from conftest import BASELINE, TEST_KEY, TEST_KEY_ENV as KEY_ENV
from deploy import free_port
from loadtest.measurement.results import LevelResult, SweepResults
from loadtest.measurement import slo
from loadtest.measurement.records import RequestRecord
from loadtest.traffic.endpoint import EndpointError, discover
from loadtest.traffic.locust_run import LocustOutcome
from loadtest.sweeps.settings import SweepSettings
from loadtest.sweeps.judging import load_generator_lag, load_generator_notes, send_lag_notes
from loadtest.sweeps.servers import running_servers
from loadtest.measurement.stats import percentile
from loadtest.reports.sweep_summary import exit_code, headline

REPO = Path(__file__).resolve().parents[1]


def _record(ttft: float, tpot: float, tokens: int = 10, ok: bool = True) -> RequestRecord:
    return RequestRecord(item_id="x", path="/v1/completions", start=0.0, ok=ok, ttft_s=ttft,
                         per_token_latency_s=tpot, e2e_s=ttft + tpot * (tokens - 1), output_tokens=tokens)


# ------------------------------------------------------------------------------------- service targets
def test_parse_targets_reads_units_and_refuses_what_it_cannot_read():
    targets = slo.parse_targets("ttft_p95=500ms, tpot_p99=0.05s,e2e_p50=2s")
    assert [(t.name, t.bound_s) for t in targets] == [("ttft_p95", 0.5), ("tpot_p99", 0.05), ("e2e_p50", 2.0)]
    for bad in ("ttft=500ms", "ttft_p95=500", "itl_p95=5ms", "ttft_p100=1s", "ttft_p95=0ms", "ttft_p95=1s,ttft_p95=2s",
                ""):
        with pytest.raises(ValueError, match="service target|percentile|twice"):
            slo.parse_targets(bad)


def test_evaluate_counts_failures_against_targets_and_goodput_keeps_only_good_requests():
    targets = slo.parse_targets("ttft_p50=100ms,tpot_p50=20ms")
    records = [_record(0.05, 0.01), _record(0.05, 0.01), _record(0.5, 0.01), _record(0.05, 0.05),
               _record(0.05, 0.01, ok=False)]
    result = slo.evaluate(records, targets, duration_s=2.0)
    ttft, tpot = result.targets["ttft_p50"], result.targets["tpot_p50"]
    assert ttft.share_within == pytest.approx(3 / 5) and ttft.met      # 60% >= 50%
    assert tpot.share_within == pytest.approx(3 / 5) and tpot.met
    assert ttft.value_ms == pytest.approx(50) and ttft.bound_ms == 500 / 5
    assert result.share_within_all == pytest.approx(2 / 5)
    assert result.goodput_tokens_per_s == pytest.approx(2 * 10 / 2.0)     # two requests met both
    assert result.met
    strict = slo.evaluate(records, slo.parse_targets("ttft_p90=100ms"), duration_s=2.0)
    assert not strict.met and not strict.targets["ttft_p90"].met    # 80% within < 90%
    assert strict.targets["ttft_p90"].value_ms is None                 # the 90th falls on the failed request


def test_the_percentile_shown_is_the_one_the_verdict_rests_on():
    """56 requests near 30 ms: with 2 at 55 ms, 96.4% are within and p95 <= 50 ms is met; with 3,
    94.6% are and it is missed, though numpy's interpolated p95 (about 40 ms) is below the bound."""
    target = slo.parse_targets("tpot_p95=50ms")
    for above, met in ((2, True), (3, False)):
        records = [_record(0.05, 0.030 + 0.0001 * i) for i in range(56 - above)] + [_record(0.05, 0.055)] * above
        t = slo.evaluate(records, target, duration_s=10).targets["tpot_p95"]
        assert t.met is met and (t.value_ms <= 50) is met, t
    assert percentile([r.per_token_latency_s for r in records], 95) * 1000 < 50  # the interpolated one would hide it
    assert slo.rank_percentile([3.0, None, 1.0, 2.0], 50) == 2.0 and slo.rank_percentile([1.0, None], 75) is None
    assert slo.rank_percentile([], 95) is None


def test_concurrency_meets_the_targets_only_when_every_run_does():
    targets = slo.parse_targets("ttft_p50=100ms,tpot_p50=20ms")
    records = [_record(0.05, 0.01), _record(0.05, 0.01), _record(0.5, 0.01), _record(0.05, 0.05),
               _record(0.05, 0.01, ok=False)]
    result = slo.evaluate(records, targets, duration_s=2.0)
    strict = slo.evaluate(records, slo.parse_targets("ttft_p90=100ms"), duration_s=2.0)
    levels = [LevelResult(concurrency=1, slo=result), LevelResult(concurrency=32, slo=strict),
              LevelResult(concurrency=8, slo=result), LevelResult(concurrency=8, slo=strict)]
    assert slo.highest_concurrency(levels) == 1                              # one run at 8 missed


def test_load_generator_lag_and_its_notes(tmp_path):
    records = [_record(0.01, 0.01) for _ in range(4)]
    for r, lag in zip(records, (None, 0.001, 0.002, 0.04)):
        r.send_lag_s = lag
    (tmp_path / "loop-lag-1.json").write_text(json.dumps({"probe_s": 0.01, "lags_s": [0.0001, 0.0002, 0.3, 0.1],
                                                           "stalls_s": [[0.3, 0.27], [0.1, 0.15]]}))
    lag = load_generator_lag(records, tmp_path)
    assert lag.send_lag_ms.n == 3 and lag.send_lag_ms.p50 == pytest.approx(2.0)
    assert lag.loop_lag_ms.max == pytest.approx(300) and lag.loop_lag_ms.over_50ms == 2
    # A wait longer than its stall (part of it in the asked sleep) explains the stall only.
    assert lag.stall_runqueue_share == pytest.approx((0.27 + 0.1) / 0.4)
    notes = load_generator_notes(LocustOutcome(0, None, [], wall_s=10, cpu_s=1), 0, lag)
    assert any("sent requests late" in n for n in send_lag_notes(lag)) and send_lag_notes(None) == []
    assert any("event loop stalled" in n and "92% of that time the OS kept it runnable" in n for n in notes)
    busy = dataclasses.replace(lag, stall_runqueue_share=0.1)
    assert any("only 10% of that time was run-queue wait" in n
               for n in load_generator_notes(LocustOutcome(0, None, [], wall_s=10, cpu_s=1), 0, busy))
    quiet = load_generator_lag(records[:3], tmp_path / "none")
    assert load_generator_notes(LocustOutcome(0, None, [], wall_s=10, cpu_s=1), 0, quiet) == []
    assert send_lag_notes(quiet) == []


# ------------------------------------------------------------------------------------- real servers
@pytest.fixture()
def keyed_baseline(servers):
    """The session's baseline server: it wants an API key (`$SPECDEPLOY_TEST_KEY`, set by conftest)."""
    return servers.get(*BASELINE)


@pytest.mark.engine
def test_sweep_of_running_servers_with_service_targets(servers, keyed_baseline, running_sweep):
    spec = servers.get("embedded-code")
    results, files, out = running_sweep
    assert results.status in ("ok", "flagged"), results.problems
    # What each server is was read from the server: name, speculation and its K.
    variants = {v.name: v for v in results.variants}
    assert list(variants) == ["spec-k4", "baseline"]
    assert variants["spec-k4"].speculative_config == {"num_speculative_tokens": 4}
    assert variants["baseline"].speculative_config is None
    assert {v.url for v in variants.values()} == {spec.base_url, keyed_baseline.base_url}
    for variant in variants.values():
        assert variant.served_model == "embedded-code"
        for level in variant.levels:
            assert level.status in ("ok", "flagged") and level.client.ok == 4
            assert level.consistency.ok                              # the engine's counter agrees
            assert level.vllm_bench.error is None                         # tokenizer found from /v1/models
            targets = level.slo.targets
            assert targets["ttft_p95"].met and targets["ttft_p95"].share_within == 1.0
            assert not targets["tpot_p50"].met and level.slo.goodput_tokens_per_s == 0
            assert not level.slo.met
            lag = level.load_generator
            assert lag.send_lag_ms.n == 4 - level.concurrency       # a user's first request has none
            assert lag.loop_lag_ms.n > 10 and lag.loop_lag_ms.p50 >= 0
            # Stalls over 50 ms, if any, say how much of them was the OS's run-queue wait.
            share = lag.stall_runqueue_share
            assert share is None or 0 <= share <= 1
            assert share is not None or lag.loop_lag_ms.over_50ms == 0
    # The servers were not the sweep's: both still serve.
    assert spec.alive() and keyed_baseline.alive()
    assert requests.get(f"{spec.base_url}/health", timeout=10).status_code == 200
    assert any(line.startswith("service targets") and "not met" in line for line in headline(results))
    text = files["markdown"].read_text()
    assert "## Service targets" in text and "MISSED" in text and "## The load generator's own lag" in text
    # The key never lands in what the sweep wrote: results, reports, Locust's and vLLM's outputs, logs.
    leaked = [str(f) for f in out.rglob("*") if f.is_file() and TEST_KEY.encode() in f.read_bytes()]
    assert not leaked, leaked


@pytest.mark.engine
def test_a_greedy_run_that_loops_is_flagged_in_the_reports_first_lines(servers, keyed_baseline, tmp_path):
    """The embedded target, greedy and forced to a fixed length, repeats one import line to the end
    after these prompts (after most built-in code prompts it loops too, later). The
    report says so before its verdict."""
    spec, out = servers.get("embedded-code"), tmp_path / "greedy"
    workload = tmp_path / "loops.jsonl"
    workload.write_text("".join(json.dumps({"prompt": p}) + "\n"
                                for p in ("def main():\n", "from .. import fixer_base\n", "class StreamError(Exception):\n")))
    # Speculation alone (no baseline): the content check is the same code for every variant.
    run = subprocess.run([sys.executable, "-m", "loadtest", "run", "--url", spec.base_url,
                          "--api-key-env", KEY_ENV, "--temperature", "0", "--workload",
                          str(workload), "--users", "1", "--repeat", "1", "--requests", "3", "--max-tokens", "64",
                          "--warmup", "0",
                          "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    results = SweepResults.load(out)
    # A flagged run (Locust and vLLM's benchmark may disagree on 3 requests) still exits 0: every
    # level was measured; the content check flags nothing by itself: it leads the report.
    assert results.status in ("ok", "flagged") and run.returncode == exit_code(results) == 0, run.stderr[-2000:]
    for variant in results.variants:
        level = variant.levels[0]
        for checked in (level.client.content, level.vllm_bench.content):
            assert checked.checked == 3 and checked.degenerate == 3, checked
            assert checked.loop_share > 0.5
    # The first screen: no verdict without a baseline, the content on the line, and CONTENT badges for
    # speculation's and vLLM's benchmark's outputs; the full findings lead with the loop.
    md = (out / "report.md").read_text()
    [line] = [x for x in md.splitlines() if x.startswith("- **batch 1")]
    assert line.startswith("- **batch 1: no comparison**") and "content: 3 of 3 degenerate" in line, line
    badges = [x for x in md.splitlines() if x.startswith("- **CONTENT** ")]
    assert any("speculation's output rests mostly on degenerate output" in b for b in badges), badges
    assert any("vLLM's benchmark's output rests mostly" in b for b in badges), badges
    findings = [x[2:] for x in md.split("## Every finding in full", 1)[1].splitlines() if x.startswith("- ")]
    assert findings[0].startswith("traffic: prompts of loops.jsonl through the completions API (/v1/completions), "
                                  "fixed lengths (64 output tokens each, ignore_eos), temperature 0"), findings[0]
    assert findings[1].startswith("batch 1, spec-k4: CONTENT: speculation's output rests mostly on degenerate output")
    assert any("vLLM's benchmark's output rests mostly" in x for x in findings[:3])


@pytest.mark.engine
def test_chat_traffic_on_the_embedded_default_end_to_end(servers, tmp_path):
    """`--workload chat` on the embedded default: chat prompts through the chat API (the config's
    plain chat template), each answer ending at the model's end of text or at the maximum, Locust
    and vLLM's benchmark alike; the report's first line says which traffic ran."""
    spec, out = servers.get("embedded-code"), tmp_path / "chat"
    run = subprocess.run([sys.executable, "-m", "loadtest", "run", "embedded-code.yaml", "--url", spec.base_url,
                          "--api-key-env", KEY_ENV, "--workload", "chat", "--no-fixed-length", "--max-tokens", "32",
                          "--users", "1", "--repeat", "1", "--requests", "3", "--warmup", "0", "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    results = SweepResults.load(out)
    assert results.status in ("ok", "flagged") and run.returncode == exit_code(results) == 0, run.stderr[-2000:]
    assert "traffic: chat prompts through the chat API (/v1/chat/completions), natural lengths" in run.stderr
    (variant,) = results.variants
    level = variant.levels[0]
    assert level.status in ("ok", "flagged"), level.problems
    assert level.client.requests == 3 and level.client.failed == 0
    assert 3 <= level.client.output_tokens <= 3 * 32  # natural lengths: each at most the maximum
    assert level.vllm_bench.error is None and level.vllm_bench.completed == 3, level.vllm_bench
    records = [json.loads(line) for f in sorted((out / level.locust.records).glob("*.jsonl"))
               for line in f.read_text().splitlines()]
    assert {r["path"] for r in records} == {"/v1/chat/completions"}
    # The first screen's setup says which traffic ran; the full findings begin with it.
    md = (out / "report.md").read_text()
    setup = next(x for x in md.splitlines() if x.startswith("**Setup.**"))
    assert "Traffic: chat prompts through the chat API (/v1/chat/completions), natural lengths" in setup, setup
    findings = [x[2:] for x in md.split("## Every finding in full", 1)[1].splitlines() if x.startswith("- ")]
    assert findings[0] == ("traffic: chat prompts through the chat API (/v1/chat/completions), natural lengths (each "
                           "ends at the model's end of text, at most 32 tokens), temperature 1 (embedded-code.yaml's traffic "
                           "section; from the command line: --workload, --max-tokens, --fixed-length/--no-fixed-length)")


@pytest.mark.engine
def test_the_api_key_guards_every_route_but_health(keyed_baseline):
    """vLLM alone checks the key only under /v1 (and a few prefixes): /invocations would serve
    completions, /tokenize and /metrics would answer anyone. With specdeploy's middleware only
    /health answers without the key."""
    base, key = keyed_baseline.base_url, {"Authorization": "Bearer sk-test-running"}
    completion = {"model": "embedded-code", "prompt": "def f(", "max_tokens": 2}
    routes = [("GET", "/v1/models", None), ("POST", "/invocations", completion),
              ("POST", "/tokenize", {"model": "embedded-code", "prompt": "def f("}),
              ("POST", "/detokenize", {"model": "embedded-code", "tokens": [1, 2]}),
              ("GET", "/metrics", None), ("GET", "/docs", None), ("GET", "/openapi.json", None),
              ("POST", "/scale_elastic_ep", {"new_data_parallel_size": 2}), ("GET", "/load", None)]
    for method, path, body in routes:
        reply = requests.request(method, base + path, json=body, timeout=60)
        assert reply.status_code == 401, (path, reply.status_code, reply.text[:200])
        wrong = requests.request(method, base + path, json=body, timeout=60, headers={"Authorization": "Bearer no"})
        assert wrong.status_code == 401, (path, wrong.status_code)
    assert requests.get(base + "/health", timeout=10).status_code == 200
    for method, path, body in routes[:3] + routes[4:5]:
        assert requests.request(method, base + path, json=body, headers=key, timeout=120).status_code == 200, path


@pytest.mark.engine
def test_running_server_problems_are_one_clear_line(servers, keyed_baseline, monkeypatch, tmp_path):
    spec = servers.get("embedded-code")
    nobody = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EndpointError, match="cannot reach .*is the server running"):
        discover(nobody)
    with pytest.raises(EndpointError, match="does not serve 'llama'; it serves: embedded-code"):
        discover(spec.base_url, model="llama")
    with pytest.raises(EndpointError, match="wants an API key: name the variable"):
        discover(keyed_baseline.base_url)
    monkeypatch.setenv("SPECDEPLOY_WRONG_KEY", "sk-wrong")
    with pytest.raises(EndpointError, match="the key in \\$SPECDEPLOY_WRONG_KEY was refused"):
        discover(keyed_baseline.base_url, api_key_env="SPECDEPLOY_WRONG_KEY")
    with pytest.raises(EndpointError, match="SPECDEPLOY_UNSET_KEY is not set"):
        discover(keyed_baseline.base_url, api_key_env="SPECDEPLOY_UNSET_KEY")
    with pytest.raises(EndpointError, match="baseline server .* speculates"):
        list(running_servers(SweepSettings("", url=spec.base_url, baseline_url=spec.base_url)))
    remote = discover(keyed_baseline.base_url, api_key_env=KEY_ENV)
    assert remote.served_name == "embedded-code" and not remote.speculates and remote.metrics
    # The command line: one line on stderr, exit 2, nothing else.
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    for args, expected in ((["--url", nobody], "cannot reach"),
                           (["--url", spec.base_url, "--model", "llama"], "does not serve 'llama'"),
                           (["--url", keyed_baseline.base_url], "wants an API key")):
        out = subprocess.run([sys.executable, "-m", "loadtest", "run", *args, "--users", "1",
                              "--out", str(tmp_path / "r")], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=120)
        errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
        assert out.returncode == 2 and len(errors) == 1 and expected in errors[0], out.stderr
        assert "Traceback" not in out.stderr and out.stdout.strip() == ""
