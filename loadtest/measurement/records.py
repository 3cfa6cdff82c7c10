"""What is measured of one request: the record a client (the Locust user, `loadtest.traffic.client`)
fills in and every statistic, service target and report reads. See `loadtest.traffic.client` for
how each field is measured."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

UNSENT = "unsent"
"""The error of a record the generator wrote for a request it never sent (open loop)."""
SENT_OUTCOMES = ("served", "refused", "timed_out", "failed")
"""How a request that was sent ends."""
OUTCOMES = (*SENT_OUTCOMES, UNSENT)
"""Every request ends as exactly one of these (`RequestRecord.outcome`)."""


@dataclass
class RequestRecord:
    item_id: str
    path: str
    start: float
    """Wall-clock time the request was sent (epoch seconds), to place it in the measured interval."""
    ok: bool = False
    error: str | None = None
    status: int | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int | None = None
    """Completion tokens from the server's final usage (None when the stream gave none)."""
    prompt_tokens: int | None = None
    tokens_seen: int = 0
    """Completion tokens seen so far in per-chunk usage: what a failed stream still made the server generate."""
    expected_tokens: int | None = None
    chunk_gaps_s: list[float] = field(default_factory=list)
    tokens_per_chunk: list[int] = field(default_factory=list)
    per_token_latency_s: float | None = None
    send_lag_s: float | None = None
    """How late the request left. Closed loop: its user's previous response ended this long before
    (None for a user's first request). Open loop: the actual send minus `planned_start`, its
    scheduled arrival (a generator that keeps up sends within milliseconds)."""
    user: int | None = None
    """Which Locust user sent it: 0, 1, ... over the whole run (workers included); open loop: None."""
    planned_start: float | None = None
    """When the request was meant to leave (epoch seconds). Closed loop: set for a user's first
    request only, from the ramp (users start one arrival gap apart, so user n's is n gaps after
    user 0's). Open loop: every request's scheduled arrival (`loadtest.traffic.arrivals`)."""
    arrival: int | None = None
    """Open loop: the request's place in the arrival schedule (0, 1, ... over the whole run)."""
    spec_decode: dict[str, Any] | None = None
    """The server's own per-request acceptance (`metrics.speculative_decoding`), when it sends it."""
    output_token_ids: list[int] = field(default_factory=list)
    """The generated tokens, when the server returns them (vLLM's `return_token_ids`)."""
    content: dict[str, Any] | None = None
    """`loadtest.measurement.content.figures` of the output (None: the server returned no tokens)."""

    @property
    def end(self) -> float:
        return self.start + (self.e2e_s or 0.0)

    @property
    def tokens_per_s(self) -> float | None:
        """Output tokens over the request's end-to-end time (None without one): the speed its user saw."""
        return (self.output_tokens or 0) / self.e2e_s if self.e2e_s else None

    @property
    def outcome(self) -> str:
        """How the request ended, one of `OUTCOMES`: served; refused (an HTTP error status such
        as 429 or 503, or no connection: the server turned it away); timed_out; unsent (the
        generator never sent it before the run ended); failed (anything else: a broken stream)."""
        error = self.error or ""
        if self.ok:
            return "served"
        if error.startswith(UNSENT):
            return "unsent"
        if error.startswith("timeout"):
            return "timed_out"
        if (self.status is not None and self.status != 200) or (
                self.status is None and error.startswith("ConnectionError")
                and ("refused" in error.lower() or "NewConnectionError" in error)):
            return "refused"
        return "failed"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> RequestRecord:
        known = RequestRecord.__dataclass_fields__
        return RequestRecord(**{k: v for k, v in data.items() if k in known})


def load_records(folder: Path) -> list[RequestRecord]:
    """Every request record a run's clients wrote in `folder` (`records-*.jsonl`, one per process)."""
    records = []
    for path in sorted(folder.glob("records-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(RequestRecord.from_json(json.loads(line)))
            except ValueError:
                continue  # a line cut short by a killed process
    return records
