"""Read vLLM's Prometheus `/metrics` and turn two snapshots into what happened in between.

Speculation counters (as vLLM's own `vllm/benchmarks/serve.py` reads them):
  vllm:spec_decode_num_drafts_total             verification steps that had a draft
  vllm:spec_decode_num_draft_tokens_total       draft tokens proposed
  vllm:spec_decode_num_accepted_tokens_total    draft tokens the target accepted
  vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}
acceptance rate = accepted / draft tokens; mean accepted length = 1 + accepted / drafts
(tokens produced per verification step, the bonus token included); effective K = draft tokens /
drafts (the K the engine gave a request at a step that drafted: under a schedule, the K of the
running batch sizes the run went through). Also the generated and
prompt token counters and the latency histograms, to check the client's numbers against.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import requests
from prometheus_client.parser import text_string_to_metric_families

from loadtest.measurement.figures import HistogramFigures, ServerFigures

Labels = tuple[tuple[str, str], ...]


def parse_metrics(text: str) -> dict[str, list[tuple[Labels, float]]]:
    """Prometheus text format -> {sample name: [(labels, value), ...]}, by prometheus_client's own
    parser (histograms give their `_bucket`, `_sum` and `_count` samples, counters `_total`)."""
    samples: dict[str, list[tuple[Labels, float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((tuple(sorted(sample.labels.items())), float(sample.value)))
    return samples


@dataclass(frozen=True)
class Snapshot:
    samples: dict[str, list[tuple[Labels, float]]]
    taken_at: float
    """Wall-clock time of the scrape (epoch seconds)."""

    def total(self, name: str) -> float:
        """Sum over all label sets; 0 when the metric is absent."""
        return sum(v for _, v in self.samples.get(name, []))

    def has(self, name: str) -> bool:
        return name in self.samples

    def by_label(self, name: str, label: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for labels, value in self.samples.get(name, []):
            key = dict(labels).get(label)
            if key is not None:
                out[key] = out.get(key, 0.0) + value
        return out

    def histogram(self, name: str) -> Histogram:
        buckets: dict[float, float] = {}
        for labels, value in self.samples.get(f"{name}_bucket", []):
            le = dict(labels).get("le")
            if le is not None:
                bound = math.inf if le in ("+Inf", "inf") else float(le)
                buckets[bound] = buckets.get(bound, 0.0) + value
        return Histogram(self.total(f"{name}_sum"), self.total(f"{name}_count"), dict(sorted(buckets.items())))


@dataclass(frozen=True)
class Histogram:
    sum: float
    count: float
    buckets: dict[float, float] = field(default_factory=dict)
    """Cumulative counts by upper bound."""

    def minus(self, before: Histogram) -> Histogram:
        return Histogram(self.sum - before.sum, self.count - before.count,
                         {b: c - before.buckets.get(b, 0.0) for b, c in self.buckets.items()})

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear inside the bucket that holds the q-th observation."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        lower_bound, lower_count = 0.0, 0.0
        for bound, cumulative in self.buckets.items():
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower_bound
                inside = cumulative - lower_count
                frac = (rank - lower_count) / inside if inside > 0 else 1.0
                return lower_bound + (bound - lower_bound) * frac
            lower_bound, lower_count = bound, cumulative
        return lower_bound


def scrape(base_url: str, timeout_s: float = 10, headers: dict[str, str] | None = None) -> Snapshot:
    response = requests.get(f"{base_url.rstrip('/')}/metrics", timeout=timeout_s, headers=headers)
    response.raise_for_status()
    return Snapshot(parse_metrics(response.text), time.time())


def scrape_settled(base_url: str, timeout_s: float = 20, headers: dict[str, str] | None = None) -> Snapshot:
    """A snapshot taken once the server is idle and its counters stopped moving.

    vLLM updates its counters just after it sends the outputs, so a scrape right after the
    last response can miss the last step. Bounded: returns the latest snapshot at the timeout.
    """
    deadline = time.monotonic() + timeout_s
    last = scrape(base_url, headers=headers)
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = scrape(base_url, headers=headers)
        idle = now.total("vllm:num_requests_running") == 0 and now.total("vllm:num_requests_waiting") == 0
        if idle and now.total(GEN_TOKENS) == last.total(GEN_TOKENS) and now.total(DRAFTS) == last.total(DRAFTS):
            return now
        last = now
    return last


GEN_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
REQUEST_SUCCESS = "vllm:request_success_total"
HISTOGRAMS = {
    "ttft_s": "vllm:time_to_first_token_seconds",
    "inter_token_latency_s": "vllm:inter_token_latency_seconds",
    "e2e_s": "vllm:e2e_request_latency_seconds",
    # decode time / (tokens - 1) per request, on the engine's clock: the per-token latency
    # without the API server's and the client's delivery delays.
    "per_token_latency_s": "vllm:request_time_per_output_token_seconds",
    "decode_s": "vllm:request_decode_time_seconds",
    "prefill_s": "vllm:request_prefill_time_seconds",
    "request_generation_tokens": "vllm:request_generation_tokens",
    "queue_s": "vllm:request_queue_time_seconds",
}


def delta(before: Snapshot, after: Snapshot) -> ServerFigures:
    """What the server counted between two snapshots."""
    spec = after.has(DRAFTS) or after.has(DRAFT_TOKENS)
    per_pos_after = after.by_label(ACCEPTED_PER_POS, "position")
    per_pos_before = before.by_label(ACCEPTED_PER_POS, "position")
    positions = sorted(per_pos_after, key=int)
    hists: dict[str, HistogramFigures] = {}
    for key, name in HISTOGRAMS.items():
        h = after.histogram(name).minus(before.histogram(name))
        hists[key] = HistogramFigures(count=h.count, mean=h.mean, p50=h.quantile(0.5), p99=h.quantile(0.99))
    drafts = after.total(DRAFTS) - before.total(DRAFTS)
    draft_tokens = after.total(DRAFT_TOKENS) - before.total(DRAFT_TOKENS)
    accepted = after.total(ACCEPTED) - before.total(ACCEPTED)
    accepted_per_position = [per_pos_after[p] - per_pos_before.get(p, 0.0) for p in positions]
    return ServerFigures(
        interval_s=after.taken_at - before.taken_at,
        generation_tokens=after.total(GEN_TOKENS) - before.total(GEN_TOKENS),
        prompt_tokens=after.total(PROMPT_TOKENS) - before.total(PROMPT_TOKENS),
        requests_finished=after.total(REQUEST_SUCCESS) - before.total(REQUEST_SUCCESS),
        spec_enabled=spec, drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted,
        acceptance_rate=accepted / draft_tokens if draft_tokens > 0 else None,
        mean_accepted_length=1 + accepted / drafts if drafts > 0 else None,
        # vLLM counts a draft per request and step that proposed at least one token, so steps a
        # schedule gives K=0 (or a plugin leaves empty) are not in it, as they are not in acceptance.
        effective_k=draft_tokens / drafts if drafts > 0 else None,
        per_position_acceptance=[n / drafts for n in accepted_per_position] if drafts > 0 else [],
        histograms=hists,
    )
