"""Shared fixtures: real vLLM servers on the embedded pair, each configuration started once a session.

Two tiers (`make test`, `make test-full`):
- Tests of behaviour serve the *plumbing* target (`SPECDEPLOY_PAIR=plumbing`: the trained model
  widened twice instead of 4-8 times; same predictions, a fraction of the cost and start-up).
  They ask the session's `servers` pool for a configuration
  (`servers.get("embedded-code", ["speculation.drafter=none"])`) and get the same running server as
  every other test that asked for it: a configuration starts once, and stays up until the end.
- Tests marked `full` measure costs or speed. They run last, on the cost-faithful pair, after the
  pool has stopped every idle server (fixture `measurement`), so that nothing else competes for
  the 2 cores while they time.

Every engine start of the session (the pool's, the tests' own and those of command-line
subprocesses) is recorded by the launcher in `logs/tests/engine-starts.jsonl`; the session ends
with a count and the start times.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import requests

from deploy import Server, free_port, plan_from_config
from models.embedded_pair import PAIR_ENV
from deploy.launcher import START_LOG_ENV, port_is_free

LANE = os.environ.get("SPECDEPLOY_TEST_LANE", "")
"""`engine`, `own` or `light` where `scripts/run_tests.py` runs the suite in lanes (`lane`); empty: every test."""
SERVING_FIXTURES = {"servers", "running_sweep", "measurement"}
LOG_DIR = Path(os.environ.get("SPECDEPLOY_TEST_LOGS", "logs/tests"))
"""Engine logs and the engine-start log; each lane has its own (`scripts/run_tests.py` sets it)."""
START_LOG = LOG_DIR / "engine-starts.jsonl"
# Small KV caches, so that every configuration's server fits in memory for the whole session.
POOL_KV_GIB = 0.25
CODE_PROMPTS = [
    "def __init__(self, *args, **kwargs):\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "class Error(Exception):\n    \"\"\"",
    "    for i in range(len(",
]

os.environ.setdefault(PAIR_ENV, "plumbing")  # subprocesses (the CLI tests) inherit it
os.environ[START_LOG_ENV] = str(START_LOG.resolve())
# One baseline server (no speculation) for every test that needs one; it wants an API key, so the
# key tests need no second one. The helpers below send the key.
TEST_KEY_ENV, TEST_KEY = "SPECDEPLOY_TEST_KEY", "sk-test-running"
os.environ[TEST_KEY_ENV] = TEST_KEY
BASELINE = ("embedded-code", ("speculation.drafter=none", f"server.api_key_env={TEST_KEY_ENV}"))


def pytest_configure(config: pytest.Config) -> None:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    START_LOG.write_text("")
    # SIGTERM (`timeout`, a CI runner's cancel) ends the session as Ctrl-C does: pytest tears down
    # and `pytest_unconfigure` stops the pool's engines. Killed outright, the engines would outlive
    # it: each leads its own process group, and an engine core outlives its API server.
    signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def pytest_unconfigure(config: pytest.Config) -> None:
    """However the session ended (interrupted before any test asked for `servers` included)."""
    POOL.close()


def _shares_the_pool(item: pytest.Item) -> bool:
    """Whether a test serves from the session's servers (asks for a fixture that does) or measures (`full`)."""
    return item.get_closest_marker("full") is not None or \
        bool(SERVING_FIXTURES & set(getattr(item, "fixturenames", ())))


def serves(item: pytest.Item) -> bool:
    """Whether a test serves a vLLM engine: marked so, or asking for a fixture that does."""
    return _shares_the_pool(item) or any(item.get_closest_marker(m) for m in ("engine", "slow"))


def lane(item: pytest.Item) -> str:
    """The lane a test runs in (`scripts/run_tests.py`): `engine`, the tests that share the session's
    servers or measure (one at a time, beside the pool); `own`, those that start engines of their own;
    `light`, those that start none."""
    return "engine" if _shares_the_pool(item) else "own" if serves(item) else "light"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Measurements last: once they stop the pool's servers, no behaviour test starts them again.
    In a lane (`scripts/run_tests.py`), only the lane's tests."""
    if LANE:
        kept = [item for item in items if lane(item) == LANE]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
    items.sort(key=lambda item: item.get_closest_marker("full") is not None)


@pytest.fixture(autouse=True)
def _no_engine_in_the_light_lane(request: pytest.FixtureRequest) -> Iterator[None]:
    """The light lane runs beside the engine lane, which keeps its engines one at a time (on 2 cores
    each more starves the others): a test there that starts one (itself or through a command) fails,
    and says how to move it."""
    if LANE != "light":
        yield
        return
    before = _engine_starts()
    yield
    if _engine_starts() > before:
        pytest.fail(f"{request.node.nodeid} started a vLLM engine in the light lane: mark it "
                    "`@pytest.mark.engine` so that it runs in an engine lane", pytrace=False)


def _engine_starts() -> int:
    return len(START_LOG.read_text().splitlines()) if START_LOG.is_file() else 0


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """An engine started in the light lane outside any test (a module's fixture) fails the lane too."""
    if LANE == "light" and _engine_starts() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


Key = tuple[str, tuple[str, ...]]
# The configurations the behaviour tests share, in the order they first need them: the pool starts
# them in the background, one at a time, while the tests before them run (the 2 cores both work).
PRESTART: list[Key] = [BASELINE, ("embedded-bigram", ()), ("embedded-code", ()),
                       ("embedded-code", ("speculation.draft_sampling=greedy",)), ("embedded-small-plugin", ())]


class ServerPool:
    def __init__(self) -> None:
        self.alive: dict[Key, Server] = {}
        self.pending: dict[Key, Future[Server]] = {}
        self.starts: list[tuple[str, float]] = []
        self.launched: list[Server] = []
        """Every server launched and not yet stopped, ready or still starting."""
        self._background = ThreadPoolExecutor(1, thread_name_prefix="prestart")
        self._lock = threading.Lock()

    def prestart(self, keys: list[Key]) -> None:
        with self._lock:
            for key in keys:
                if key not in self.alive and key not in self.pending:
                    self.pending[key] = self._background.submit(self._start, key)

    def get(self, config: str = "embedded-code", overrides: list[str] | tuple[str, ...] = ()) -> Server:
        key = (config, tuple(overrides))
        with self._lock:
            future = self.pending.pop(key, None)
        if future is not None:
            self.alive[key] = future.result()  # a failed start raises here, in the test that needs it
        server = self.alive.get(key)
        if server is not None:
            if server.alive():
                return server
            logging.getLogger("specdeploy").warning("test server %s died; starting it again", _name(key))
        self.alive[key] = self._start(key)
        return self.alive[key]

    def _start(self, key: Key) -> Server:
        config, overrides = key
        extra = [] if any(o.startswith("resources.cpu_kvcache_space_gib=") for o in overrides) else \
            [f"resources.cpu_kvcache_space_gib={POOL_KV_GIB}"]
        _, plan = plan_from_config(config, [*overrides, *extra, f"server.port={free_port()}"])
        logging.getLogger("specdeploy").info("starting test server %s", _name(key))
        started = time.monotonic()
        # Launched and awaited apart (as start_server does), so that `close` can stop a server
        # still starting instead of waiting out its start.
        server = Server(plan, LOG_DIR / f"{_name(key)[:120]}.log").start()
        with self._lock:
            self.launched.append(server)
        try:
            server.wait_healthy(progress=False)
        except BaseException:
            server.stop()
            raise
        self.starts.append((_name(key), time.monotonic() - started))
        return server

    def close(self) -> None:
        """Stop every server, those still starting included (their starts then fail)."""
        with self._lock:
            pending, self.pending = list(self.pending.values()), {}
            launched, self.launched = self.launched, []
        self.alive.clear()
        for future in pending:
            future.cancel()
        try:
            for server in launched:
                server.stop()
            for future in pending:  # a start that launched after `launched` was taken
                if not future.cancelled():
                    try:
                        future.result().stop()
                    except Exception:  # noqa: BLE001 - a start that failed left nothing running
                        pass
        finally:  # a second signal cut a stop short: kill the rest at once
            for server in launched:
                if server.process is not None and server.process.returncode is None:
                    server.kill()


def _name(key: Key) -> str:
    config, overrides = key
    return "-".join([config.removesuffix(".yaml"), *[o.replace("=", "_").replace("/", "_") for o in overrides]])


POOL = ServerPool()


@pytest.fixture(scope="session")
def servers() -> Iterator[ServerPool]:
    try:
        yield POOL
    finally:
        POOL.close()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the shared servers early, when the session will run any test that serves."""
    if any("servers" in getattr(item, "fixturenames", ()) and item.get_closest_marker("full") is None
           for item in session.items):
        POOL.prestart(PRESTART)


@pytest.fixture()
def measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests marked `full`: the cost-faithful pair, and no idle server beside the measurement."""
    POOL.close()
    monkeypatch.setenv(PAIR_ENV, "cost")


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """How many engines the session started, and how long each took to answer."""
    lines = [json.loads(line) for line in START_LOG.read_text().splitlines() if line.strip()] \
        if START_LOG.is_file() else []
    if not lines:
        return
    write = terminalreporter.write_line
    terminalreporter.section("engine starts")
    ready = [s["seconds"] for s in lines if s["outcome"] == "ready"]
    write(f"{len(lines)} engine starts ({len(ready)} ready, {len(lines) - len(ready)} failed as some tests intend), "
          f"{sum(s['seconds'] for s in lines):.0f} s in all; the pool started {len(POOL.starts)} "
          f"({sum(t for _, t in POOL.starts):.0f} s)")
    if ready:
        ready.sort()
        write(f"ready after: min {ready[0]:.1f} s, median {ready[len(ready) // 2]:.1f} s, max {ready[-1]:.1f} s")
    for s in lines:
        write(f"  {s['seconds']:6.1f} s  {s['outcome']:<9} {s['name']:<28} {Path(s['log']).name if s['log'] else ''}")


@pytest.fixture(scope="session")
def running_sweep(servers, tmp_path_factory) -> tuple[dict, dict, Path]:
    """One load test of the session's speculative and baseline servers (already running: the sweep
    starts none), as `make loadtest URL=... BASELINE_URL=...` runs it: both APIs (the mixed
    workload), vLLM's benchmark after Locust, service targets, the baseline's API key. Several
    tests read its results, report files and folder."""
    from loadtest.reports.report import write_report
    from loadtest.traffic.request_settings import RequestSettings
    from loadtest.sweeps.settings import SweepSettings
    from loadtest.sweeps.runner import Sweep

    spec, baseline = servers.get("embedded-code"), servers.get(*BASELINE)
    settings = SweepSettings("", url=spec.base_url, baseline_url=baseline.base_url, api_key_env=TEST_KEY_ENV,
                             users=[2], repeat=1, requests=4, slo="ttft_p95=30s,tpot_p50=1ms", warmup=1,
                             request=RequestSettings(workload="mixed", max_tokens=32, request_timeout_s=120),
                             level_timeout_s=600, out=tmp_path_factory.mktemp("running-sweep") / "report")
    results = Sweep(settings).run()
    return results, write_report(results, settings.out), settings.out


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """A tiny model's forward pass on 2 busy cores runs far faster on one thread than on two."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def embedded_pair():
    from models.embedded_pair import ensure_pair

    return ensure_pair()


def auth_headers(server: Server) -> dict[str, str]:
    """The API key a keyed server wants (its plan holds the value), else nothing."""
    key = server.plan.env.get("VLLM_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def complete(server: Server, prompt: str, max_tokens: int = 48, **params) -> dict:
    """One non-streaming completion; returns the choice with token ids."""
    body = {"model": server.plan.served_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, **params}
    response = requests.post(f"{server.base_url}/v1/completions", json=body, headers=auth_headers(server),
                             timeout=300)
    response.raise_for_status()
    return response.json()["choices"][0]


def greedy_token_ids(server: Server, prompts: list[str], max_tokens: int = 64) -> list[list[int]]:
    """Send all prompts at once (so they are batched together) and return each one's tokens."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        return [c["token_ids"] for c in pool.map(lambda p: complete(server, p, max_tokens=max_tokens), prompts)]


def metric_total(server: Server, name: str) -> float:
    """Sum of a Prometheus counter over all its label sets, read from /metrics."""
    from loadtest.measurement.prom import parse_metrics

    samples = parse_metrics(requests.get(f"{server.base_url}/metrics", headers=auth_headers(server),
                                         timeout=30).text)
    return sum(value for _, value in samples.get(name, []))


def port_still_held(port: int, within_s: float = 30) -> list[str]:
    """Who still holds 127.0.0.1:`port` after up to `within_s` seconds ([] once a server could bind it).

    The engine core and its workers inherit the listening socket by fork, and a killed process's
    leader can read as a zombie while its other threads still exit and hold it: after a stop the
    port is waited for, not looked at once."""
    deadline = time.monotonic() + within_s
    while not port_is_free("127.0.0.1", port):
        if time.monotonic() > deadline:
            holders = [f"pid {c.pid} ({c.status})" for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port]
            return holders or ["a socket of no process"]
        time.sleep(0.2)
    return []
