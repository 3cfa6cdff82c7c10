"""Open-loop load (`--rates`): the arrival schedule against vLLM's own, the open-loop figures,
outcomes, the CLI and plan, Locust's open-loop mode against a small fake server, the report; and
on the engine, an open-loop Locust run and a short sweep with rates on the session's servers."""

from __future__ import annotations

import asyncio
import threading
import types
from http.server import ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from conftest import BASELINE, TEST_KEY_ENV
from loadtest.measurement import stats
from loadtest.measurement.figures import (Agreement, BenchFigures, ClientFigures, Distribution, OpenLoopFigures,
                                          ServerFigures)
from loadtest.measurement.results import Closed, LevelResult, Open, SweepResults, VariantResult
from loadtest.traffic import vllm_bench
from loadtest.__main__ import build_parser
from loadtest.traffic.arrivals import poisson_arrivals, replayed
from loadtest.measurement.records import OUTCOMES, RequestRecord
from loadtest.traffic.locust_run import LocustJob, commands, run_locust
from loadtest.sweeps.plan import Timings
from loadtest.measurement.derive import derive_rates
from loadtest.reports.report import compare_table, write_report
from loadtest.traffic.request_settings import RequestSettings
from loadtest.sweeps.settings import SweepSettings, requests_for_rate
from loadtest.measurement.records import load_records
from loadtest.sweeps.judging import schedule_start
from loadtest.sweeps.runner import Sweep
from loadtest.traffic.workloads import load_workload
from test_loadtest import _FakeVLLM


# ------------------------------------------------------------------------------------ the schedule
def _vllm_schedule(n: int, rate: float, seed: int) -> list[float]:
    """vLLM's own `get_request` (benchmarks/serve.py), seeded as its main seeds NumPy, on a fake
    clock: the offsets from its start at which it hands out each request."""
    import vllm.benchmarks.serve as serve

    clock = [0.0]

    async def sleep(seconds: float) -> None:
        clock[0] += seconds

    async def collect() -> list[float]:
        np.random.seed(seed)
        out = []
        async for _request, _rate in serve.get_request(list(range(n)), rate, 1.0):
            out.append(clock[0])
        return out

    saved = serve.time, serve.asyncio
    serve.time, serve.asyncio = types.SimpleNamespace(time=lambda: clock[0]), types.SimpleNamespace(sleep=sleep)
    try:
        return asyncio.run(collect())
    finally:
        serve.time, serve.asyncio = saved


@pytest.mark.parametrize("n, rate, seed", [(50, 2.0, 7), (32, 0.5, 1), (240, 4.0, 3)])
def test_arrivals_are_vllm_benchmarks_own(n, rate, seed):
    ours = poisson_arrivals(n, rate, seed)
    assert ours == pytest.approx(_vllm_schedule(n, rate, seed), rel=1e-12, abs=1e-12)
    assert ours[-1] == pytest.approx(n / rate) and ours == sorted(ours)
    state = np.random.get_state()[1].copy()
    poisson_arrivals(n, rate, seed)
    assert (np.random.get_state()[1] == state).all()  # the global generator untouched


def test_a_repeated_head_replays_the_first_gaps_at_the_end():
    plain, ours = poisson_arrivals(50, 2.0, 7), poisson_arrivals(50, 2.0, 7, repeat_head=10)
    gaps = [b - a for a, b in zip([0.0, *ours], ours)]
    assert ours[:40] == plain[:40] and gaps[40:] == pytest.approx(gaps[:10], abs=1e-9)
    assert [replayed(i, 50, 10) for i in (0, 39, 40, 49)] == [0, 39, 0, 9] and replayed(45, 50, 0) == 45
    with pytest.raises(ValueError, match="half"):
        poisson_arrivals(10, 1.0, 0, repeat_head=6)


def test_arrivals_refuse_a_rate_of_nothing():
    assert poisson_arrivals(0, 1.0, 0) == []
    with pytest.raises(ValueError):
        poisson_arrivals(3, 0.0, 0)


def test_requests_for_rate_defaults_to_a_minute_of_arrivals():
    assert requests_for_rate(0.5, None) == 32 and requests_for_rate(2, None) == 120
    assert requests_for_rate(2, 10) == 10 and requests_for_rate(4, None, duration_s=5) == 20


# ------------------------------------------------------------------------------------ outcomes
@pytest.mark.parametrize("record, outcome", [
    (dict(ok=True), "served"),
    (dict(status=503, error="HTTP 503: overloaded"), "refused"),
    (dict(status=429, error="HTTP 429: too many"), "refused"),
    (dict(error="ConnectionError: HTTPConnectionPool(...): Max retries exceeded (Caused by NewConnectionError("
                "'...: Failed to establish a new connection: [Errno 111] Connection refused'))"), "refused"),
    (dict(status=200, error="timeout: no complete response within 5 s"), "timed_out"),
    (dict(status=200, error="stream ended early: no [DONE]"), "failed"),
    (dict(status=200, error="ChunkedEncodingError: connection broken"), "failed"),
    (dict(error="unsent: the run ended before its arrival time"), "unsent"),
])
def test_every_request_ends_as_one_outcome(record, outcome):
    assert RequestRecord("x", "/v1/completions", 0.0, **record).outcome == outcome
    assert outcome in OUTCOMES


def test_a_refused_connection_is_refused():
    import requests

    from loadtest.traffic.client import stream_request

    with requests.Session() as session:
        rec = stream_request(session, "http://127.0.0.1:9", "/v1/completions", {"prompt": "x"}, "r", 5)
    assert rec.outcome == "refused", rec.error


# ------------------------------------------------------------------------------------ open-loop figures
def _rec(start: float, e2e: float, planned: float, ok: bool = True, **kw) -> RequestRecord:
    return RequestRecord("x", "/v1/completions", start, ok=ok, e2e_s=e2e, planned_start=planned,
                         send_lag_s=start - planned, **kw)


def test_open_loop_figures_on_synthetic_records():
    # Sends at 0, 1, 2, 3 (1 ms late each), each lasting 2.5 s: up to 3 in flight.
    records = [_rec(100 + i + 0.001, 2.5, 100 + i) for i in range(4)]
    records.append(_rec(104.001, 1.0, 104.0, ok=False, status=503, error="HTTP 503: busy"))
    out = stats.open_loop(records, 1.0, asked_requests=6)
    assert out.achieved_rate == pytest.approx(1.0) and out.scheduled_rate == pytest.approx(1.0)
    assert out.sent == 5 and out.requests == 6
    assert out.outcomes == {"served": 4, "refused": 1, "timed_out": 0, "failed": 0, "unsent": 1}
    assert out.send_lag_ms.p50 == pytest.approx(1.0) and out.send_lag_ms.max == pytest.approx(1.0)
    assert out.in_flight_max == 3
    assert out.in_flight[0] == [0.0, 1] and out.in_flight[-1][1] == 0
    # 0-1 s: 1, 1-2: 2, 2-2.5: 3, 2.5-3: 2, 3-3.5: 3, 3.5-4: 2, 4-4.5: 3, 4.5-5.5: 2 -> 1, 5.5-6.5 ... over 6.5 s
    area = sum(a[1] * (b[0] - a[0]) for a, b in zip(out.in_flight, out.in_flight[1:]))
    assert out.in_flight_mean == pytest.approx(area / out.in_flight[-1][0])
    assert area == pytest.approx(4 * 2.5 + 1.0)  # each request's time in flight, summed
    # The request with no record at all counts as unsent, and an unsent request means behind.
    assert out.behind and any("never sent" in r for r in out.behind_reasons)


def test_open_loop_behind_when_the_generator_is_slow_or_late():
    on_time = [_rec(10 + i * 0.5, 0.2, 10 + i * 0.5) for i in range(21)]
    assert not stats.open_loop(on_time, 2.0).behind
    slow = [_rec(10 + i * 0.6, 0.2, 10 + i * 0.5) for i in range(21)]  # sends drift later and later
    out = stats.open_loop(slow, 2.0)
    assert out.behind and out.achieved_rate == pytest.approx(1 / 0.6)
    late = [_rec(10 + i * 0.5 + (0.3 if i == 20 else 0.0), 0.2, 10 + i * 0.5) for i in range(21)]
    assert any("send lag p99" in r for r in stats.open_loop(late, 2.0).behind_reasons)


def test_schedule_start_recovers_the_schedules_zero():
    offsets = poisson_arrivals(5, 2.0, 1)
    records = [_rec(1000 + o + 0.01, 0.5, 1000 + o, arrival=i) for i, o in enumerate(offsets)]
    assert schedule_start(records[2:], 2.0, 5, 1) == pytest.approx(1000)


# ------------------------------------------------------------------------------------ CLI, plan, benchmark
def test_rates_and_users_are_one_or_the_other(capsys):
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--users", "1,2", "--rates", "1,2"])
    assert "not allowed with" in capsys.readouterr().err
    assert parser.parse_args(["run", "--rates", "0.5,2"]).rates == [0.5, 2.0]
    for bad in ("0", "-1", "x"):
        with pytest.raises(SystemExit):
            parser.parse_args(["run", "--rates", bad])


def test_dry_run_with_rates_plans_rates(tmp_path: Path):
    sweep = Sweep(SweepSettings("embedded-code", rates=[0.5, 2], repeat=2, out=tmp_path / "r"),
                  timings=Timings.load(tmp_path / "t.json"))
    plan = sweep.plan(dry_run=True)
    text = plan.describe(dry_run=True)
    assert "rates 0.5, 2 requests/s (open loop" in text and "concurrency" not in text
    assert "32 requests at 0.5/s, 120 requests at 2/s" in text
    assert [(r, load.at) for r, load, _ in plan.steps][:4] == [(1, 0.5), (1, 0.5), (2, 0.5), (2, 0.5)]
    assert plan.total_s() > 0


def test_the_cli_dry_run_with_rates(capsys):
    from loadtest.__main__ import main

    assert main(["run", "embedded-code", "--rates", "1,4", "--dry-run"]) == 0
    assert "rates 1, 4 requests/s" in capsys.readouterr().out


def test_vllm_benchmark_at_a_rate_has_our_arrivals(tmp_path: Path):
    job = vllm_bench.BenchJob("http://h:1", "m", "tok", load_workload("code"), RequestSettings(), Open(2.5),
                              num_prompts=10, out_dir=tmp_path, seed=3)
    args = vllm_bench.bench_args(job, tmp_path / "d.jsonl", tmp_path / "r.json")
    assert "--max-concurrency" not in args
    assert args[args.index("--request-rate") + 1] == "2.5" and args[args.index("--burstiness") + 1] == "1"
    assert args[args.index("--seed") + 1] == "3" and args.count("--seed") == 1
    closed = vllm_bench.bench_args(vllm_bench.BenchJob("http://h:1", "m", "tok", load_workload("code"),
                                                       RequestSettings(), Closed(2), 10, tmp_path),
                                   tmp_path / "d.jsonl", tmp_path / "r.json")
    assert closed[closed.index("--max-concurrency") + 1] == "2" and closed[closed.index("--burstiness") + 1] == "inf"


def test_open_loop_locust_job_runs_one_dispatcher_per_process(tmp_path: Path):
    job = LocustJob("http://h:1", Open(2.0), records_dir=tmp_path, model="m", requests=10, seed=4, workers=2)
    master, *workers = commands(job, 60)
    assert master[master.index("-u") + 1] == "2" and len(workers) == 2
    assert master[master.index("--rate") + 1] == "2.0" and master[master.index("--seed") + 1] == "4"
    with pytest.raises(ValueError):
        commands(LocustJob("http://h:1", Open(1.0), tmp_path, "m"), 60)


# ------------------------------------------------------------------------------------ Locust, fake server
@pytest.fixture(scope="module")
def fake_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeVLLM)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_locust_open_loop_sends_on_schedule(fake_server, tmp_path: Path):
    job = LocustJob(fake_server, Open(20.0), records_dir=tmp_path / "rec", model="m",
                    request=RequestSettings(max_tokens=40), requests=20, seed=3)
    outcome = run_locust(job, deadline_s=120)
    assert outcome.aborted is None and outcome.exit_code == 0, outcome.log_tail
    records = load_records(tmp_path / "rec")
    assert sorted(r.arrival for r in records) == list(range(20)) and all(r.outcome == "served" for r in records)
    offsets = poisson_arrivals(20, 20.0, 3)
    zero = schedule_start(records, 20.0, 20, 3)
    for r in records:
        assert r.planned_start == pytest.approx(zero + offsets[r.arrival], abs=1e-6)
        assert r.send_lag_s == pytest.approx(r.start - r.planned_start) and -0.005 < r.send_lag_s < 0.5
        assert r.item_id == load_workload("code").item_for(r.arrival).id  # arrival i: the i-th prompt
    # Each request takes ~60 ms (14 chunks, 5 ms apart) against 50 ms between arrivals: they overlap.
    assert stats.open_loop(records, 20.0, 20).in_flight_max > 1


def test_locust_repeats_the_first_arrivals_at_the_end_when_asked(fake_server, tmp_path: Path):
    """A soak's windows: the last 5 of 16 arrivals come with the first 5's gaps and prompts."""
    job = LocustJob(fake_server, Open(20.0), records_dir=tmp_path / "rec", model="m",
                    request=RequestSettings(max_tokens=8), requests=16, seed=4, repeat_head=5)
    outcome = run_locust(job, deadline_s=120)
    assert outcome.aborted is None and outcome.exit_code == 0, outcome.log_tail
    records = sorted(load_records(tmp_path / "rec"), key=lambda r: r.arrival)
    assert [r.arrival for r in records] == list(range(16)) and all(r.outcome == "served" for r in records)
    planned = [r.planned_start for r in records]
    gaps = [b - a for a, b in zip(planned, planned[1:])]
    assert gaps[11:] == pytest.approx(gaps[:4], abs=1e-6)
    assert [r.item_id for r in records[11:]] == [r.item_id for r in records[:5]]
    assert records[10].item_id == load_workload("code").item_for(10).id


def test_a_stopped_open_loop_run_loses_no_request(fake_server, tmp_path: Path):
    """Stopped by its deadline halfway through the schedule: every request of it has a record,
    the ones never sent as unsent."""
    job = LocustJob(fake_server, Open(1.0), records_dir=tmp_path / "rec", model="m",
                    request=RequestSettings(max_tokens=10, request_timeout_s=2), requests=12, seed=0)
    outcome = run_locust(job, deadline_s=3)
    records = load_records(tmp_path / "rec")
    assert sorted(r.arrival for r in records) == list(range(12)), (outcome.aborted, outcome.log_tail)
    outcomes = stats.open_loop(records, 1.0, 12).outcomes
    assert outcomes["unsent"] > 0 and outcomes["served"] > 0 and sum(outcomes.values()) == 12


# ------------------------------------------------------------------------------------ the report
def _rate_level(rate: float, tpot_ms: float, e2e_ms: float, behind: bool = False) -> LevelResult:
    client = ClientFigures(requests=4, ok=4, failed=0, output_tokens_per_s=50.0,
                           ttft_ms=Distribution(p50=40.0, p95=80.0),
                           per_token_latency_ms=Distribution(p50=tpot_ms, p95=2 * tpot_ms), e2e_ms=Distribution(mean=e2e_ms))
    ol = OpenLoopFigures(achieved_rate=rate * (0.8 if behind else 1.0), behind=behind, in_flight_max=3,
                         in_flight_mean=1.5, outcomes={"served": 4, "refused": 0, "timed_out": 0, "failed": 0, "unsent": 0})
    return LevelResult(rate=rate, repeat=1, seed=1, requests=4, status="ok", client=client, open_loop=ol,
                       outcomes=ol.outcomes, server=ServerFigures(acceptance_rate=0.6),
                       vllm_bench=BenchFigures(output_tokens_per_s=51.0, ttft_ms=Distribution(p50=41.0),
                                               per_token_latency_ms=Distribution(p50=20.0)),
                       vllm_bench_agreement=Agreement(agrees=True))


def test_report_of_rate_levels(tmp_path: Path):
    results = SweepResults(config="c", status="ok", settings={"rates": [1.0, 2.0], "repeat": 1, "workload": "code"},
                           variants=[VariantResult(name="spec-k4", k=4, status="ok", levels=[
                               _rate_level(1.0, 20.0, 1000.0), _rate_level(2.0, 25.0, 1500.0, behind=True)]),
                               VariantResult(name="baseline", status="ok", levels=[
                                   _rate_level(1.0, 30.0, 1500.0), _rate_level(2.0, 40.0, 3000.0)])])
    rows = {(r.variant, r.rate): r for r in derive_rates(results)}
    assert rows[("spec-k4", 1.0)].tpot_p50_speedup == pytest.approx(1.5)
    assert rows[("spec-k4", 2.0)].e2e_mean_speedup == pytest.approx(2.0)
    assert rows[("baseline", 1.0)].tpot_p50_speedup is None
    text = compare_table(results)
    assert "rate 1/s, spec-k4: against the baseline at the same arrivals, 1.50x per token" in text
    assert "BEHIND" in text and "fell behind" in text
    files = write_report(results, tmp_path)
    md = files["markdown"].read_text()
    assert "## Open loop: each variant at each arrival rate" in md and "1.50x" in md
    assert "open loop at rates 1, 2 requests/s" in md
    assert files["rates"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "![rates](rates.png)" in md


# ------------------------------------------------------------------------------------ on the engine
@pytest.mark.engine
def test_sweep_with_rates_on_running_servers(servers, tmp_path: Path):
    """`make loadtest RATES=... URL=... BASELINE_URL=...`: an open-loop level per variant with vLLM's
    benchmark at the same arrivals, and the report; then one level on demand (`rate_level`).
    Requests are sent on their schedule, whether or not earlier ones ended."""
    spec, baseline = servers.get("embedded-code"), servers.get(*BASELINE)
    settings = SweepSettings("", url=spec.base_url, baseline_url=baseline.base_url, api_key_env=TEST_KEY_ENV,
                             rates=[8.0], repeat=1, requests=12, warmup=1, slo="ttft_p95=30s",
                             request=RequestSettings(max_tokens=16, request_timeout_s=120), level_timeout_s=600,
                             out=tmp_path / "report")
    results = Sweep(settings).run()
    assert [v.name for v in results.variants] == ["spec-k4", "baseline"], results.problems
    for variant in results.variants:
        (level,) = variant.levels
        assert level.status in ("ok", "flagged"), level.problems
        assert level.concurrency is None and level.rate == 8.0 and level.seed == 1 and level.requests == 12
        assert None not in (level.open_loop, level.outcomes, level.client, level.slo, level.server,
                            level.load_generator, level.locust)
        assert level.outcomes["served"] == 12 and sum(level.outcomes.values()) == 12
        ol = level.open_loop
        assert ol.send_lag_ms is not None and ol.in_flight, ol
        # Sent on time (against the schedule's own rate: 12 draws of one seed). How many overlap is the
        # machine's speed (a fast one ends each request before the next arrives); the count is the records'.
        assert ol.achieved_rate == pytest.approx(ol.scheduled_rate, rel=0.15), ol
        recs = load_records(tmp_path / "report" / level.locust.records)
        overlap = max(sum(1 for o in recs if o.start <= r.start < o.end) for r in recs)
        assert ol.in_flight_max == overlap >= 1, (ol.in_flight, overlap)
        assert level.client.output_tokens == 12 * 16
        assert level.vllm_bench.error is None, level.vllm_bench
        assert level.vllm_bench.completed == 12 and level.vllm_bench_agreement.agrees is not None
    # Both variants got the same arrival offsets and prompts.
    arrivals = [sorted((r.arrival, round(r.planned_start - schedule_start(recs, 8.0, 12, 1), 6), r.item_id)
                       for r in recs)
                for recs in (load_records(tmp_path / "report" / v.levels[0].locust.records)
                             for v in results.variants)]
    assert arrivals[0] == arrivals[1]
    files = write_report(results, settings.out)
    assert "Open loop: each variant at each arrival rate" in files["markdown"].read_text()
    assert "rate 8/s, spec-k4" in compare_table(results)

    on_demand = Sweep(SweepSettings("", url=spec.base_url, baseline_url=baseline.base_url, api_key_env=TEST_KEY_ENV,
                                    requests=4, warmup=1, vllm_bench=False, repeat=1,
                                    request=RequestSettings(max_tokens=16, request_timeout_s=120),
                                    out=tmp_path / "on-demand"))
    with on_demand.serving() as sweep:
        assert sweep.variants() == ["spec-k4", "baseline"]
        level = sweep.rate_level("baseline", 2.0, repeat=1)
    assert level.rate == 2.0 and level.outcomes["served"] == 4, level.problems
    assert [v.status for v in on_demand.results.variants] == ["skipped", level.status]
