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
from typing import Any

import numpy as np

from loadtest import content
from loadtest.client import RequestRecord

PERCENTILES = (50, 90, 95, 99)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile, p in [0, 100], interpolated linearly between closest ranks (NumPy's
    default method); None for no values."""
    if len(values) == 0:
        return None
    return float(np.percentile(values, p, method="linear"))


def distribution(values: Sequence[float], scale: float = 1.0) -> dict[str, float | None]:
    """mean, std, and percentiles of `values` x `scale` (e.g. 1000 for seconds -> ms)."""
    v = [x * scale for x in values]
    out: dict[str, float | None] = {
        "n": len(v), "mean": statistics.fmean(v) if v else None, "std": statistics.pstdev(v) if v else None,
    }
    out.update({f"p{p}": percentile(v, p) for p in PERCENTILES})
    return out


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> dict[str, float | None]:
    """Mean of repeated measurements and its two-sided `confidence` interval (Student's t), with
    the largest relative distance of a run from the mean; no interval from fewer than two runs."""
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "low": None, "high": None, "max_deviation": None}
    mean = statistics.fmean(values)
    out: dict[str, float | None] = {"n": n, "mean": mean, "low": None, "high": None,
                                    "max_deviation": max(abs(v - mean) for v in values) / mean if mean else None}
    if n >= 2:
        from scipy.stats import t

        half = t.ppf(0.5 + confidence / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
        out.update(low=mean - half, high=mean + half)
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
    lo, hi = 0.0, 1.0  # E is increasing in a: bisect
    for _ in range(100):
        mid = (lo + hi) / 2
        if expected_tokens_per_step(mid, k) < cost_ratio:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def implied_per_token_acceptance(tokens_per_step: float, k: int) -> float | None:
    """The a with E(a, K) = tokens_per_step (the model's per-token acceptance behind a measurement)."""
    if k < 1 or tokens_per_step < 1 or tokens_per_step > k + 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_step(mid, k) < tokens_per_step else (lo, mid)
    return (lo + hi) / 2


def speculation_analysis(acceptance: float | None, accepted_length: float | None, k: int,
                         tpot_spec_s: float | None, tpot_base_s: float | None) -> dict[str, Any]:
    """Measured acceptance beside the model's expectations and the break-even acceptance."""
    out: dict[str, Any] = {"k": k, "acceptance_rate": acceptance, "mean_accepted_length": accepted_length}
    out["expected_tokens_per_step"] = expected_tokens_per_step(acceptance, k) if acceptance is not None else None
    out["implied_per_token_acceptance"] = (implied_per_token_acceptance(accepted_length, k)
                                           if accepted_length is not None else None)
    if accepted_length is None or tpot_spec_s is None or not tpot_base_s:
        return out
    ratio = tpot_spec_s * accepted_length / tpot_base_s
    out.update({
        "step_cost_ratio": ratio,
        # alpha* >= 1 would need every draft token accepted: never pays.
        "break_even_acceptance_rate": max(0.0, (ratio - 1) / k) if k and ratio < k + 1 else None,
        "break_even_per_token_acceptance": break_even_acceptance(ratio, k),
        "measured_speedup": tpot_base_s / tpot_spec_s,
        "pays": accepted_length > ratio,
    })
    return out


def summarize(records: Sequence[RequestRecord], embedded: bool = False) -> dict[str, Any]:
    """Client-side numbers of one measured phase (warm-up already excluded), with the content
    check of its outputs (`content`; `embedded`: the embedded pair served, so its held-out code is
    the reference where the prompts are too short to be one)."""
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    out: dict[str, Any] = {"requests": len(records), "ok": len(ok), "failed": len(failed)}
    reasons: dict[str, int] = {}
    for r in failed:
        reason = (r.error or "unknown").split(":")[0] if not (r.error or "").startswith("stream ended early") \
            else "stream ended early"
        reasons[reason] = reasons.get(reason, 0) + 1
    out["failure_reasons"] = reasons
    out["failure_examples"] = [r.error for r in failed[:5]]
    if not records:
        return out
    # The measured interval: first request sent -> last response finished (all of them, failed too).
    start = min(r.start for r in records)
    end = max(r.end for r in records)
    wall = max(end - start, 1e-9)
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    out.update({
        "interval_start": start, "interval_end": end, "duration_s": wall,
        "output_tokens": out_tokens,
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in ok),
        # Every token the server generated for us, failed requests' partial streams included.
        "tokens_seen": sum(r.tokens_seen for r in records),
        "request_throughput": len(ok) / wall,
        "output_tokens_per_s": out_tokens / wall,
        "total_tokens_per_s": (out_tokens + sum(r.prompt_tokens or 0 for r in ok)) / wall,
        "per_user_tokens_per_s": distribution([(r.output_tokens or 0) / r.e2e_s for r in ok if r.e2e_s]),
        "ttft_ms": distribution([r.ttft_s for r in ok if r.ttft_s is not None], 1000),
        "per_token_latency_ms": distribution([r.per_token_latency_s for r in ok
                                              if r.per_token_latency_s is not None], 1000),
        "chunk_gap_ms": distribution([g for r in ok for g in r.chunk_gaps_s], 1000),
        "tokens_per_chunk": distribution([t for r in ok for t in r.tokens_per_chunk]),
        "e2e_ms": distribution([r.e2e_s for r in ok if r.e2e_s is not None], 1000),
        "output_tokens_per_request": {**distribution([r.output_tokens or 0 for r in ok]),
                                      "min": min((r.output_tokens or 0 for r in ok), default=None),
                                      "max": max((r.output_tokens or 0 for r in ok), default=None)},
        "peak_output_tokens_per_s": _peak_rate(ok, start),
    })
    figs = [r.content for r in ok]
    out["content"] = content.summarize(figs, content.reference_for([f for f in figs if f], embedded),
                                       [r.spec_decode for r in ok],
                                       [(r.output_tokens or 0) / r.e2e_s if r.e2e_s else None for r in ok])
    spec = [r.spec_decode for r in ok if r.spec_decode]
    if spec:
        out["server_per_request_spec"] = {k: statistics.fmean(s[k] for s in spec if isinstance(s.get(k), (int, float)))
                                          for k in spec[0] if isinstance(spec[0][k], (int, float))}
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


def agreement(client_tokens: float, server_tokens: float, tolerance: float = 0.05) -> dict[str, Any]:
    """Do the client's token counts match the server's counter over the same interval?"""
    if server_tokens <= 0:
        return {"ok": client_tokens == 0, "relative_error": None, "tolerance": tolerance}
    error = abs(client_tokens - server_tokens) / server_tokens
    return {"ok": error <= tolerance, "relative_error": error, "tolerance": tolerance}
