"""Locust user for vLLM's OpenAI-compatible API: closed or open loop, streaming, per-token metrics.

Closed loop (the default): each user sends one streaming request, waits for it to finish, and
sends the next (users = concurrency).
Open loop (`--rate R --requests N`): requests arrive by a Poisson process at R requests/s
(`loadtest.traffic.arrivals`, the same schedule as vLLM's benchmark with `--request-rate R --seed S`),
whether or not earlier ones finished; nothing caps the requests in flight, so a server slower than
the arrivals builds a queue. One dispatcher per Locust process spawns a greenlet per request at its
scheduled time and never waits for a response; distributed, worker w takes the arrivals whose
index % workers == w. Request i sends the workload's i-th prompt of the single-process order, so
every run with the same seed sends the same prompts at the same offsets. The run quits when all N
requests ended; a request still unsent when the run is stopped is written as `unsent`.

Besides the usual request row ("POST /v1/completions": end-to-end
latency, output tokens as the size), every request adds rows to Locust's own statistics:
  TTFT   time to first token
  TPOT   per-token latency: time after the first token / tokens after it (size: those tokens)
  CHUNK  each gap between streamed chunks (size: the tokens that chunk carried; with
         speculation a chunk carries several tokens, so a gap is not a per-token latency)
Failures (HTTP errors, timeouts, streams that end early) count on the POST row.
The load generator watches itself: each record keeps how late its request left (the time
between the user's previous response ending and this request going out; a closed loop should
send at once), and a greenlet measures how late gevent's loop wakes it (a blocked or starved
client), written to `loop-lag-<pid>.json` beside the records.

Standalone: locust -f loadtest/traffic/locustfile.py -H http://127.0.0.1:8000 --model embedded-default
`python -m loadtest run` drives it headless (also distributed: a master and N workers).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import gevent
import requests
from locust import User, constant, events, task
from locust.exception import StopUser
from requests.adapters import HTTPAdapter
from locust.runners import WORKER_REPORT_INTERVAL, MasterRunner, WorkerRunner
from locust.stats import CSV_STATS_INTERVAL_SEC

from loadtest.measurement import content
from loadtest.traffic.arrivals import poisson_arrivals, replayed
from loadtest.measurement.records import UNSENT, RequestRecord
from loadtest.traffic.client import auth_headers, stream_request
from loadtest.traffic.request_settings import RequestSettings
from loadtest.traffic.workloads import CHAT_PATH, COMPLETIONS_PATH, Item, load_workload, request_for, share, uses_chat

_request_counter = itertools.count()
_user_counter = itertools.count()
_firsts_sent = 0
"""Users of this process whose first request has gone out (closed loop)."""
_later_sent = 0
"""Requests of this process after their user's first."""
_workload = functools.lru_cache(maxsize=None)(load_workload)  # read a user's file once per process
_records_file = None
_users_done = 0
_dispatching = False  # open loop: this process's dispatcher has started
_loop_lags: list[float] = []
_stalls: list[tuple[float, float]] = []  # (lag, of which runnable but off the CPU), seconds
LOOP_PROBE_S = 0.01
STALL_S = 0.05


@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    parser.add_argument("--model", default="embedded-default", help="served model name")
    RequestSettings.add_cli_args(parser)
    parser.add_argument("--requests", type=int, default=0,
                        help="requests the users send in all, each taking the next while any are left "
                             "(as vLLM's benchmark does); quit when all are done (0: run until --run-time)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="open loop: requests arrive by a Poisson process at this many a second, whether or not "
                             "earlier ones finished (needs --requests); 0: closed loop, each user waits for its response")
    parser.add_argument("--seed", type=int, default=0,
                        help="open loop: seed of the arrival times (as vLLM's benchmark's --seed)")
    parser.add_argument("--repeat-head", type=int, default=0,
                        help="open loop: the last N arrivals repeat the first N's gaps and prompts (a soak's "
                             "windows then offer the same load); 0: none")
    parser.add_argument("--worker-count", type=int, default=0,
                        help="Locust workers sharing --requests (each sends its share); 0: one local process")
    parser.add_argument("--records-dir", default="", help="write one JSON line per request to a file in this folder")
    parser.add_argument("--api-key-env", default="", help="environment variable holding the API key, if any")
    parser.add_argument("--start-delay", type=float, default=1.0,
                        help="seconds from the test's start to user 0's first request, so Locust's own start-up "
                             "work does not delay reading the first streams")
    parser.add_argument("--start-at", type=float, default=0.0,
                        help="wall-clock time (epoch seconds) of user 0's first request; set at the test's start "
                             "by the master or the local runner, not by hand")


@events.init.add_listener
def _on_init(environment: Any, **_: Any) -> None:
    if isinstance(environment.runner, MasterRunner):
        # Workers report each user that finished its requests; quit when all have.
        environment.runner.register_message("user_done", lambda msg, **kw: _user_finished(environment))
    else:
        # The content check's noise test reads its word list once per process (about a second):
        # here, before any request, not inside the first response while other users' streams wait.
        content.reference_vocabulary()


@events.test_start.add_listener
def _on_test_start(environment: Any, **_: Any) -> None:
    # One clock for all processes: the master fixes user 0's start as it starts the test, and
    # Locust forwards custom options to the workers with its spawn messages. Each worker timing
    # its own users from when its spawn message arrived put users closer than the gap asked on
    # busy cores. (Workers on other hosts rely on synchronised clocks, as NTP gives.)
    if not isinstance(environment.runner, WorkerRunner):
        opts = environment.parsed_options
        opts.start_at = time.time() + opts.start_delay
    if not isinstance(environment.runner, MasterRunner):
        gevent.spawn(_probe_loop)


def _runqueue_wait_s() -> float | None:
    """Time this process's main thread has spent runnable but waiting for a CPU (Linux)."""
    try:
        with open("/proc/self/schedstat", encoding="ascii") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def _probe_loop() -> None:
    """Sleep LOOP_PROBE_S at a time and keep how much later than asked the loop woke us: the
    time some other greenlet held the process, or the OS kept it off the CPU. For each stall
    the kernel's run-queue wait tells which: on a shared machine it was the OS."""
    while True:
        asked, waited = time.perf_counter(), _runqueue_wait_s()
        gevent.sleep(LOOP_PROBE_S)
        lag = time.perf_counter() - asked - LOOP_PROBE_S
        _loop_lags.append(lag)
        if lag > STALL_S and waited is not None:
            _stalls.append((lag, (_runqueue_wait_s() or waited) - waited))


@events.quitting.add_listener
def _save_loop_lags(environment: Any, **_: Any) -> None:
    folder = environment.parsed_options.records_dir
    if folder and _loop_lags and not isinstance(environment.runner, MasterRunner):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"loop-lag-{os.getpid()}.json").write_text(
            json.dumps({"probe_s": LOOP_PROBE_S, "lags_s": [round(x, 5) for x in _loop_lags],
                        "stalls_s": [[round(lag, 5), round(wait, 5)] for lag, wait in _stalls]}))


@events.user_error.add_listener
def _stop_on_user_error(user_instance: Any, exception: Exception, tb: Any, **_: Any) -> None:
    """stream_request never raises, so an exception here is a broken run (an unreadable workload,
    a bug): a closed loop that lost a user would wait out its deadline for requests nobody sends.
    Quit at once with exit code 3; the runner fails the level with Locust's error line."""
    environment = getattr(user_instance, "environment", None) or user_instance.user.environment
    logging.getLogger("locust").error("a user crashed, stopping the run: %s: %s", type(exception).__name__, exception)
    environment.process_exit_code = 3
    gevent.spawn(environment.runner.quit)


def _user_finished(environment: Any) -> None:
    global _users_done
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        runner.send_message("user_done")
        return
    _users_done += 1
    opts = environment.parsed_options
    if _users_done >= opts.num_users:
        # Quit from a greenlet of its own, after Locust's CSV writer (every CSV_STATS_INTERVAL_SEC)
        # and, distributed, the workers' last stats reports (every WORKER_REPORT_INTERVAL) caught up.
        # A run that writes neither CSV nor HTML report (a warm-up) has nothing to wait for.
        settle = CSV_STATS_INTERVAL_SEC + (WORKER_REPORT_INTERVAL if isinstance(runner, MasterRunner) else 0) + 0.5
        gevent.spawn_later(settle if opts.csv_prefix or opts.html_file else 0, runner.quit)


def _write_record(environment: Any, record: RequestRecord) -> None:
    global _records_file
    folder = environment.parsed_options.records_dir
    if not folder:
        return
    if _records_file is None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        _records_file = open(Path(folder) / f"records-{os.getpid()}.jsonl", "a", encoding="utf-8")
    _records_file.write(json.dumps(record.to_json()) + "\n")
    _records_file.flush()  # the runner counts lines for its progress bar, and keeps them if we die


class LLMUser(User):
    wait_time = constant(0)  # closed loop: the next request goes out when the previous one ends

    def on_start(self) -> None:
        opts = self.environment.parsed_options
        self.request = RequestSettings.from_cli_args(opts)
        self.workload = _workload(self.request.workload)
        self.session = requests.Session()
        self.headers = auth_headers(opts.api_key_env)
        self.last_end: float | None = None
        self.worker = getattr(self.environment.runner, "worker_index", 0)  # its Locust worker (0: one process)
        # The one place the kind of load decides: an open loop dispatches its schedule, a closed loop takes turns.
        if opts.rate > 0:
            self.step = self._dispatch
            if opts.requests <= 0:
                raise ValueError("--rate (open loop) needs --requests N")
            # Open loop: any number of requests in flight share this session; without a pool that
            # large, urllib3 would open and close a connection for each beyond its default 10.
            adapter = HTTPAdapter(pool_connections=1, pool_maxsize=max(16, opts.requests), pool_block=False)
            self.session.mount("http://", adapter)
            self.session.mount("https://", adapter)
            return
        self.step = self._take_turn
        # Distributed, worker w's n-th user is user n x workers + w of the whole run.
        self.index = next(_user_counter) * max(1, opts.worker_count) + self.worker
        start_at = opts.start_at or time.time() + opts.start_delay
        self.planned_start: float | None = start_at + self.index * self.request.arrival_gap_s
        gevent.sleep(max(0.0, self.planned_start - time.time()))

    @task
    def generate(self) -> None:
        self.step()

    def _take_turn(self) -> None:
        """Closed loop: this user's next request, sent the moment its previous one ended."""
        opts = self.environment.parsed_options
        if opts.requests and not self._may_send(opts):
            # The budget is shared, so no user waits on its own quota while others are idle:
            # the run ends when the last request does, as a closed loop over N requests should.
            _user_finished(self.environment)
            raise StopUser()
        item = self.workload.item_for(next(_request_counter), self.worker)
        lag = time.perf_counter() - self.last_end if self.last_end is not None else None
        record = self._send(item)
        self.last_end = time.perf_counter()  # reporting the record below counts as the next request's lag
        record.send_lag_s = lag
        record.user, record.planned_start, self.planned_start = self.index, self.planned_start, None
        self._keep(record)

    def _send(self, item: Item) -> RequestRecord:
        """One streaming request for `item`, measured."""
        rs = self.request
        path, body = request_for(item, self.environment.parsed_options.model, rs.max_tokens, rs.temperature,
                                 rs.fixed_length, rs.api)
        return stream_request(self.session, self.host.rstrip("/"), path, body, item.id, rs.request_timeout_s,
                              rs.max_tokens if rs.fixed_length else None, self.headers)

    def _may_send(self, opts: Any) -> bool:
        """Whether this user's next request fits the budget. Every user's first request is kept
        room for (while the budget allows that many), whatever the users before it finished
        meanwhile: the batch reaches its size however fast a machine answers the first requests."""
        global _firsts_sent, _later_sent
        # This process's part of --requests. Locust hands the master's options to every worker, so
        # a worker takes its share by its index rather than from an option of its own.
        budget = share(opts.requests, opts.worker_count, self.worker) if opts.worker_count > 0 else opts.requests
        if self.planned_start is not None:  # its first request
            if _firsts_sent >= budget:
                return False
            _firsts_sent += 1
            return True
        users_here = self.environment.runner.target_user_count  # this process's users, set before they spawn
        waiting = max(0, min(users_here, budget) - _firsts_sent)  # first requests still to come
        if _firsts_sent + _later_sent + waiting >= budget:
            return False
        _later_sent += 1
        return True

    # ------------------------------------------------------------------ open loop
    def _dispatch(self) -> None:
        """Send this process's arrivals at their scheduled times, each in a greenlet of its own,
        wait for all of them to end, then report this process done. One dispatcher per process:
        any other user of it just stops."""
        global _dispatching
        if _dispatching:
            _user_finished(self.environment)
            raise StopUser()
        _dispatching = True
        opts = self.environment.parsed_options
        workers = max(1, opts.worker_count)
        mine = self.worker if opts.worker_count > 0 else 0
        start_at = opts.start_at or time.time() + opts.start_delay
        offsets = poisson_arrivals(opts.requests, opts.rate, opts.seed, opts.repeat_head)
        schedule = [(i, start_at + offset) for i, offset in enumerate(offsets) if i % workers == mine]
        flights: list[gevent.Greenlet] = []
        try:
            for index, planned in schedule:
                wait = planned - time.time()
                if wait > 0:
                    gevent.sleep(wait)
                flights.append(gevent.spawn(self._one_arrival, index, planned))
            gevent.joinall(flights)
        except gevent.GreenletExit:
            # The run was stopped (deadline, Ctrl-C): the requests in flight end as timed out, the
            # arrivals not sent yet are written as unsent: no request of the schedule goes missing.
            gevent.killall(flights)
            for index, planned in schedule[len(flights):]:
                self._keep(RequestRecord(item_id=self._item(index).id, path="", start=planned,
                                         error=f"{UNSENT}: the run ended before its arrival time",
                                         planned_start=planned, arrival=index))
            raise
        _user_finished(self.environment)
        raise StopUser()

    def _item(self, index: int) -> Item:
        """The prompt of arrival `index`: the workload's in turn; a repeated tail repeats the head's."""
        opts = self.environment.parsed_options
        return self.workload.item_for(replayed(index, opts.requests, opts.repeat_head))

    def _one_arrival(self, index: int, planned: float) -> None:
        # The i-th arrival sends the i-th prompt of the single-process order, on every worker:
        # vLLM's benchmark gets the same prompts in the same order (`Workload.sequence(n)`).
        item = self._item(index)
        sent = time.time()
        try:
            record = self._send(item)
        except gevent.GreenletExit:
            # Stopped mid-stream: the response never came within the run.
            path = CHAT_PATH if uses_chat(item, self.request.api) else COMPLETIONS_PATH  # type: ignore[arg-type]
            record = RequestRecord(item_id=item.id, path=path, start=sent, e2e_s=time.time() - sent,
                                   error="timeout: the run ended before the response did")
            record.planned_start, record.arrival, record.send_lag_s = planned, index, sent - planned
            self._keep(record)
            raise
        record.planned_start, record.arrival, record.send_lag_s = planned, index, record.start - planned
        self._keep(record)

    def _keep(self, rec: RequestRecord) -> None:
        """Write the record, and add its rows to Locust's own statistics."""
        _write_record(self.environment, rec)
        fire = self.environment.events.request.fire
        fire(request_type="POST", name=rec.path, response_time=(rec.e2e_s or 0) * 1000,
             response_length=rec.output_tokens or 0, exception=None if rec.ok else RuntimeError(rec.error),
             context={"item": rec.item_id})
        if not rec.ok:
            return
        if rec.ttft_s is not None:
            fire(request_type="TTFT", name=rec.path, response_time=rec.ttft_s * 1000, response_length=0,
                 exception=None, context={})
        if rec.per_token_latency_s is not None:
            fire(request_type="TPOT", name=rec.path, response_time=rec.per_token_latency_s * 1000,
                 response_length=(rec.output_tokens or 0) - rec.tokens_per_chunk[0], exception=None, context={})
        for gap, tokens in zip(rec.chunk_gaps_s, rec.tokens_per_chunk[1:]):
            fire(request_type="CHUNK", name=rec.path, response_time=gap * 1000, response_length=tokens,
                 exception=None, context={})

