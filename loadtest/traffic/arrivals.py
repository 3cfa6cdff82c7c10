"""Arrival times of an open-loop run: a Poisson process, exactly as vLLM's serving benchmark draws it.

vLLM's `benchmarks/serve.py` (`get_request`, burstiness 1, no ramp-up) draws each gap between
requests from a gamma distribution with shape 1 and scale 1/rate (an exponential: a Poisson
process), sums them, and rescales the sums so the last arrival falls at exactly n / rate (so runs
with different seeds offer the same mean rate). The draws come from NumPy's global generator,
which its main seeds with `np.random.seed(args.seed)` first.

Between that seeding and `get_request`, the benchmark with `--dataset-name custom` draws nothing
from NumPy: `CustomDataset` shuffles and oversamples with Python's `random` module (and we pass
`--disable-shuffle`, writing exactly `--num-prompts` lines), and the benchmark sends no warm-ups
here (`--num-warmups 0`). So `poisson_arrivals(n, rate, seed)` equals the offsets vLLM's benchmark
uses with `--request-rate rate --seed seed --num-prompts n`: Locust and the benchmark send the
same prompts at the same times (each from its own start). The test suite checks this against
vLLM's own `get_request`.
"""

from __future__ import annotations

import numpy as np


def poisson_arrivals(n: int, rate: float, seed: int, repeat_head: int = 0) -> list[float]:
    """Offsets in seconds from the run's start of `n` arrivals at `rate` requests/s. With
    `repeat_head` = w, the last w arrivals repeat the gaps of the first w (`replayed`): a soak's
    two judged windows then offer the same load, where independent Poisson windows of 500 differ
    in rate by several percent, and latency with it (vLLM's benchmark has no such option)."""
    if not 0 <= repeat_head <= n // 2:
        raise ValueError(f"repeat_head {repeat_head} must be between 0 and half of {n} arrivals")
    if n <= 0:
        return []
    if rate <= 0:
        raise ValueError(f"an arrival rate must be positive, not {rate}")
    # A RandomState seeded with `seed` gives the same stream as `np.random.seed(seed)` then
    # `np.random.gamma(...)`, without touching the global generator.
    rng = np.random.RandomState(seed)
    theta = 1.0 / rate  # vLLM: 1 / (rate x burstiness), burstiness 1
    delays = [float(rng.gamma(shape=1.0, scale=theta)) for _ in range(n)]  # one draw each, as vLLM does
    for i in range(1, n):
        delays[i] += delays[i - 1]
    if delays[-1] != 0:
        factor = (n / rate) / delays[-1]
        delays = [d * factor for d in delays]
    if repeat_head:  # the head stays as drawn; the tail's gaps are the head's
        head_gaps = [delays[0]] + [b - a for a, b in zip(delays, delays[1:repeat_head])]
        at = delays[n - repeat_head - 1]
        for i, gap in enumerate(head_gaps, n - repeat_head):
            at += gap
            delays[i] = at
    return delays


def replayed(index: int, n: int, repeat_head: int) -> int:
    """The arrival whose gap and prompt arrival `index` of `n` repeats (itself outside the tail):
    with `repeat_head` = w, arrival n - w + j repeats arrival j."""
    return index - (n - repeat_head) if repeat_head and index >= n - repeat_head else index
