"""Judging a level once it ran: its Locust run against vLLM's benchmark (`judge_second_opinion`,
and `rejudge` of a finished sweep from what it kept), the load generator's own lateness and load
(`load_generator_lag`, `load_generator_notes`, a closed loop's `send_lag_notes`, `delivery_notes`), and a sweep's overall status.
Also reading a run's kept records (`load_records`) and an open loop's schedule start."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.measurement import stats
from loadtest.measurement.figures import BenchFigures, ClientFigures, Distribution, GeneratorLag, ServerFigures
from loadtest.measurement.records import RequestRecord, load_records
from loadtest.measurement.results import LevelResult, SweepResults
from loadtest.measurement import second_opinion
from loadtest.traffic import vllm_bench
from loadtest.traffic.arrivals import poisson_arrivals
from loadtest.traffic.locust_run import LocustOutcome
from loadtest.traffic.workloads import Workload, load_workload


DISAGREE = "Locust and vLLM's benchmark disagree: "


def judge_second_opinion(level: LevelResult, bench: BenchFigures, records: list[RequestRecord],
                         workload: Workload, workers: int) -> None:
    """Compare a level's Locust run with the benchmark's (`second_opinion.compare`, request by request
    where the two match, in the order its load sent them) and keep the verdict, and a problem where
    they disagree, in the level."""
    sequence = [item.id for item in workload.sequence(*level.load.prompt_order(level, workers))]
    matched = second_opinion.matched_ratios(records, bench, sequence)
    agreement = second_opinion.compare(level.client or ClientFigures(), bench, level.server, level.vllm_bench_server,
                                       matched, level.load.throughput_follows_engine)
    level.vllm_bench_agreement = agreement
    off = [f"{k} {100 * (v.difference_adjusted if v.difference_adjusted is not None else v.difference or 0):+.1f}%"
           f" (tolerance {100 * v.tolerance:.0f}%"
           + (f"; the engine itself {100 * v.engine_drift:+.1f}% between the two windows, taken out)"
              if v.engine_drift is not None else ")")
           for k, v in agreement.figures().items() if v.agrees is False]
    level.problems = [p for p in level.problems if not p.startswith(DISAGREE)]
    if off:
        level.problems.append(DISAGREE + ", ".join(off))


def rejudge(results: SweepResults, out: Path) -> SweepResults:
    """Judge a finished sweep's second opinions again with this code, from what it kept: Locust's
    records and the benchmark's own result file of every level (a report made before a change of
    method gets the current one; its measurements stay as they were)."""
    s = results.settings
    workload = load_workload(s["workload"])
    for variant in results.variants:
        for level in variant.levels:
            kept = level.locust.records if level.locust else None
            raw_file = out / "vllm-bench" / Path(kept or "").name / "result.json"
            if level.vllm_bench_agreement is None or not kept or not raw_file.is_file():
                continue
            fresh = vllm_bench.summarize(json.loads(raw_file.read_text()), level.concurrency)
            if level.vllm_bench:  # what only the first judging had (the content check, other code's keys) stays
                fresh.content, fresh.extra = level.vllm_bench.content, level.vllm_bench.extra
            level.vllm_bench = fresh
            records = load_records(out / kept)
            judge_second_opinion(level, level.vllm_bench, records, workload, s.get("workers", 0))
            if level.status != "failed":
                level.status = "flagged" if level.problems else "ok"
        if variant.status in ("ok", "flagged"):
            variant.status = "flagged" if any(lv.status == "flagged" for lv in variant.levels) else "ok"
    results.problems = [p for p in results.problems if "Locust against vLLM's benchmark" not in p]
    results.problems += second_opinion.systematic_problems(results)
    if results.status in ("ok", "flagged"):
        results.status = overall_status(results)
    return results


def schedule_start(records: list[RequestRecord], rate: float, requests: int, seed: int) -> float | None:
    """Epoch time an open-loop run's schedule began (its offsets count from there): a record's
    scheduled arrival less its offset (`loadtest.traffic.arrivals`); None without one."""
    offsets = poisson_arrivals(requests, rate, seed)
    for r in records:
        if r.planned_start is not None and r.arrival is not None and 0 <= r.arrival < len(offsets):
            return r.planned_start - offsets[r.arrival]
    return None


def delivery_notes(client: ClientFigures, server: ServerFigures | None, outcome: LocustOutcome,
                   workers: int) -> list[str]:
    """Warn when responses reach the client much later than the engine produced them, and say where."""
    mine = client.ttft_ms.mean if client.ttft_ms else None
    theirs = server.histogram("ttft_s").mean if server else None
    if mine is None or theirs is None:
        return []
    theirs *= 1000
    if mine <= 2 * theirs + 50:
        return []
    busy = locust_share(outcome, workers)
    where = ("the load generator was busy too" if busy > 0.6 else
             f"the load generator was mostly idle ({100 * busy:.0f}% of a core), so the API server is the likely "
             f"cause (short of CPU?)")
    return [f"client TTFT mean {mine:.0f} ms vs the engine's {theirs:.0f} ms: chunks reach the client late; {where}. "
            f"Client-side latencies include that delay; the engine's are in brackets in the compare table"]


def locust_share(outcome: LocustOutcome, workers: int) -> float:
    """Busy cores per Locust process over the run (its start-up and quit included)."""
    return outcome.cpu_s / outcome.wall_s / max(workers, 1) if outcome.wall_s > 0 else 0.0


def load_generator_lag(records: list[RequestRecord], folder: Path) -> GeneratorLag:
    """How late the load generator was: requests leaving after their user's previous response
    (closed loop: they should leave at once), and gevent's loop waking later than asked."""
    lags: list[float] = []
    stalls: list[list[float]] = []  # [lag, run-queue wait] of each loop stall over 50 ms
    for path in folder.glob("loop-lag-*.json"):
        try:
            saved = json.loads(path.read_text())
            lags += saved["lags_s"]
            stalls += saved.get("stalls_s", [])
        except (OSError, ValueError, KeyError):
            continue
    stalled = sum(lag for lag, _ in stalls)
    # The wait is read over the whole sleep, so some of it can fall in the asked interval (other
    # greenlets runnable then): only up to the stall itself explains the stall.
    explained = sum(min(wait, lag) for lag, wait in stalls)
    loop = stats.distribution(lags, 1000)
    loop.max, loop.over_50ms = 1000 * max(lags) if lags else None, sum(x > 0.05 for x in lags)
    return GeneratorLag(send_lag_ms=stats.distribution([r.send_lag_s for r in records if r.send_lag_s is not None], 1000),
                        loop_lag_ms=loop, stall_runqueue_share=explained / stalled if stalled else None)


# Beyond these the client, not the server, may be what a latency percentile measures.
SEND_LAG_P99_MS = 20.0
LOOP_LAG_MAX_MS = 100.0


def load_generator_notes(outcome: LocustOutcome, workers: int, lag: GeneratorLag | None = None) -> list[str]:
    """Warn when Locust itself was busy or stalled enough to limit the numbers (it shares the machine)."""
    notes = []
    share = locust_share(outcome, workers)
    if share > 0.6:
        notes.append(f"the load generator used {100 * share:.0f}% of a core per Locust process: it may limit the "
                     f"measurement; use more Locust workers (--workers N) or another machine")
    lag = lag or GeneratorLag()
    loop = lag.loop_lag_ms or Distribution()
    if loop.max is not None and loop.max > LOOP_LAG_MAX_MS:
        runq = lag.stall_runqueue_share
        cause = "" if runq is None else (
            f"; for {100 * runq:.0f}% of that time the OS kept it runnable but off the CPU (run-queue wait): "
            f"the machine's cores were taken, not Locust busy" if runq >= 0.5 else
            f"; only {100 * runq:.0f}% of that time was run-queue wait: something in Locust's process held its loop")
        notes.append(f"the load generator's event loop stalled (longest {loop.max:.0f} ms, {loop.over_50ms} "
                     f"stalls over 50 ms{cause}): chunks that arrived meanwhile were timed late, so client latency "
                     f"tails include the client's own delay")
    return notes


def send_lag_notes(lag: GeneratorLag | None) -> list[str]:
    """A closed loop's users should send the moment a response ends: warn when they were late."""
    send = lag.send_lag_ms.p99 if lag and lag.send_lag_ms else None
    if send is None or send <= SEND_LAG_P99_MS:
        return []
    return [f"the load generator sent requests late (p99 {send:.0f} ms after the previous response ended): the "
            f"offered load was lower than the concurrency says"]


def overall_status(results: SweepResults) -> str:
    statuses = [v.status for v in results.variants]
    if "failed" in statuses or (results.problems and not statuses):
        return "failed"
    return "flagged" if "flagged" in statuses or results.problems else "ok"
