"""One streaming request to vLLM's OpenAI-compatible API, measured chunk by chunk.

With speculative decoding one streamed chunk can carry several tokens, so the gap between
chunks is not an inter-token latency. A `RequestRecord` therefore keeps, separately:
  - ttft_s:               request sent -> first chunk that carries a token
  - chunk_gaps_s:         every gap between token-carrying chunks (what vLLM's benchmark calls ITL)
  - tokens_per_chunk:     tokens each chunk carried (from the per-chunk usage the server sends)
  - per_token_latency_s:  (e2e - ttft) / tokens after the first chunk (vLLM's benchmark: TPOT)
  - output_tokens:        from the server's final `usage`, never from counting chunks
  - output_token_ids:     the tokens themselves (vLLM's `return_token_ids`), and `content`, what
                          the content check (`loadtest.measurement.content`) makes of them
A request is a failure when it errors, times out, or its stream ends early (no usage, no
`[DONE]`, or fewer tokens than a fixed length asked for); failures are kept with their reason.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterable, Iterator
from typing import Any

import requests

from loadtest.measurement import content
from loadtest.measurement.records import RequestRecord

def sse_events(chunks: Iterable[bytes]) -> Iterator[str]:
    """The `data:` payloads of a server-sent-event stream, as the bytes arrive."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        while True:
            # Events end with a blank line; vLLM uses "\n\n" (accept "\r\n\r\n" too).
            cut = min((i for i in (buffer.find(b"\n\n"), buffer.find(b"\r\n\r\n")) if i >= 0), default=-1)
            if cut < 0:
                break
            sep = 4 if buffer[cut:cut + 4] == b"\r\n\r\n" else 2
            event, buffer = buffer[:cut], buffer[cut + sep:]
            data = [line[5:].lstrip() for line in event.decode("utf-8", "replace").splitlines()
                    if line.startswith("data:")]
            if data:
                yield "\n".join(data)
    if buffer.strip():
        # A stream cut mid-event: hand the fragment on, the parser will flag it.
        for line in buffer.decode("utf-8", "replace").splitlines():
            if line.startswith("data:"):
                yield line[5:].lstrip()


def _chunk_text(choice: dict[str, Any]) -> str:
    if "text" in choice:
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or delta.get("reasoning") or "")


def _prompt_text(body: dict[str, Any]) -> str:
    """The request's prompt as text (completions: the prompt; chat: the messages' contents)."""
    if isinstance(body.get("prompt"), str):
        return body["prompt"]
    return "\n".join(str(m.get("content") or "") for m in body.get("messages") or [] if isinstance(m, dict))


class StreamParser:
    """Feeds on the stream's events with their arrival times; `finish()` fills the record."""

    def __init__(self, record: RequestRecord, t0: float, prompt_text: str | None = None):
        self.record = record
        self.t0 = t0
        self.prompt_text = prompt_text
        self.text: list[str] = []  # the output's text, for the content check's noise test
        self.first: float | None = None
        self.last_chunk: float | None = None
        self.done = False
        self.usage: dict[str, Any] | None = None
        self.errors: list[str] = []
        self.prompt_token_ids: list[int] | None = None

    def feed(self, data: str, now: float) -> None:
        rec = self.record
        if data.strip() == "[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(data)
        except ValueError:
            self.errors.append(f"unparsable stream event: {data[:120]!r}")
            return
        if "error" in obj:  # vLLM reports errors inside a started stream as an event
            err = obj["error"]
            self.errors.append(str(err.get("message", err) if isinstance(err, dict) else err)[:300])
            return
        choices = obj.get("choices") or []
        usage = obj.get("usage")
        if not choices:
            # The final usage chunk (choices == []), with per-request metrics when the server has them.
            if usage:
                self.usage = usage
            spec = (obj.get("metrics") or {}).get("speculative_decoding")
            if spec:
                rec.spec_decode = spec
            return
        choice, completion = choices[0], usage.get("completion_tokens") if usage else None
        prompt_ids = choice.get("prompt_token_ids")
        if prompt_ids:
            self.prompt_token_ids = list(prompt_ids)
        rec.output_token_ids += choice.get("token_ids") or []
        text = _chunk_text(choice)
        self.text.append(text)
        # A server without per-chunk usage: a chunk with text carries at least one token.
        new_tokens = int(completion) - rec.tokens_seen if completion is not None else 1 if text else 0
        if new_tokens <= 0:
            return  # role-only or empty chunk: no token, not a "first token"
        rec.tokens_seen += new_tokens
        rec.tokens_per_chunk.append(new_tokens)
        if self.first is None:
            self.first = now
            rec.ttft_s = now - self.t0
        else:
            assert self.last_chunk is not None
            rec.chunk_gaps_s.append(now - self.last_chunk)
        self.last_chunk = now

    def finish(self, now: float, failure: str | None = None) -> RequestRecord:
        rec = self.record
        rec.e2e_s = now - self.t0
        if self.usage:
            rec.output_tokens = int(self.usage.get("completion_tokens") or 0)
            rec.prompt_tokens = self.usage.get("prompt_tokens")
            rec.tokens_seen = max(rec.tokens_seen, rec.output_tokens)
        problems = ([failure] if failure else []) + self.errors
        if not problems:
            if not self.done:
                problems.append("stream ended early: no [DONE]")
            if self.usage is None:
                problems.append("stream ended early: no usage reported")
            elif rec.expected_tokens and (rec.output_tokens or 0) < rec.expected_tokens:
                problems.append(f"stream ended early: {rec.output_tokens} of {rec.expected_tokens} tokens")
        if rec.output_tokens and rec.ttft_s is not None and rec.tokens_per_chunk:
            after_first = rec.output_tokens - rec.tokens_per_chunk[0]
            if after_first > 0:
                rec.per_token_latency_s = (rec.e2e_s - rec.ttft_s) / after_first
        if rec.output_token_ids:
            rec.content = content.figures(rec.output_token_ids, self.prompt_token_ids, "".join(self.text),
                                          self.prompt_text)
        rec.ok = not problems
        rec.error = "; ".join(problems) if problems else None
        return rec


class _DeadlinePassed(Exception):
    pass


def _until(chunks: Iterable[bytes], deadline: float, sock: socket.socket | None) -> Iterator[bytes]:
    """The stream's raw pieces until `deadline` (perf_counter). A read timeout bounds one wait
    for bytes, not the request, so a server trickling SSE comments (`: keep-alive`) or single
    bytes would hold it forever: each piece is checked against the deadline, and each wait for
    the next one is cut to the time left."""
    pieces = iter(chunks)
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            raise _DeadlinePassed
        if sock is not None:
            try:
                sock.settimeout(left)
            except OSError:
                sock = None
        chunk = next(pieces, None)
        if chunk is None:
            return
        yield chunk


def stream_request(session: requests.Session, base_url: str, path: str, body: dict[str, Any], item_id: str,
                   timeout_s: float, expected_tokens: int | None = None,
                   headers: dict[str, str] | None = None) -> RequestRecord:
    """Send one streaming request and measure it; never raises for request problems.
    `timeout_s` bounds the whole request, however the server trickles its bytes."""
    record = RequestRecord(item_id=item_id, path=path, start=time.time(), expected_tokens=expected_tokens)
    t0 = time.perf_counter()
    parser = StreamParser(record, t0, _prompt_text(body))
    deadline = t0 + timeout_s
    try:
        with session.post(base_url + path, json=body, stream=True, timeout=(min(10, timeout_s), timeout_s),
                          headers=headers) as response:
            record.status = response.status_code
            if response.status_code != 200:
                return parser.finish(time.perf_counter(), f"HTTP {response.status_code}: {response.text[:300]}")
            sock = getattr(getattr(response.raw, "_connection", None), "sock", None)
            # chunk_size=None yields each piece as it arrives (no 512-byte buffering).
            for data in sse_events(_until(response.iter_content(chunk_size=None), deadline, sock)):
                parser.feed(data, time.perf_counter())
    except (_DeadlinePassed, requests.RequestException) as exc:
        now = time.perf_counter()
        # requests reports a read timeout mid-stream as a ConnectionError; the clock says which it was.
        if isinstance(exc, (_DeadlinePassed, requests.Timeout)) or now >= deadline - 0.05:
            return parser.finish(now, f"timeout: no complete response within {timeout_s:g} s")
        return parser.finish(now, f"{type(exc).__name__}: {str(exc)[:300]}")
    return parser.finish(time.perf_counter())


def auth_headers(api_key_env: str | None) -> dict[str, str] | None:
    """The Authorization header for a server whose key is in the variable `api_key_env` (None:
    no variable, or it is empty)."""
    key = os.environ.get(api_key_env, "") if api_key_env else ""
    return {"Authorization": f"Bearer {key}"} if key else None
