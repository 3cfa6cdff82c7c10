"""Locust against vLLM's benchmark: do two independent clients read the same engine?

After each Locust level the runner runs vLLM's serving benchmark on the same server, prompts,
length and load (`loadtest.traffic.vllm_bench`). `compare` checks output tokens/s (within 5%) and
TTFT and per-token latency p50 (within 10%) against Locust's, with the server's own drift between
the two windows taken out (the engine's counters are read around both) and latencies judged
request by request where the two match (`matched_ratios`); `systematic` takes a level's repeats
together, and `systematic_problems` says where they disagree.
"""

from __future__ import annotations

import statistics
from typing import Any

from loadtest.measurement import stats
from loadtest.measurement.figures import (Agreement, BenchFigures, ClientFigures, FigureAgreement,
                                          FigureSystematic, PerRequest, ServerFigures, Systematic, p50)
from loadtest.measurement.results import Closed, SweepResults

# How far Locust's figures may be from vLLM's benchmark before the report flags the level.
AGREEMENT = {"output_tokens_per_s": 0.05, "ttft_p50_ms": 0.10, "per_token_p50_ms": 0.10}


# Fewer matched requests than this share of a run: compare the two p50s instead.
MIN_MATCHED_SHARE = 0.5


def matched_ratios(records: list[Any], bench: BenchFigures, sequence_ids: list[str]) -> dict[str, list[float]]:
    """Locust's latency over the benchmark's for the same request: the i-th Locust request (by
    the time it was sent) and the benchmark's i-th are the same prompt at the same place of the
    sequence (checked by id; a pair that is not is skipped).

    Why not only compare the two p50s: a workload's TTFT follows its prompt lengths, and on the
    code prompts it has two clusters (11-17 and 28-42 tokens) with the median on the cliff between
    them. There a few ms of noise on one request moves either client's p50 past the tolerance,
    while request by request the two agree closely."""
    rows = bench.per_request or PerRequest()
    out: dict[str, list[float]] = {"ttft_p50_ms": [], "per_token_p50_ms": []}
    # Open loop: a record's `arrival` is its place in the schedule (a late send can overtake).
    order = sorted(records, key=lambda r: (r.arrival if r.arrival is not None else -1, r.start))
    for i, rec in enumerate(order[:len(sequence_ids)]):
        if rec.item_id != sequence_ids[i] or not rec.ok:
            continue
        for key, mine, theirs in (("ttft_p50_ms", rec.ttft_s, rows.ttft_ms[i:i + 1]),
                                  ("per_token_p50_ms", rec.per_token_latency_s, rows.per_token_ms[i:i + 1])):
            if mine and theirs and theirs[0]:
                out[key].append(1000 * mine / theirs[0])
    return out


# Each compared figure, and the engine histogram (`prom.HISTOGRAMS` key) that tracks the server's
# own speed for it: the means over the Locust window and over the benchmark's window give the
# drift of the server between the two, which the comparison takes out.
_ENGINE_TRACK = {"output_tokens_per_s": "e2e_s", "ttft_p50_ms": "ttft_s", "per_token_p50_ms": "per_token_latency_s"}


def engine_drift(locust_window: ServerFigures | None, bench_window: ServerFigures | None) -> dict[str, float | None]:
    """How much slower (+) or faster the engine itself was in the benchmark's window than in
    Locust's, per compared figure: the ratio of the engine's own mean latencies, minus one."""
    out: dict[str, float | None] = {}
    for key, hist in _ENGINE_TRACK.items():
        mine = locust_window.histogram(hist).mean if locust_window else None
        theirs = bench_window.histogram(hist).mean if bench_window else None
        out[key] = theirs / mine - 1 if mine and theirs else None
    return out


def compare(client: ClientFigures, bench: BenchFigures, locust_window: ServerFigures | None = None,
            bench_window: ServerFigures | None = None,
            matched: dict[str, list[float]] | None = None, throughput_follows_engine: bool = True) -> Agreement:
    """Locust's figures against the benchmark's: the relative difference of each, and whether it agrees.

    The two clients run one after the other, and on a shared machine the server's own speed moves
    from one minute to the next. Given the engine's counters over each client's window
    (`prom.delta`), the benchmark's figure is first brought to the engine speed of Locust's window
    (`adjusted`), so that the check judges the clients, not the machine; the raw difference and
    the engine's drift are kept beside it. Given `matched` ratios (`matched_ratios`), latencies are
    judged request by request: the median of Locust's over the benchmark's for the same request
    (`matched_difference`), drift taken out likewise.

    `throughput_follows_engine` False (an open loop: both ran the same arrival schedule): throughput
    follows the arrivals more than the engine's speed and is compared as measured (no drift taken
    out); the tolerances (`AGREEMENT`) are the same."""
    pairs = {"output_tokens_per_s": (client.output_tokens_per_s, bench.output_tokens_per_s),
             "ttft_p50_ms": (p50(client.ttft_ms), p50(bench.ttft_ms)),
             "per_token_p50_ms": (p50(client.per_token_latency_ms), p50(bench.per_token_latency_ms))}
    drift = engine_drift(locust_window, bench_window)
    out = Agreement()
    for key, (mine, theirs) in pairs.items():
        diff = (mine - theirs) / theirs if mine is not None and theirs else None
        adjusted = None
        if theirs and drift[key] is not None and (throughput_follows_engine or key != "output_tokens_per_s"):
            # A latency scales with the engine's; throughput (fixed-length closed loop) inversely.
            adjusted = theirs * (1 + drift[key]) if key == "output_tokens_per_s" else theirs / (1 + drift[key])
        judged = (mine - adjusted) / adjusted if mine is not None and adjusted else diff
        ratios = (matched or {}).get(key) or []
        matched_diff = None
        if ratios and len(ratios) >= MIN_MATCHED_SHARE * (client.requests or len(ratios)):
            median = statistics.median(ratios)
            matched_diff = median - 1
            judged = median * (1 + drift[key]) - 1 if drift[key] is not None else matched_diff
        setattr(out, key, FigureAgreement(
            locust=mine, vllm_bench=theirs, difference=diff, engine_drift=drift[key], vllm_bench_adjusted=adjusted,
            difference_adjusted=judged if adjusted or matched_diff is not None else None,
            matched_difference=matched_diff, matched_requests=len(ratios) if matched_diff is not None else None,
            tolerance=AGREEMENT[key], agrees=None if judged is None else abs(judged) <= AGREEMENT[key]))
    checked = [v.agrees for v in out.figures().values() if v.agrees is not None]
    out.agrees = all(checked) if checked else None
    return out



def systematic(agreements: list[Agreement]) -> Systematic:
    """A level's repeated runs taken together: do the clients measure the same, and does Locust
    leave the server as fast as the benchmark does?

    - `mean`: the judged differences (drift taken out, latencies request by request) averaged:
      how far the two clients read the same engine apart.
    - `engine_drift_mean`: how much slower (+) the engine itself ran under the benchmark than
      under Locust, averaged. A client that takes CPU from the server it loads slows the engine
      in its own window in every run; the drift taken out of each run would hide that, so the
      engine must not be slower under Locust by more than the tolerance on average and
      consistently (every run, or a 95% interval below zero). The machine's own drift changes
      sign from run to run and is not flagged.
    Where a run has no engine figures, its raw difference stands for both."""
    out = Systematic()
    for key, tolerance in AGREEMENT.items():
        rows = [f for f in (a.figures().get(key) for a in agreements) if f and f.difference is not None]
        judged = [r.judged for r in rows]
        drifts = [r.engine_drift for r in rows if r.engine_drift is not None]
        m = stats.mean_interval(judged)
        d = stats.mean_interval(drifts)
        consistent = all(x < 0 for x in drifts) or (d.high is not None and d.high < 0)
        slowed = d.mean is not None and d.mean < -tolerance and consistent  # the engine slower under Locust
        setattr(out, key, FigureSystematic(
            n=m.n, mean=m.mean, low=m.low, high=m.high, max_deviation=m.max_deviation, runs=len(judged),
            tolerance=tolerance, engine_drift_mean=d.mean,
            agrees=None if m.mean is None else abs(m.mean) <= tolerance and not slowed))
    checked = [v.agrees for v in out.figures().values() if v.agrees is not None]
    out.agrees = all(checked) if checked else None
    return out


def systematic_by_level(results: SweepResults) -> list[Systematic]:
    """`systematic` for every (variant, concurrency) of a sweep's results that has comparisons."""
    groups: dict[tuple[str, int], list[Agreement]] = {}
    for variant, level in results.levels(Closed):
        if level.vllm_bench_agreement:
            groups.setdefault((variant.name, level.concurrency or 0), []).append(level.vllm_bench_agreement)
    out = []
    for (name, c), agreements in groups.items():
        entry = systematic(agreements)
        entry.variant, entry.concurrency = name, c
        out.append(entry)
    return out


def systematic_problems(results: SweepResults) -> list[str]:
    """A problem for each (variant, concurrency) where Locust and vLLM's benchmark disagree over its runs."""
    return [describe_systematic(e) for e in systematic_by_level(results) if e.agrees is False]


JUDGED_NAMES = (("output_tokens_per_s", "tok/s"), ("ttft_p50_ms", "TTFT"), ("per_token_p50_ms", "per-token"))
"""The figures `systematic` judges, as a level's line names them."""


def describe_systematic(entry: Systematic) -> str:
    """One line: a level's mean differences over its runs, the engine's mean drift, the verdict."""
    figures = entry.figures()
    parts = [f"{name} {100 * figures[key].mean:+.1f}%" for key, name in JUDGED_NAMES
             if key in figures and figures[key].mean is not None]
    runs = max(f.runs for f in figures.values())
    drift = entry.output_tokens_per_s.engine_drift_mean if entry.output_tokens_per_s else None
    engine = (f"; the engine itself ran {100 * abs(drift):.1f}% {'slower' if drift > 0 else 'faster'} under the "
              f"benchmark than under Locust" if drift is not None else "")
    verdict = "agree" if entry.agrees else f"DISAGREE ({'; '.join(_why_not(entry))})"
    return (f"batch {entry.concurrency}, {entry.variant}: Locust against vLLM's benchmark, mean over {runs} "
            f"run{'s' if runs != 1 else ''} (engine drift taken out, latencies request by request): "
            f"{', '.join(parts)}{engine}: {verdict}")


def _why_not(entry: Systematic) -> list[str]:
    """Which figure of a level failed `systematic`'s check, and how: the line names it, so a reader
    need not guess which of three figures and two rules it was."""
    out = []
    for key, name in JUDGED_NAMES:
        check = entry.figures().get(key)
        if check is None or check.agrees is not False:
            continue
        if abs(check.mean or 0) > check.tolerance:
            out.append(f"{name} {100 * (check.mean or 0):+.1f}% beyond {100 * check.tolerance:.0f}%")
        else:
            out.append(f"the engine's {name} {100 * abs(check.engine_drift_mean or 0):.1f}% slower under Locust "
                       f"than under the benchmark, beyond {100 * check.tolerance:.0f}%")
    return out
