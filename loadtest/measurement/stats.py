"""Numbers from request records, and the speculative-decoding arithmetic of the report.

Two acceptance numbers, not to be mixed up:
  alpha  vLLM's acceptance rate = accepted / drafted tokens (what /metrics and vLLM's benchmark
         report). With K tokens a draft, tokens per verification step L = 1 + K x alpha.
  a      the per-token acceptance of the speculative-decoding model (Leviathan et al. 2023):
         each draft token is accepted with probability a if all before it were, so
           expected tokens per verification step   E(a, K) = (1 - a^(K+1)) / (1 - a).
         The report shows E(alpha, K), the formula fed with vLLM's rate, and the a implied by
         the measurement (E(a, K) = measured L); alpha < a when acceptance stops at the first
         rejected token, so E(alpha, K) understates the tokens a step.
Costs come from the measurements: a speculative step takes per-token latency x L (tokens per
step). Per-token latency is the engine's own mean (`vllm:request_time_per_output_token_seconds`,
free of the API server's and the client's delivery delays) when the server reports it, else the
client's. The baseline's per-token latency at the same concurrency is one target step, so the
step cost ratio is
  r = (TPOT_spec x L) / TPOT_base      (= K x draft cost + verification, in target steps)
and speculation pays when it makes more than r tokens a step: L > r, i.e.
  break-even acceptance rate  alpha* = (r - 1) / K      (vLLM's units)
  break-even per-token a*:    E(a*, K) = r             (the model's units; never if r >= K + 1).
If verifying K+1 tokens costs about one target step (memory-bound), alpha* is also the cost of
one draft token in target steps. The measured per-token speedup is TPOT_base / TPOT_spec = L / r.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from loadtest.measurement import content
from loadtest.measurement.derived import SpeculationAnalysis
from loadtest.measurement.figures import (CategoryFigures, ClientFigures, ContentReference, Consistency,
                                          Distribution, Interval, OpenLoopFigures)
from loadtest.measurement.records import OUTCOMES, RequestRecord

A = TypeVar("A", bound=SpeculationAnalysis)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile, p in [0, 100], interpolated linearly between closest ranks (NumPy's
    default method); None for no values."""
    if len(values) == 0:
        return None
    return float(np.percentile(values, p, method="linear"))


def distribution(values: Sequence[float], scale: float = 1.0, extremes: bool = False) -> Distribution:
    """mean, std, and percentiles of `values` x `scale` (e.g. 1000 for seconds -> ms); with
    `extremes`, min and max too."""
    v = [x * scale for x in values]
    return Distribution(n=len(v), mean=statistics.fmean(v) if v else None, std=statistics.pstdev(v) if v else None,
                        p50=percentile(v, 50), p90=percentile(v, 90), p95=percentile(v, 95), p99=percentile(v, 99),
                        min=min(v, default=None) if extremes else None, max=max(v, default=None) if extremes else None)


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Mean of repeated measurements and its two-sided `confidence` interval (Student's t), with
    the largest relative distance of a run from the mean; no interval from fewer than two runs."""
    n = len(values)
    if n == 0:
        return Interval(n=0)
    mean = statistics.fmean(values)
    out = Interval(n=n, mean=mean, max_deviation=max(abs(v - mean) for v in values) / mean if mean else None)
    if n >= 2:
        from scipy.stats import t

        half = t.ppf(0.5 + confidence / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
        out.low, out.high = mean - half, mean + half
    return out


def expected_tokens_per_step(a: float, k: int) -> float:
    """E(a, K) = (1 - a^(K+1)) / (1 - a): tokens per verification step at i.i.d. acceptance a."""
    if k < 0:
        raise ValueError("K must be >= 0")
    if a >= 1:
        return float(k + 1)
    if a <= 0:
        return 1.0
    return (1 - a ** (k + 1)) / (1 - a)


def break_even_acceptance(cost_ratio: float, k: int) -> float | None:
    """The a* with E(a*, K) = cost_ratio: 0 if speculation pays even at a = 0, None if never (r >= K + 1)."""
    if cost_ratio <= 1:
        return 0.0
    if cost_ratio >= k + 1:
        return None
    return implied_per_token_acceptance(cost_ratio, k)


def implied_per_token_acceptance(tokens_per_step: float, k: int) -> float | None:
    """The a with E(a, K) = tokens_per_step (the model's per-token acceptance behind a measurement)."""
    if k < 1 or tokens_per_step < 1 or tokens_per_step > k + 1:
        return None
    lo, hi = 0.0, 1.0  # E is increasing in a: bisect
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_step(mid, k) < tokens_per_step else (lo, mid)
    return (lo + hi) / 2


def speculation_analysis(acceptance: float | None, accepted_length: float | None, k: int,
                         tpot_spec_s: float | None, tpot_base_s: float | None,
                         cls: type[A] = SpeculationAnalysis, **more: Any) -> A:  # type: ignore[assignment]
    """Measured acceptance beside the model's expectations and the break-even acceptance, as a
    `cls` (a `SpeculationAnalysis` or a subclass, with its own fields `more`)."""
    out = cls(k=k, acceptance_rate=acceptance, mean_accepted_length=accepted_length,
              expected_tokens_per_step=expected_tokens_per_step(acceptance, k) if acceptance is not None else None,
              implied_per_token_acceptance=(implied_per_token_acceptance(accepted_length, k)
                                            if accepted_length is not None else None), **more)
    if accepted_length is None or tpot_spec_s is None or not tpot_base_s:
        return out
    ratio = tpot_spec_s * accepted_length / tpot_base_s
    out.step_cost_ratio = ratio
    # alpha* >= 1 would need every draft token accepted: never pays.
    out.break_even_acceptance_rate = max(0.0, (ratio - 1) / k) if k and ratio < k + 1 else None
    out.break_even_per_token_acceptance = break_even_acceptance(ratio, k)
    out.measured_speedup = tpot_base_s / tpot_spec_s
    out.pays = accepted_length > ratio
    return out


def summarize(records: Sequence[RequestRecord], embedded: bool = False,
              interval_start: float | None = None) -> ClientFigures:
    """Client-side numbers of one measured phase (warm-up already excluded), with the content
    check of its outputs (`content`; `embedded`: the embedded pair served, so its held-out code is
    the reference where the prompts are too short to be one). The measured interval runs from the
    first send, or from `interval_start` (an open loop's schedule start, as vLLM's benchmark
    counts it), to the last end."""
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    reasons: dict[str, int] = {}
    for r in failed:
        reason = (r.error or "unknown").split(":")[0] if not (r.error or "").startswith("stream ended early") \
            else "stream ended early"
        reasons[reason] = reasons.get(reason, 0) + 1
    out = ClientFigures(requests=len(records), ok=len(ok), failed=len(failed), failure_reasons=reasons,
                        failure_examples=[r.error for r in failed[:5]])
    if not records:
        return out
    # The measured interval: first request sent -> last response finished (all of them, failed too).
    start = min(r.start for r in records) if interval_start is None else interval_start
    end = max(r.end for r in records)
    wall = max(end - start, 1e-9)
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    prompt_tokens = sum(r.prompt_tokens or 0 for r in ok)
    out.interval_start, out.interval_end, out.duration_s = start, end, wall
    out.output_tokens, out.prompt_tokens = out_tokens, prompt_tokens
    out.tokens_seen = sum(r.tokens_seen for r in records)  # failed requests' partial streams included
    out.request_throughput = len(ok) / wall
    out.output_tokens_per_s = out_tokens / wall
    out.total_tokens_per_s = (out_tokens + prompt_tokens) / wall
    out.per_user_tokens_per_s = distribution([r.tokens_per_s for r in ok if r.tokens_per_s is not None])
    out.ttft_ms = distribution([r.ttft_s for r in ok if r.ttft_s is not None], 1000)
    out.per_token_latency_ms = distribution([r.per_token_latency_s for r in ok if r.per_token_latency_s is not None],
                                            1000)
    out.chunk_gap_ms = distribution([g for r in ok for g in r.chunk_gaps_s], 1000)
    out.tokens_per_chunk = distribution([t for r in ok for t in r.tokens_per_chunk])
    out.e2e_ms = distribution([r.e2e_s for r in ok if r.e2e_s is not None], 1000)
    out.output_tokens_per_request = distribution([r.output_tokens or 0 for r in ok], extremes=True)
    out.peak_output_tokens_per_s = _peak_rate(ok, start)
    figs = [r.content for r in ok]
    out.content = content.summarize(figs, content.reference_for([f for f in figs if f], embedded),
                                    [r.spec_decode for r in ok], [r.tokens_per_s for r in ok])
    spec = [r.spec_decode for r in ok if r.spec_decode]
    if spec:
        out.server_per_request_spec = {k: statistics.fmean(s[k] for s in spec if isinstance(s.get(k), (int, float)))
                                       for k in spec[0] if isinstance(spec[0][k], (int, float))}
    return out


def by_category(records: Sequence[RequestRecord], categories: dict[str, str | None],
                reference: ContentReference | None = None) -> dict[str, CategoryFigures]:
    """A run's figures per prompt category (`categories`: item id -> category): requests served,
    output tokens, mean per-request output tokens/s, acceptance over the category's requests (the
    server's per-request figures) and how many outputs are no text (loops or noise), judged against
    the run's own content `reference` (its `summarize(...).content.reference`)."""
    groups: dict[str, list[RequestRecord]] = {}
    for r in records:
        category = categories.get(r.item_id)
        if category and r.ok:
            groups.setdefault(category, []).append(r)
    out = {}
    for category, group in groups.items():
        speeds = [r.tokens_per_s for r in group if r.tokens_per_s is not None]
        checked = content.summarize([r.content for r in group], reference)
        out[category] = CategoryFigures(requests=len(group), output_tokens=sum(r.output_tokens or 0 for r in group),
                                        tokens_per_s=statistics.fmean(speeds) if speeds else None,
                                        acceptance=content.acceptance([r.spec_decode for r in group]),
                                        not_text=checked.not_text)
    return out


def _peak_rate(records: Sequence[RequestRecord], start: float) -> float:
    """Highest output tokens in any one-second bin (as vLLM's benchmark reports it)."""
    bins: dict[int, int] = {}
    for r in records:
        if r.ttft_s is None:
            continue
        t = r.start + r.ttft_s
        gaps = [0.0, *r.chunk_gaps_s]
        for gap, tokens in zip(gaps, r.tokens_per_chunk):
            t += gap
            key = int(t - start)
            bins[key] = bins.get(key, 0) + tokens
    return float(max(bins.values(), default=0))


def agreement(client_tokens: float, server_tokens: float, tolerance: float = 0.05) -> Consistency:
    """Do the client's token counts match the server's counter over the same interval?"""
    if server_tokens <= 0:
        return Consistency(ok=client_tokens == 0, tolerance=tolerance)
    error = abs(client_tokens - server_tokens) / server_tokens
    return Consistency(ok=error <= tolerance, relative_error=error, tolerance=tolerance)


# An open-loop generator is behind when it sent under this share of the asked rate, or when its
# send lag's p99 (actual send minus scheduled arrival) passed OPEN_LOOP_LAG_P99_S: then the
# offered load was not the Poisson process asked for. 100 ms: on a shared machine the event
# loop stalls for a fraction of that now and then (`LOOP_LAG_MAX_MS` in `loadtest.sweeps.judging`),
# which moves a few sends without changing the load; a p99 beyond it means sends queued in the generator.
OPEN_LOOP_MIN_RATE_SHARE = 0.95
OPEN_LOOP_LAG_P99_S = 0.1


def in_flight_series(records: Sequence[RequestRecord]) -> list[list[float]]:
    """Requests in flight over time, [[t_s, n], ...] from the first send (t_s = 0): one point at
    each send and each end, n counted after it. A request in flight is one sent whose response
    has not ended (queued in the server or being generated)."""
    events = sorted([(r.start, 1) for r in records] + [(r.end, -1) for r in records], key=lambda e: (e[0], e[1]))
    if not events:
        return []
    t0, n, out = events[0][0], 0, []
    for t, step in events:
        n += step
        out.append([round(t - t0, 4), n])
    return out


def open_loop(records: Sequence[RequestRecord], asked_rate: float,
              asked_requests: int | None = None) -> OpenLoopFigures:
    """What an open-loop run offered and how its requests ended.

    - achieved_rate: sends over the span of the actual sends, (sent - 1) / (last send - first
      send); `scheduled_rate` is the same over the scheduled arrivals of those requests (the asked
      rate up to the random draw: vLLM's schedule ends at n / rate, so for n >= 20 it is never
      below 95% of the asked rate).
    - send_lag_ms: actual send minus scheduled arrival, distribution with its max.
    - in_flight: the series of `in_flight_series`, its max and its time-weighted mean over the
      first send to the last end.
    - behind: achieved_rate < 95% of the asked rate (of the scheduled rate, where that is lower),
      or send lag p99 > OPEN_LOOP_LAG_P99_S.
    - outcomes: counts of `RequestRecord.outcome`; with `asked_requests`, requests with no record
      at all (a Locust process killed) count as unsent too.
    """
    outcomes = {k: 0 for k in OUTCOMES}
    for r in records:
        outcomes[r.outcome] += 1
    if asked_requests is not None and asked_requests > len(records):
        outcomes["unsent"] += asked_requests - len(records)
    sent = sorted((r for r in records if r.outcome != "unsent"), key=lambda r: r.start)
    out = OpenLoopFigures(asked_rate=asked_rate, sent=len(sent), outcomes=outcomes,
                          requests=asked_requests if asked_requests is not None else len(records))
    span = sent[-1].start - sent[0].start if len(sent) > 1 else 0.0
    out.achieved_rate = (len(sent) - 1) / span if span > 0 else None
    planned = sorted(r.planned_start for r in sent if r.planned_start is not None)
    planned_span = planned[-1] - planned[0] if len(planned) > 1 else 0.0
    out.scheduled_rate = (len(planned) - 1) / planned_span if planned_span > 0 else None
    lags = [r.send_lag_s for r in sent if r.send_lag_s is not None]
    out.send_lag_ms = distribution(lags, 1000)
    out.send_lag_ms.max = 1000 * max(lags) if lags else None
    series = in_flight_series(sent)
    out.in_flight = series
    out.in_flight_max = max((n for _, n in series), default=0)
    total = series[-1][0] if series else 0.0
    # Time-weighted: each level of the series held from its point to the next.
    out.in_flight_mean = sum(a[1] * (b[0] - a[0]) for a, b in zip(series, series[1:])) / total if total > 0 else None
    reference = min(asked_rate, out.scheduled_rate or asked_rate)
    lag_p99 = percentile(lags, 99)
    reasons = []
    if out.achieved_rate is not None and out.achieved_rate < OPEN_LOOP_MIN_RATE_SHARE * reference:
        reasons.append(f"sent {out.achieved_rate:.2f} requests/s of {asked_rate:g} asked")
    if lag_p99 is not None and lag_p99 > OPEN_LOOP_LAG_P99_S:
        reasons.append(f"send lag p99 {1000 * lag_p99:.0f} ms over {1000 * OPEN_LOOP_LAG_P99_S:.0f} ms")
    if outcomes["unsent"]:
        reasons.append(f"{outcomes['unsent']} of {out.requests} requests never sent")
    out.behind = bool(reasons)
    out.behind_reasons = reasons
    return out
