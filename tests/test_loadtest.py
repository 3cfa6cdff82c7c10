"""Load tests (`loadtest/`): the pure parts fast, Locust against a small fake SSE server, and the
sweep for real (vLLM engines on the embedded default, real HTTP, real Locust).

The engine tests start their own servers through the runner (that is the feature under test),
on free ports, one at a time; they do not use the conftest pool.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from dataclasses import fields, replace
from typing import Any

import numpy as np
import pytest
import requests

from conftest import BASELINE, TEST_KEY_ENV, metric_total
from loadtest.measurement.figures import (BenchFigures, ClientFigures, Distribution, HistogramFigures, PerRequest,
                                          ServerFigures)
from loadtest.measurement.results import Closed, SweepResults
from loadtest.measurement import prom
from loadtest.measurement import stats
from loadtest.measurement.records import RequestRecord
from loadtest.traffic.client import StreamParser, sse_events, stream_request
from loadtest.__main__ import build_parser
from loadtest.traffic.locust_run import LocustJob, commands, run_locust
from loadtest.traffic.request_settings import RequestSettings, settings_record
from loadtest.sweeps.plan import run_order
from loadtest.reports.report import compare_table, write_report
from loadtest.reports.sweep_summary import headline
from loadtest.sweeps.settings import SweepSettings, plan_variants, requests_for
from loadtest.measurement.records import load_records
from loadtest.sweeps.runner import Sweep
from loadtest.traffic.workloads import BUILTIN, load_workload, request_for

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("SPECDEPLOY_NO_PROGRESS", "1")  # keep pytest's captured output small

METRICS = """\
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 1200.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 400.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 250.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 90.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 70.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 50.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="3"} 40.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="m"} 8.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 3.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 10.0
weird_metric{path="a \\"quoted\\", value"} 7 1700000000000
"""


# ----------------------------------------------------------------------------------------- /metrics
def test_parse_metrics_labels_histograms_and_totals():
    snap = prom.Snapshot(prom.parse_metrics(METRICS), 0.0)
    assert snap.total(prom.GEN_TOKENS) == 1200
    assert snap.total("absent_metric") == 0
    assert snap.by_label(prom.ACCEPTED_PER_POS, "position") == {"0": 90, "1": 70, "2": 50, "3": 40}
    assert snap.samples["weird_metric"][0] == ((("path", 'a "quoted", value'),), 7.0)
    hist = snap.histogram("vllm:time_to_first_token_seconds")
    assert (hist.sum, hist.count) == (3.0, 10.0)
    assert hist.mean == pytest.approx(0.3)
    # Prometheus histogram_quantile: the 5th of 10 observations lies in (0.1, 0.5], 1/4 of the way in.
    assert hist.quantile(0.5) == pytest.approx(0.2)
    assert hist.quantile(0.99) == pytest.approx(0.5)  # in the +Inf bucket: the highest finite bound


def test_delta_gives_vllm_benchmark_acceptance_formulas():
    before = prom.Snapshot(prom.parse_metrics(METRICS), 100.0)
    after_text = (METRICS.replace("1200.0", "1500.0").replace("} 100.0", "} 160.0").replace("} 400.0", "} 640.0")
                  .replace("} 250.0", "} 370.0").replace('position="0"} 90.0', 'position="0"} 140.0'))
    after = prom.Snapshot(prom.parse_metrics(after_text), 110.0)
    d = prom.delta(before, after)
    assert d.spec_enabled and d.interval_s == 10.0
    assert (d.generation_tokens, d.drafts, d.draft_tokens, d.accepted_tokens) == (300, 60, 240, 120)
    assert d.acceptance_rate == pytest.approx(120 / 240)           # accepted / draft tokens
    assert d.mean_accepted_length == pytest.approx(1 + 120 / 60)   # 1 + accepted / drafts
    assert d.per_position_acceptance == pytest.approx([50 / 60, 0, 0, 0])
    no_spec = prom.delta(prom.Snapshot(prom.parse_metrics("vllm:generation_tokens_total 5\n"), 0),
                         prom.Snapshot(prom.parse_metrics("vllm:generation_tokens_total 9\n"), 1))
    assert not no_spec.spec_enabled and no_spec.acceptance_rate is None and no_spec.mean_accepted_length is None


# ----------------------------------------------------------------------------------------- math
def test_percentile_matches_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100):
        values = list(rng.exponential(size=n))
        for p in (0, 50, 90, 95, 99, 100):
            assert stats.percentile(values, p) == pytest.approx(np.percentile(values, p))
    assert stats.percentile([], 50) is None
    assert stats.percentile([4, 1, 3, 2], 25) == 1.75 and type(stats.percentile([4, 1, 3, 2], 25)) is float
    assert stats.percentile(np.array([2.0, 1.0]), 50) == 1.5  # an array is not asked for its truth value
    d = stats.distribution([0.001, 0.002, 0.003], scale=1000)
    assert d.n == 3 and d.mean == pytest.approx(2.0) and d.p50 == pytest.approx(2.0)


def test_expected_tokens_per_step():
    assert stats.expected_tokens_per_step(0.5, 4) == pytest.approx((1 - 0.5**5) / 0.5)  # 1.9375
    assert stats.expected_tokens_per_step(0.0, 4) == 1.0
    assert stats.expected_tokens_per_step(1.0, 4) == 5.0
    assert stats.expected_tokens_per_step(0.999999, 4) == pytest.approx(5.0, rel=1e-5)
    assert stats.expected_tokens_per_step(0.8, 1) == pytest.approx(1.8)
    # Geometric series by brute force.
    assert stats.expected_tokens_per_step(0.7, 6) == pytest.approx(sum(0.7**i for i in range(7)))


def test_break_even_acceptance_inverts_expected_tokens():
    for k in (1, 2, 4, 8):
        for r in (1.2, 1.5, 2.0, k + 0.5):
            if r >= k + 1:
                assert stats.break_even_acceptance(r, k) is None
                continue
            a = stats.break_even_acceptance(r, k)
            assert 0 < a < 1
            assert stats.expected_tokens_per_step(a, k) == pytest.approx(r, rel=1e-9)
    assert stats.break_even_acceptance(0.9, 4) == 0.0   # cheaper than a target step: always pays
    assert stats.break_even_acceptance(5.0, 4) is None  # costs K+1 steps: never pays


def test_implied_per_token_acceptance():
    # Acceptance stops at the first rejection: with per-token a = 0.8 and K = 4, vLLM's alpha is
    # (a + a^2 + a^3 + a^4) / 4 and the tokens per step L = 1 + K alpha = E(0.8, 4).
    a, k = 0.8, 4
    alpha = sum(a**i for i in range(1, k + 1)) / k
    length = 1 + k * alpha
    assert length == pytest.approx(stats.expected_tokens_per_step(a, k))
    assert stats.implied_per_token_acceptance(length, k) == pytest.approx(a)
    assert stats.expected_tokens_per_step(alpha, k) < length  # E(alpha) understates L
    assert stats.implied_per_token_acceptance(1.0, k) == pytest.approx(0.0, abs=1e-9)
    assert stats.implied_per_token_acceptance(6.0, k) is None


def test_speculation_analysis_cost_model():
    # Baseline: 10 ms a token. Speculation: 5 ms a token at 3 tokens a step -> 15 ms a step = 1.5 target steps.
    out = stats.speculation_analysis(0.5, 3.0, 4, tpot_spec_s=0.005, tpot_base_s=0.010)
    assert out.step_cost_ratio == pytest.approx(1.5)
    assert out.break_even_acceptance_rate == pytest.approx(0.5 / 4)  # L = 1 + 4 alpha* = r
    assert stats.expected_tokens_per_step(out.break_even_per_token_acceptance, 4) == pytest.approx(1.5)
    assert out.measured_speedup == pytest.approx(2.0) and out.pays
    assert out.expected_tokens_per_step == pytest.approx(stats.expected_tokens_per_step(0.5, 4))
    assert stats.expected_tokens_per_step(out.implied_per_token_acceptance, 4) == pytest.approx(3.0)
    # A step costing 5.5 target steps can never pay at K = 4 (at most 5 tokens a step).
    slow = stats.speculation_analysis(0.6, 3.4, 4, tpot_spec_s=0.0162, tpot_base_s=0.010)
    assert slow.step_cost_ratio > 5 and not slow.pays
    assert slow.break_even_acceptance_rate is None and slow.break_even_per_token_acceptance is None
    assert slow.measured_speedup == pytest.approx(0.010 / 0.0162)
    assert stats.speculation_analysis(0.6, 3.0, 4, None, 0.01).step_cost_ratio is None


def test_notes_say_where_latency_is_lost():
    from loadtest.traffic.locust_run import LocustOutcome
    from loadtest.sweeps.judging import delivery_notes, load_generator_notes

    client = ClientFigures(ttft_ms=Distribution(mean=300.0))
    server = ServerFigures(histograms={"ttft_s": HistogramFigures(mean=0.010)})
    idle, busy = LocustOutcome(0, wall_s=10, cpu_s=1), LocustOutcome(0, wall_s=10, cpu_s=9)
    assert "API server is the likely cause" in delivery_notes(client, server, idle, 0)[0]
    assert "load generator was busy" in delivery_notes(client, server, busy, 0)[0]
    assert delivery_notes(ClientFigures(ttft_ms=Distribution(mean=30.0)), server, idle, 0) == []
    assert load_generator_notes(idle, 0) == [] and "--workers" in load_generator_notes(busy, 0)[0]
    assert load_generator_notes(busy, 2) == []  # 9 s of CPU over 2 worker processes


def test_agreement_tolerance():
    assert stats.agreement(100, 100).ok
    assert stats.agreement(96, 100).ok and not stats.agreement(94, 100).ok
    assert stats.agreement(0, 0).ok and not stats.agreement(5, 0).ok


def _pairs(locust_ms: list[float], bench_ms: list[float]) -> tuple[list[RequestRecord], PerRequest, list[str]]:
    """Locust records and the benchmark's per-request figures for the same prompt sequence."""
    ids = [f"p{i % 6}" for i in range(len(locust_ms))]
    records = [RequestRecord(item_id=ids[i], path="/v1/completions", start=float(i), ok=True, ttft_s=t / 1000,
                             per_token_latency_s=0.005) for i, t in enumerate(locust_ms)]
    return records, PerRequest(ttft_ms=list(bench_ms), per_token_ms=[5.0] * len(bench_ms)), ids


def test_latency_agreement_is_judged_request_by_request():
    """Short prompts ~30 ms and long ones ~50 ms, the median on the cliff between them: noise on
    two requests moves Locust's p50 by 15% while each request agrees within 2%. Matched, the
    clients agree; a client 20% slower on every request does not."""
    from loadtest.measurement import second_opinion

    bench = [30.0, 30.5, 31.0, 50.0, 50.5, 51.0] * 4
    locust = [b * 1.01 for b in bench]
    locust[3], locust[9] = 30.2, 30.4  # two long prompts served fast this time: the p50 falls off the cliff
    records, per_request, ids = _pairs(locust, bench)
    client = ClientFigures(requests=len(records), ttft_ms=Distribution(p50=float(np.median(locust))),
                           per_token_latency_ms=Distribution(p50=5.0), output_tokens_per_s=100.0)
    theirs = BenchFigures(per_request=per_request, ttft_ms=Distribution(p50=float(np.median(bench))),
                          per_token_latency_ms=Distribution(p50=5.0), output_tokens_per_s=100.0)
    matched = second_opinion.matched_ratios(records, theirs, ids)
    assert len(matched["ttft_p50_ms"]) == len(bench)
    verdict = second_opinion.compare(client, theirs, matched=matched)
    assert abs(verdict.ttft_p50_ms.difference) > 0.10  # the p50s alone would flag it
    assert verdict.ttft_p50_ms.matched_difference == pytest.approx(0.01, abs=0.002) and verdict.agrees
    slow, _, _ = _pairs([b * 1.2 for b in bench], bench)
    verdict = second_opinion.compare(client, theirs, matched=second_opinion.matched_ratios(slow, theirs, ids))
    assert verdict.ttft_p50_ms.matched_difference == pytest.approx(0.2) and verdict.agrees is False
    # Requests that are not the same prompt at the same place are not paired.
    shuffled = [RequestRecord(**{**r.__dict__, "item_id": "other"}) for r in records]
    assert second_opinion.matched_ratios(shuffled, theirs, ids)["ttft_p50_ms"] == []


# ----------------------------------------------------------------------------------------- streaming
def _events(*objs: Any) -> list[str]:
    return [o if isinstance(o, str) else json.dumps(o) for o in objs]


def _feed(events: list[str], expected: int | None = None, dt: float = 0.01) -> RequestRecord:
    rec = RequestRecord(item_id="x", path="/v1/completions", start=0.0, expected_tokens=expected)
    parser = StreamParser(rec, 0.0)
    t = 0.1
    for e in events:
        parser.feed(e, t)
        t += dt
    return parser.finish(t)


def _chunk(total: int, text: str = "x") -> dict:
    return {"choices": [{"index": 0, "text": text}], "usage": {"prompt_tokens": 3, "completion_tokens": total}}


def _final(total: int) -> dict:
    return {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": total}}


def test_stream_parser_counts_tokens_per_chunk_not_chunks():
    # Speculation: one chunk can carry several tokens; usage, not the chunk count, is the truth.
    rec = _feed(_events(_chunk(1), _chunk(4), _chunk(8), _chunk(10), _final(10), "[DONE]"), expected=10)
    assert rec.ok, rec.error
    assert rec.output_tokens == 10 and rec.tokens_per_chunk == [1, 3, 4, 2]
    assert rec.ttft_s == pytest.approx(0.1)
    assert rec.chunk_gaps_s == pytest.approx([0.01, 0.01, 0.01])
    # (e2e - ttft) / tokens after the first chunk: (0.16 - 0.1) / 9
    assert rec.per_token_latency_s == pytest.approx((0.16 - 0.1) / 9)


def test_stream_parser_chat_role_chunk_is_not_the_first_token():
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 0}}
    tok = {"choices": [{"index": 0, "delta": {"content": "hi"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    rec = _feed(_events(role, tok, _final(2), "[DONE]"))
    assert rec.ok and rec.ttft_s == pytest.approx(0.11) and rec.tokens_per_chunk == [2]


@pytest.mark.parametrize("events, reason", [
    (_events(_chunk(1), _chunk(2), _final(2)), "no [DONE]"),
    (_events(_chunk(1), _chunk(2), "[DONE]"), "no usage"),
    (_events(_chunk(1), _chunk(2), _final(2), "[DONE]"), "2 of 5 tokens"),
    (_events(_chunk(1), {"error": {"message": "engine died", "code": 500}}, "[DONE]"), "engine died"),
    (_events("{not json"), "unparsable"),
])
def test_stream_parser_failures_are_kept_with_their_reason(events, reason):
    rec = _feed(events, expected=5)
    assert not rec.ok and reason in rec.error


def test_sse_events_split_anywhere():
    stream = b'data: {"a": 1}\n\ndata: {"b": 2}\r\n\r\ndata: [DONE]\n\n'
    for size in (1, 3, 7, len(stream)):
        pieces = [stream[i:i + size] for i in range(0, len(stream), size)]
        assert list(sse_events(pieces)) == ['{"a": 1}', '{"b": 2}', "[DONE]"]
    assert list(sse_events([b'data: {"cut'])) == ['{"cut']


# ----------------------------------------------------------------------------------------- workloads
def test_builtin_workloads_and_request_bodies(tmp_path):
    for name in BUILTIN:
        assert load_workload(name).items
    code = load_workload("code").items[0]
    path, body = request_for(code, "m", 64, 0.0, fixed_length=True)
    assert path == "/v1/completions" and body["ignore_eos"] and body["max_tokens"] == 64 and body["stream"]
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    chat = load_workload("chat").items[0]
    path, body = request_for(chat, "m", 64, 0.7, fixed_length=False)
    assert path == "/v1/chat/completions" and body["messages"] and "ignore_eos" not in body
    assert body["temperature"] == 0.7
    path, body = request_for(chat, "m", 64, 0.0, fixed_length=True, api="completions")
    assert path == "/v1/completions" and body["prompt"].endswith("Assistant:")

    jsonl = tmp_path / "w.jsonl"
    jsonl.write_text('{"prompt": "def f():", "max_tokens": 9}\n\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    items = load_workload(str(jsonl)).items
    assert [i.prompt for i in items] == ["def f():", None] and items[1].messages
    assert request_for(items[0], "m", 64, 0.0, fixed_length=False)[1]["max_tokens"] == 9
    assert request_for(items[0], "m", 64, 0.0, fixed_length=True)[1]["max_tokens"] == 64
    share = tmp_path / "sg.json"
    share.write_text(json.dumps([{"id": "a", "conversations": [{"from": "human", "value": "Q?"},
                                                               {"from": "gpt", "value": "A" * 40}]},
                                 {"conversations": [{"from": "gpt", "value": "orphan"}]}]))
    items = load_workload(str(share)).items
    assert len(items) == 1 and items[0].messages[0]["content"] == "Q?" and items[0].max_tokens == 10
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt"}\n')
    with pytest.raises(ValueError, match="prompt"):
        load_workload(str(bad))
    with pytest.raises(ValueError, match="neither"):
        load_workload("no-such-set")


@pytest.mark.parametrize("name, text, expected", [
    ("bad.json", '[{"conversations": "x"}]', "entry 0 is not a ShareGPT conversation"),
    ("bad2.json", '[{"conversations": [{"from": "human", "value": 5}]}]', "entry 0 is not a ShareGPT conversation"),
    ("bad3.json", '[7]', "entry 0 is not a ShareGPT conversation"),
    ("bad4.json", '[{"conversations": [', "not valid JSON"),
    ("bad.jsonl", '{"prompt": 5}', ":1: 'prompt' must be a string"),
    ("bad2.jsonl", '{"messages": [{"role": "user"}]}', "'messages' must be a list of"),
    ("bad3.jsonl", '{"prompt": "x", "max_tokens": "many"}', "'max_tokens' must be a positive integer"),
])
def test_malformed_workload_files_are_refused_before_anything_starts(tmp_path, name, text, expected):
    """A malformed entry used to reach Locust and kill every user (each level then waited out its timeout)."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(expected)):
        load_workload(str(path))
    (tmp_path / "latin1.jsonl").write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(ValueError, match="not UTF-8"):
        load_workload(str(tmp_path / "latin1.jsonl"))
    settings = SweepSettings("embedded-code", request=RequestSettings(workload=str(path)), users=[1], out=tmp_path / "report")
    started = time.monotonic()
    results = Sweep(settings).run()
    assert results.status == "failed" and expected in "; ".join(results.problems)
    assert not results.variants and time.monotonic() - started < 30  # no server was started


def test_requests_per_user_and_variants():
    assert requests_for(1, None) == 32 and requests_for(32, None) == 256 and requests_for(4, 10) == 10
    names = [v.name for v in plan_variants(SweepSettings("embedded-code", extra_k=[2, 4, 8]))]
    assert names == ["spec-k4", "spec-k2", "spec-k8", "baseline"]
    assert [v.name for v in plan_variants(SweepSettings("embedded-code", no_spec=True))] == ["baseline"]
    assert [v.name for v in plan_variants(SweepSettings("embedded-code", baseline=False))] == ["spec-k4"]


def test_variants_take_turns_and_who_goes_first_alternates():
    names = [v.name for v in plan_variants(SweepSettings("embedded-code", extra_k=[2]))]
    order = run_order(names, [1, 32], 3, together=True)
    assert order[:6] == [(1, 1, "spec-k4"), (1, 1, "spec-k2"), (1, 1, "baseline"),
                         (2, 1, "baseline"), (2, 1, "spec-k2"), (2, 1, "spec-k4")]
    assert order[6:9] == [(3, 1, "spec-k4"), (3, 1, "spec-k2"), (3, 1, "baseline")]
    assert [c for _, c, _ in order] == [1] * 9 + [32] * 9 and order[9] == (1, 32, "spec-k4")
    # One server at a time (GPUs): each variant's levels in a row, every repeat restarting them.
    assert run_order(names, [1, 32], 1, together=False)[:3] == [(1, 1, "spec-k4"), (1, 32, "spec-k4"), (1, 1, "spec-k2")]


def test_servers_run_together_only_where_kv_weights_and_processes_fit(tmp_path, monkeypatch):
    # Real plans of the embedded default (preflight reads the built pair; no engine starts), on a
    # machine whose memory is set: 6 servers x (KV + 2.0 GiB of processes + ~0.25 GiB of weights).
    from deploy.preflight import Machine

    monkeypatch.setenv("SPECDEPLOY_PAIR", "cost")  # the served weights, not the suite's plumbing target

    def fits(kv_gib: int, host_gib: float) -> bool:
        settings = SweepSettings("embedded-code", extra_k=[1, 2, 3, 5], out=tmp_path,
                                 overrides=[f"resources.cpu_kvcache_space_gib={kv_gib}"])
        sweep = Sweep(settings)
        planned = [sweep._prepare(v) for v in plan_variants(settings)]
        assert len(planned) == 6 and all(s.plan.device == "cpu" for s in planned)
        assert all(0.05 * 2**30 < s.resolved.weight_bytes < 0.5 * 2**30 for s in planned)
        for s in planned:
            s.resolved = replace(s.resolved, machine=Machine(0, 0.0, host_gib))
        return sweep._plan_started({s.entry.name: s for s in planned}).together

    assert fits(1, 25)        # ~19.5 GiB <= 20.0: the tune proof's six servers
    assert not fits(2, 25)    # ~25.5 GiB: the KV caches count
    assert not fits(1, 23)    # ~19.5 GiB > 18.4: the processes and weights count


def test_request_settings_reach_every_command_line_unchanged():
    # Declared once (loadtest.traffic.request_settings): the options they write are the options read back,
    # by the sweep's CLI and by each Locust process.
    custom = RequestSettings(workload="chat", api="chat", max_tokens=7, fixed_length=False, temperature=0.7,
                             request_timeout_s=12.5, arrival_gap_s=0.0)
    # Every field away from its default: a field `as_options` or `add_cli_args` leaves out fails below.
    assert all(getattr(custom, f.name) != f.default for f in fields(RequestSettings))
    parser = argparse.ArgumentParser()
    RequestSettings.add_cli_args(parser)
    assert RequestSettings.from_cli_args(parser.parse_args(custom.as_options())) == custom
    assert RequestSettings.from_cli_args(parser.parse_args([])) == RequestSettings()
    cli = build_parser().parse_args(["run", *custom.as_options()[:-6], "--request-timeout", "12.5",
                                     "--arrival-gap", "0", "--temperature", "0.7,1"])
    assert RequestSettings.from_cli_args(cli, temperature=cli.temperature[0]) == custom
    job = LocustJob(host="http://127.0.0.1:1", load=Closed(2), records_dir=Path("rec"), model="m", request=custom, workers=2)
    for argv in commands(job, deadline_s=60):  # the master and both workers
        known, _ = parser.parse_known_args(argv)
        assert RequestSettings.from_cli_args(known) == custom
    # results.json keeps them flat beside the sweep's own settings, as older reports have them.
    record = settings_record(SweepSettings("embedded-code", request=custom, out=Path("x")))
    assert record["max_tokens"] == 7 and record["fixed_length"] is False and "request" not in record
    assert record["out"] == "x"


def test_runner_never_imports_locust():
    # Importing locust monkey-patches the whole process with gevent: only its subprocesses may.
    code = ("import sys; import loadtest.__main__, loadtest.sweeps.runner, loadtest.reports.report; "
            "from loadtest.sweeps.provenance import machine_info; machine_info(); "
            "assert 'locust' not in sys.modules and 'gevent' not in sys.modules, 'locust imported'")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


# ------------------------------------------------- streaming protocol (a fixed SSE fixture: exact chunking)
class _FakeVLLM(BaseHTTPRequestHandler):
    """Streams like vLLM: per-chunk usage, 3 tokens a chunk, final usage, [DONE]; "CUT" cuts the stream;
    "TRICKLE" sends one token, then only SSE comments (`: keep-alive`) every 50 ms, for 10 s."""

    protocol_version = "HTTP/1.1"
    generated = 0
    lock = threading.Lock()

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = f"vllm:generation_tokens_total {type(self).generated}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(data: str) -> None:
            raw = f"data: {data}\n\n".encode()
            self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            self.wfile.flush()

        if "TRICKLE" in json.dumps(req):
            send(json.dumps({"choices": [{"index": 0, "text": "x"}], "usage": {"prompt_tokens": 4, "completion_tokens": 1}}))
            for _ in range(200):
                comment = b": keep-alive\n\n"
                self.wfile.write(f"{len(comment):x}\r\n".encode() + comment + b"\r\n")
                self.wfile.flush()
                time.sleep(0.05)
            self.wfile.write(b"0\r\n\r\n")
            return
        done, cut, chat = 0, "CUT" in json.dumps(req), self.path.endswith("/chat/completions")
        if chat:  # the chat API opens with a role-only chunk that carries no token
            send(json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                             "usage": {"prompt_tokens": 4, "completion_tokens": 0}}))
        while done < req["max_tokens"]:
            step = min(1 if done == 0 else 3, req["max_tokens"] - done)
            done += step
            with self.lock:
                type(self).generated += step
            choice = {"index": 0, "delta": {"content": "x" * step}} if chat else {"index": 0, "text": "x" * step}
            send(json.dumps({"choices": [choice], "usage": {"prompt_tokens": 4, "completion_tokens": done}}))
            time.sleep(0.005)
            if cut and done >= 4:
                break
        if not cut:
            send(json.dumps({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": done}}))
            send("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


@pytest.fixture(scope="module")
def fake_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeVLLM)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_stream_request_over_http(fake_server):
    with requests.Session() as session:
        path, body = request_for(load_workload("code").items[0], "m", 10, 0.0, fixed_length=True)
        rec = stream_request(session, fake_server, path, body, "code-0", 30, expected_tokens=10)
        assert rec.ok, rec.error
        assert rec.output_tokens == 10 and rec.tokens_per_chunk == [1, 3, 3, 3] and rec.prompt_tokens == 4
        body["prompt"] = "CUT"
        rec = stream_request(session, fake_server, path, body, "cut", 30, expected_tokens=10)
        assert not rec.ok and "stream ended early" in rec.error and rec.tokens_seen == 4
        path, body = request_for(load_workload("chat").items[0], "m", 10, 0.0, fixed_length=True)
        rec = stream_request(session, fake_server, path, body, "chat-0", 30, expected_tokens=10)
        assert path == "/v1/chat/completions" and rec.ok, rec.error
        assert rec.tokens_per_chunk == [1, 3, 3, 3] and rec.chunk_gaps_s and len(rec.chunk_gaps_s) == 3
        rec = stream_request(session, "http://127.0.0.1:9", path, body, "refused", 5)
        assert not rec.ok and "ConnectionError" in rec.error


def test_stream_request_deadline_holds_against_a_trickling_server(fake_server):
    """Bytes keep arriving (SSE comments), so no read ever times out: the deadline must still cut."""
    path, body = request_for(load_workload("code").items[0], "m", 10, 0.0, fixed_length=True)
    body["prompt"] = "TRICKLE"
    with requests.Session() as session:
        t0 = time.perf_counter()
        rec = stream_request(session, fake_server, path, body, "trickle", 1.0, expected_tokens=10)
        took = time.perf_counter() - t0
    assert not rec.ok and rec.error.startswith("timeout: no complete response within 1 s"), rec.error
    assert rec.tokens_seen == 1 and took < 2.0, took


@pytest.mark.parametrize("workers", [0, 2])
def test_a_crashed_locust_user_fails_the_run_at_once(fake_server, tmp_path, workers):
    """A user that dies (here: its workload file vanished after the runner checked it) would leave
    a closed loop waiting out its deadline for requests nobody sends; Locust must quit with the reason."""
    job = LocustJob(host=fake_server, load=Closed(2), records_dir=tmp_path / "rec", model="m",
                    request=RequestSettings(max_tokens=5, workload=str(tmp_path / "gone.jsonl")), requests=4, workers=workers)
    outcome = run_locust(job, deadline_s=120)
    assert outcome.aborted and ("exited with code 3" in outcome.aborted or "died (exit code 3)" in outcome.aborted), \
        (outcome.aborted, outcome.log_tail)
    assert outcome.wall_s < 60, outcome.wall_s


def _served_tokens(server) -> float:
    return metric_total(server, "vllm:generation_tokens_total")


@pytest.mark.engine
@pytest.mark.parametrize("workers", [0, 2])
def test_locust_closed_loop_local_and_distributed(servers, tmp_path, workers):
    """Real Locust (one process, then a master and 2 workers) against the real engine."""
    server = servers.get("embedded-code")
    before = _served_tokens(server)
    job = LocustJob(host=server.base_url, load=Closed(3), records_dir=tmp_path / "rec", model=server.plan.served_name,
                    request=RequestSettings(max_tokens=7), requests=6, workers=workers, csv_prefix=tmp_path / "locust",
                    html=tmp_path / "l.html")
    outcome = run_locust(job, deadline_s=300)
    assert outcome.aborted is None and outcome.exit_code == 0, outcome.log_tail
    records = load_records(tmp_path / "rec")
    assert len(records) == 6 and all(r.ok for r in records), [r.error for r in records]
    assert all(r.output_tokens == 7 and sum(r.tokens_per_chunk) == 7 for r in records)
    assert _served_tokens(server) - before == 6 * 7  # the server's counter agrees exactly
    # Locust's own CSV has the final numbers: a row per request kind, every request counted.
    import csv

    rows = {(r["Type"], r["Name"]): r for r in csv.DictReader((tmp_path / "locust_stats.csv").open())}
    assert int(rows[("POST", "/v1/completions")]["Request Count"]) == 6
    assert int(rows[("TTFT", "/v1/completions")]["Request Count"]) == 6
    assert int(rows[("TPOT", "/v1/completions")]["Request Count"]) == 6
    gaps = sum(len(r.chunk_gaps_s) for r in records)  # a request of n chunks has n - 1 gaps
    assert gaps == sum(len(r.tokens_per_chunk) - 1 for r in records)
    assert int(rows[("CHUNK", "/v1/completions")]["Request Count"]) == gaps
    assert (tmp_path / "l.html").is_file()


@pytest.mark.engine
@pytest.mark.parametrize("workers", [0, 2])
def test_users_start_one_arrival_gap_apart(servers, tmp_path, workers):
    """Not in lockstep: user n's first request is planned n gaps after user 0's, across workers
    too, and never leaves before its time. The budget keeps room for every user's first request
    (locustfile `_may_send`), so all four send theirs however fast the first ones finish."""
    server = servers.get("embedded-code")
    gap = 0.15
    job = LocustJob(host=server.base_url, load=Closed(4), records_dir=tmp_path / "rec", model=server.plan.served_name,
                    request=RequestSettings(max_tokens=96, arrival_gap_s=gap), requests=4, workers=workers)
    outcome = run_locust(job, deadline_s=300)
    assert outcome.aborted is None and outcome.exit_code == 0, outcome.log_tail
    records = load_records(tmp_path / "rec")
    assert len(records) == 4 and all(r.ok for r in records)
    firsts = {r.user: r for r in records if r.planned_start is not None}  # each user's first request
    assert sorted(firsts) == [0, 1, 2, 3] and all(r.send_lag_s is None for r in firsts.values())
    planned = [firsts[u].planned_start for u in range(4)]
    assert [b - a for a, b in zip(planned, planned[1:])] == pytest.approx([gap] * 3, abs=1e-6)
    # Never early (a request leaves once its user's sleep is over); how late is the machine's load.
    assert all(r.start >= r.planned_start - 0.005 for r in firsts.values()), \
        [(r.user, r.start - r.planned_start) for r in firsts.values()]


@pytest.mark.engine
def test_locust_duration_mode_lets_requests_finish(servers, tmp_path):
    server = servers.get("embedded-code")
    before = _served_tokens(server)
    job = LocustJob(host=server.base_url, load=Closed(2), records_dir=tmp_path / "rec", model=server.plan.served_name,
                    request=RequestSettings(max_tokens=7, request_timeout_s=60), duration_s=5)
    outcome = run_locust(job, deadline_s=120)
    assert outcome.aborted is None and outcome.exit_code == 0, outcome.log_tail
    records = load_records(tmp_path / "rec")
    # Stopped by --run-time, but in-flight requests completed (--stop-timeout): none cut short. How
    # many fit in 5 s depends on the CPU; each user's first request at least.
    assert len(records) >= 2 and all(r.ok for r in records), [r.error for r in records if not r.ok]
    assert sum(r.output_tokens for r in records) == _served_tokens(server) - before
    # The Locust processes' own CPU time over this run: some, and no more than the machine had.
    assert 0 < outcome.cpu_s <= outcome.wall_s * (os.cpu_count() or 1)


# ----------------------------------------------------------------------------------------- real engine
FAST = dict(request=RequestSettings(max_tokens=32, request_timeout_s=120), warmup=1, level_timeout_s=600)


def _vllm_spec_metrics(base_url: str) -> Any:
    """vLLM's own benchmark reader of /metrics (vllm/benchmarks/serve.py)."""
    import aiohttp
    from vllm.benchmarks.serve import fetch_spec_decode_metrics

    async def fetch() -> Any:
        async with aiohttp.ClientSession() as session:
            return await fetch_spec_decode_metrics(base_url, session)

    return asyncio.run(fetch())


@pytest.mark.engine
def test_our_metrics_reader_counts_what_vllms_benchmark_reader_counts(servers):
    spec = servers.get("embedded-code")
    theirs_before, ours_before = _vllm_spec_metrics(spec.base_url), prom.scrape(spec.base_url)
    for prompt in ("def main():\n", "class A:\n"):
        requests.post(f"{spec.base_url}/v1/completions", timeout=120, json={
            "model": spec.plan.served_name, "prompt": prompt, "max_tokens": 24, "temperature": 0}).raise_for_status()
    theirs, ours = _vllm_spec_metrics(spec.base_url), prom.scrape_settled(spec.base_url)
    d = prom.delta(ours_before, ours)
    drafts = theirs.num_drafts - theirs_before.num_drafts
    accepted = theirs.num_accepted_tokens - theirs_before.num_accepted_tokens
    draft_tokens = theirs.num_draft_tokens - theirs_before.num_draft_tokens
    assert drafts > 0 and (d.drafts, d.draft_tokens, d.accepted_tokens) == (drafts, draft_tokens, accepted)
    assert d.acceptance_rate == pytest.approx(accepted / draft_tokens)
    assert d.mean_accepted_length == pytest.approx(1 + accepted / drafts)
    assert d.effective_k == pytest.approx(draft_tokens / drafts) and 1 <= d.effective_k <= 4


def _swept_levels(running_sweep) -> list[tuple[Any, Any]]:
    """(variant, level) of the session's sweep of the speculative and baseline servers: the `mixed`
    workload uses both APIs (embedded-code.yaml gives the embedded pair a chat template), 2 users,
    4 requests each."""
    results, _, _ = running_sweep
    assert results.status in ("ok", "flagged"), results.problems
    assert [v.name for v in results.variants] == ["spec-k4", "baseline"]
    for variant in results.variants:
        assert variant.status in ("ok", "flagged"), variant.error
        assert [lv.concurrency for lv in variant.levels] == [2]
    return results.levels()


@pytest.mark.engine
def test_a_sweeps_client_figures_agree_with_the_servers_counters(running_sweep):
    report = running_sweep[2]
    for _, level in _swept_levels(running_sweep):
        client, server, check = level.client, level.server, level.consistency
        assert client.ok == client.requests == 4 and client.failed == 0
        # Every request made exactly max_tokens, and the server counted the same tokens.
        assert client.output_tokens == 4 * 32
        assert check.ok and server.generation_tokens == pytest.approx(client.output_tokens, rel=0.05)
        assert server.output_tokens_per_s == pytest.approx(client.output_tokens_per_s, rel=0.05)
        assert server.requests_finished == 4
        assert client.ttft_ms.p50 > 0 and client.e2e_ms.p99 >= client.e2e_ms.p50
        records = load_records(report / level.locust.records)
        assert {r.path for r in records} == {"/v1/completions", "/v1/chat/completions"}
        assert sum(r.output_tokens for r in records) == client.output_tokens
        assert all(sum(r.tokens_per_chunk) == r.output_tokens for r in records)
        assert (report / level.locust.csv).is_file() and (report / level.locust.html).is_file()


@pytest.mark.engine
def test_vllms_benchmark_runs_beside_locust_on_the_same_prompts(running_sweep):
    report = running_sweep[2]
    for variant, level in _swept_levels(running_sweep):
        # vLLM's serving benchmark ran on the same server after Locust, as many requests, same length.
        bench, agreement = level.vllm_bench, level.vllm_bench_agreement
        assert bench.error is None, bench
        assert bench.completed == 4 and bench.failed == 0 and bench.output_tokens == 4 * 32
        assert bench.open_loop_requests == 0  # its spaced arrivals still queued for a slot: a closed loop
        # Latencies judged request by request: every request paired with the benchmark's same one.
        assert agreement.ttft_p50_ms.matched_requests == 4
        assert agreement.per_token_p50_ms.matched_difference is not None
        assert set(agreement.figures()) == {"output_tokens_per_s", "ttft_p50_ms", "per_token_p50_ms"}
        assert agreement.output_tokens_per_s.vllm_bench == bench.output_tokens_per_s > 0
        assert bench.ttft_ms.n == 4 and agreement.ttft_p50_ms.vllm_bench > 0
        assert agreement.per_token_p50_ms.vllm_bench > 0
        if agreement.agrees is False:  # a disagreement is never silent
            assert any("vLLM's benchmark disagree" in p for p in level.problems)
        # Both clients sent the same prompts: Locust's sequence is the benchmark's dataset.
        records = load_records(report / level.locust.records)
        sent = load_workload("mixed").sequence(4)
        assert sorted(r.item_id for r in records) == sorted(i.id for i in sent)
        dataset = report / "vllm-bench" / f"{variant.name}-c{level.concurrency}" / "dataset.jsonl"
        assert len(dataset.read_text().splitlines()) == 4
        # The engine's counters over the benchmark's window: its requests only (no warm-ups, whose
        # burst of C at once would weigh on the engine's TTFT and skew the drift taken out).
        assert level.vllm_bench_server.requests_finished == 4
        assert agreement.per_token_p50_ms.engine_drift is not None


@pytest.mark.engine
def test_the_content_check_reads_every_output_of_both_clients(running_sweep):
    """Held against the pair's held-out code. Sampled (T=1), the toy pair degenerates now and then
    (about one output in fifty): a level's count is its requests' own verdicts, whatever they are."""
    from loadtest.measurement.content import is_degenerate

    results, _, report = running_sweep
    for _, level in _swept_levels(running_sweep):
        client, bench = level.client, level.vllm_bench
        records = load_records(report / level.locust.records)
        ref = client.content.reference.distinct_4
        assert client.content.degenerate == sum(is_degenerate(r.content, ref) for r in records)
        for checked in (client.content, bench.content):
            assert checked.checked == 4 and checked.degenerate_share == checked.degenerate / 4, checked
            assert checked.reference.source == "the embedded pair's held-out code"
            assert checked.noise_checked  # the noise test read each output's text (stream, benchmark's file)
        assert all(len(r.output_token_ids) == 32 and r.content["tokens"] == 32 for r in records)
        assert all("known_words" in r.content for r in records)
    # The first lines name content only where the check found some (their wording: the greedy test's).
    found = any(lv.client.content.not_text or lv.vllm_bench.content.not_text for _, lv in results.levels())
    assert any("CONTENT" in line or "NOISE" in line for line in headline(results)) == found


@pytest.mark.engine
def test_speculation_figures_belong_to_the_speculative_variant(running_sweep):
    for variant, level in _swept_levels(running_sweep):
        server = level.server
        if variant.name == "spec-k4":
            assert server.spec_enabled and 0 <= server.acceptance_rate <= 1
            assert 1 <= server.mean_accepted_length <= 5 and len(server.per_position_acceptance) == 4
            # The K that ran beside the configured one (the running server's K: it has no schedule).
            assert level.configured_k == 4 and 1 <= server.effective_k <= 4
        else:
            assert not server.spec_enabled and server.acceptance_rate is None
            assert level.configured_k is None and server.effective_k is None


@pytest.mark.engine
def test_the_report_writes_its_files_and_the_speedup_of_each_pair(running_sweep):
    _swept_levels(running_sweep)
    results, files, _ = running_sweep
    for name in ("json", "markdown", "html", "throughput", "latency", "acceptance", "speedup"):
        assert files[name].is_file(), name
    assert results.settings["temperature"] == 1.0  # vLLM's default is the load test's
    assert "Second opinion" in files["markdown"].read_text() and "## Content" in files["markdown"].read_text()
    comparisons = {d.concurrency: d for d in SweepResults.load(files["json"]).comparisons}
    assert set(comparisons) == {2}
    tps = {(v.name, lv.concurrency): lv.client.output_tokens_per_s for v, lv in results.levels()}
    for c, d in comparisons.items():  # the speculative run's client tokens/s over the baseline's beside it
        assert d.speedup == pytest.approx(tps["spec-k4", c] / tps["baseline", c])
    assert all(math.isfinite(d.expected_tokens_per_step) for d in comparisons.values())


@pytest.mark.engine
def test_compare_and_rejudge_read_the_report_back(running_sweep):
    _, files, report = running_sweep
    out = subprocess.run([sys.executable, "-m", "loadtest", "compare", str(report)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "spec-k4" in out.stdout and "baseline" in out.stdout, out.stderr
    # A report judged again from what it kept reaches the same verdicts.
    before = SweepResults.load(files["json"])
    again = subprocess.run([sys.executable, "-m", "loadtest", "rejudge", str(report)], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    after = SweepResults.load(files["json"])

    def verdicts(results: SweepResults) -> list[bool | None]:
        return [lv.vllm_bench_agreement.agrees for _, lv in results.levels()]

    assert verdicts(after) == verdicts(before) and after.status == before.status


@pytest.mark.engine
def test_server_that_fails_to_start_gives_a_failed_run(tmp_path, embedded_pair):
    # vLLM itself refuses this (batched tokens below max_model_len): the server exits during start-up.
    settings = SweepSettings("embedded-code", overrides=["engine_args.max_num_batched_tokens=8"], no_spec=True,
                             users=[1], requests=2, out=tmp_path / "report", startup_timeout_s=300, **FAST)
    started = time.monotonic()
    results = Sweep(settings).run()
    write_report(results, settings.out)
    assert time.monotonic() - started < 300
    assert results.status == "failed"
    variant = results.variants[0]
    assert variant.status == "failed" and "server failed to start" in variant.error
    assert variant.levels == [] and variant.server_log_tail
    assert SweepResults.load(settings.out).status == "failed"
    assert (settings.out / "report.md").is_file()


@pytest.mark.engine
def test_a_schedule_gives_the_k_of_the_batch_size_and_a_killed_server_keeps_partial_results(tmp_path, embedded_pair):
    """One scheduled server started by the sweep (K=4 alone, 1 from 2 running requests), killed
    during its third level. The levels before record the schedule's K at their concurrency and
    the K the engine gave from its counters; the killed level keeps what finished; the next is
    skipped. (One server for both checks: each engine start costs half a minute of `make test`.)
    Levels are counts of requests, 4 per user: on a slow CPU no level ends early, and the killed
    one still has three rounds of requests to run (work, not a wait) when its first 4 have finished."""
    settings = SweepSettings("embedded-code", overrides=["speculation.schedule=[[1, 1, 4], [2, 64, 1]]"], baseline=False,
                             users=[1, 2, 4, 8], repeat=1, requests_per_user=4, requests_min=1, vllm_bench=False,
                             out=tmp_path / "report", **{**FAST, "request": replace(FAST["request"], max_tokens=48),
                                                         "warmup": 0})  # the session's sweep runs the warm-ups
    records_dir = settings.out / "records" / "spec-schedule-c4"

    def kill_after_a_few_requests(server, variant) -> None:
        def killer() -> None:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                done = sum(p.read_text().count("\n") for p in records_dir.glob("records-*.jsonl"))
                if done >= 4:
                    break
                time.sleep(0.05)  # the sooner the kill, the more of the level's work is left to cut
            os.killpg(server.process.pid, signal.SIGKILL)

        threading.Thread(target=killer, daemon=True).start()

    started = time.monotonic()
    results = Sweep(settings, on_server_started=kill_after_a_few_requests).run()
    write_report(results, settings.out)
    assert time.monotonic() - started < 400
    assert not (records_dir.parent / "spec-schedule-c8").exists()  # the kill came before the last level
    assert results.plan["server_starts"] == 1
    assert results.status == "failed"
    variant = results.variants[0]
    assert variant.status == "failed"
    alone, two, killed, after = variant.levels
    for level in (alone, two):
        assert level.status in ("ok", "flagged"), level.problems
    assert alone.configured_k == 4 and alone.server.effective_k == pytest.approx(4, abs=0.5)
    # Its engine's steps, timed by phase over each measured run (a server the sweep started).
    for level in (alone, two):
        assert level.step_ms["steps"] > 0 and 0 < level.step_ms["forward"] < level.step_ms["step"], level.step_ms
        assert level.step_ms["propose"] > 0
    # Two users draft one token a step; a request running alone (at the start, the end) drafts four.
    assert two.configured_k == 1 and 1 <= two.server.effective_k < 4
    assert "1 (" in compare_table(results)
    assert killed.status == "failed" and any("server process exited" in p for p in killed.problems)
    assert killed.client.ok >= 4  # partial results kept
    assert after.status == "skipped"
    saved = SweepResults.load(settings.out)
    assert saved.variants[0].levels[2].client.ok == killed.client.ok
    assert len(load_records(records_dir)) == killed.client.requests


def test_temperatures_are_parsed_or_refused_clearly() -> None:
    from loadtest.arg_types import temperature_list

    assert temperature_list("1, 0,0.7,1") == [0.0, 0.7, 1.0]
    for bad in ("", "0,x", "-1", "nan", "inf"):
        with pytest.raises(argparse.ArgumentTypeError, match="--temperature"):
            temperature_list(bad)
    run = subprocess.run([sys.executable, "-m", "loadtest", "run", "--temperature", "0,hot"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "numbers separated by commas" in run.stderr


@pytest.mark.parametrize("argv", [["loadtest", "run", "embedded-code.yaml", "--repeat", "0"],
                                  ["tuning", "tune", "embedded-code.yaml", "--proof-repeats", "0"],
                                  ["tuning", "advise", "embedded-code.yaml", "--cost-repeats", "-1"]])
def test_a_count_of_runs_below_one_is_refused_before_any_work(argv: list[str]) -> None:
    run = subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2 and "give a positive integer" in run.stderr, run.stderr


@pytest.mark.engine
def test_temperature_sweep_reports_acceptance_against_temperature(servers, tmp_path):
    """`--temperature 1,0`: one sweep per temperature, each sending its own, and a summary of
    acceptance and speedup against temperature, here of the session's running servers. The default
    drafts probabilistically, so its acceptance holds at T=1: ~43% on this pair (ledger R49) where
    greedy drafts keep ~5-7%. The floor sits between the two, far from both: 4 requests of 32 tokens
    are ~30 draft steps, and one such run measured 29% (a floor of 30% failed by chance)."""
    spec, baseline = servers.get("embedded-code"), servers.get(*BASELINE)
    out = tmp_path / "report"
    run = subprocess.run([sys.executable, "-m", "loadtest", "run", "--url", spec.base_url, "--baseline-url",
                          baseline.base_url, "--api-key-env", TEST_KEY_ENV, "--temperature", "1,0", "--users", "1",
                          "--repeat", "1", "--requests", "4", "--max-tokens", "32", "--no-vllm-bench", "--warmup", "0",
                          "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert run.returncode in (0, 1), run.stderr[-3000:]
    summary = json.loads((out / "temperature.json").read_text())
    assert summary["draft_sample_method"] == "not known (a running server does not say)"
    assert {t: s["status"] for t, s in summary["sweeps"].items()} in (
        {"0": a, "1": b} for a in ("ok", "flagged") for b in ("ok", "flagged"))
    rows = {r["temperature"]: r for r in summary["rows"] if (r["variant"], r["concurrency"]) == ("spec-k4", 1)}
    assert set(rows) == {0.0, 1.0}
    for temperature, row in rows.items():
        sub = SweepResults.load(out / f"temperature-{temperature:g}")
        assert sub.settings["temperature"] == temperature
        assert {v.name for v in sub.variants} == {"spec-k4", "baseline"}
        assert row["acceptance_rate"]["mean"] > 0.15, f"T={temperature}: acceptance {row['acceptance_rate']}"
        tps = {v.name: v.levels[0].client.output_tokens_per_s for v in sub.variants}
        assert row["speedup"]["mean"] == pytest.approx(tps["spec-k4"] / tps["baseline"])
    text = (out / "temperature.md").read_text()
    assert "| 1 | spec-k4 | 1 | 1 |" in text and "temperature-1/report.md" in text
    assert (out / "temperature.png").stat().st_size > 10_000
    shown = subprocess.run([sys.executable, "-m", "loadtest", "compare", str(out)], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0 and "temperatures 0, 1" in shown.stdout and "| 1 | spec-k4 | 1 | 1 |" in shown.stdout


@pytest.mark.engine
@pytest.mark.full
def test_speculation_pays_at_batch_1_greedy_and_sampled(tmp_path, embedded_pair, measurement):
    """The embedded default's reason to exist: on the cost-faithful pair, speculation is faster at
    batch 1 at T=0 and at T=1 (probabilistic drafts), in each of two runs per temperature."""
    out = tmp_path / "report"
    run = subprocess.run([sys.executable, "-m", "loadtest", "run", "embedded-code", "--temperature", "1,0", "--users", "1",
                          "--repeat", "2", "--requests", "8", "--max-tokens", "64", "--no-vllm-bench",
                          "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=2400)
    assert run.returncode in (0, 1), run.stderr[-3000:]
    summary = json.loads((out / "temperature.json").read_text())
    assert summary["draft_sample_method"] == "probabilistic"
    rows = {r["temperature"]: r for r in summary["rows"] if (r["variant"], r["concurrency"]) == ("spec-k4", 1)}
    assert set(rows) == {0.0, 1.0}
    # The default is tuned for 0, 0.7 and 1: a run that skips 0.7 says so.
    assert "add --temperature 0,0.7,1" in run.stdout
    for temperature, row in rows.items():
        assert row["acceptance_rate"]["mean"] > 0.3, f"T={temperature}: acceptance {row['acceptance_rate']}"
        speedup = row["speedup"]  # over the runs: n, mean, min, max
        assert speedup["n"] == 2 and speedup["min"] > 1, f"T={temperature}: speculation did not pay in every run: {speedup}"
