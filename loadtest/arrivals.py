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


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Offsets in seconds from the run's start of `n` arrivals at `rate` requests/s."""
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
    return delays
