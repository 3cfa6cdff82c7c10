"""Shared fixtures: real vLLM servers on the embedded default, started once per configuration.

A vLLM start takes about a minute on this CPU, so tests never start their own: they ask the
session's `servers` pool for a configuration (`servers.get("default", ["speculation.drafter=none"])`)
and get the same running server as every other test that asked for it. The pool keeps at most
`MAX_ALIVE` servers up (2 cores, 24 GiB) and stops the least recently used one beyond that.
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from deploy import Server, free_port, plan_from_config, start_server

MAX_ALIVE = int(os.environ.get("SPECDEPLOY_TEST_MAX_SERVERS", "2"))
LOG_DIR = Path(os.environ.get("SPECDEPLOY_TEST_LOGS", "logs/tests"))
CODE_PROMPTS = [
    "def __init__(self, *args, **kwargs):\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "class Error(Exception):\n    \"\"\"",
    "    for i in range(len(",
]


class ServerPool:
    def __init__(self) -> None:
        self.alive: collections.OrderedDict[tuple[str, tuple[str, ...]], Server] = collections.OrderedDict()

    def get(self, config: str = "default", overrides: list[str] | tuple[str, ...] = ()) -> Server:
        key = (config, tuple(overrides))
        if key in self.alive:
            self.alive.move_to_end(key)
            server = self.alive[key]
            if server.alive():
                return server
            del self.alive[key]
        while len(self.alive) >= MAX_ALIVE:
            _, oldest = self.alive.popitem(last=False)
            oldest.stop()
        port = free_port()
        _, plan = plan_from_config(config, [*overrides, f"server.port={port}"])
        name = "-".join([config.removesuffix(".yaml"), *[o.replace("=", "_").replace("/", "_") for o in overrides]])
        logging.getLogger("specdeploy").info("starting test server %s", name)
        server = start_server(plan, LOG_DIR / f"{name[:120]}.log", progress=False)
        self.alive[key] = server
        return server

    def close(self) -> None:
        while self.alive:
            self.alive.popitem()[1].stop()


@pytest.fixture(scope="session")
def servers() -> Iterator[ServerPool]:
    pool = ServerPool()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def embedded_pair():
    from deploy.embedded_pair import ensure_pair

    return ensure_pair()


def complete(server: Server, prompt: str, max_tokens: int = 48, **params) -> dict:
    """One non-streaming completion; returns the choice with token ids."""
    body = {"model": server.plan.served_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, **params}
    response = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=300)
    response.raise_for_status()
    return response.json()["choices"][0]


def greedy_token_ids(server: Server, prompts: list[str], max_tokens: int = 64) -> list[list[int]]:
    """Send all prompts at once (so they are batched together) and return each one's tokens."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        return [c["token_ids"] for c in pool.map(lambda p: complete(server, p, max_tokens=max_tokens), prompts)]


def metric_total(server: Server, name: str) -> float:
    """Sum of a Prometheus counter over all its label sets, read from /metrics."""
    from loadtest.prom import parse_metrics

    samples = parse_metrics(requests.get(f"{server.base_url}/metrics", timeout=30).text)
    return sum(value for _, value in samples.get(name, []))
