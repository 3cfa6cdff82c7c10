"""The pieces behind honest batch-size figures (issue 7): the widened target computes what the
trained one does, step costs turn into the right ratios and goals, Locust's figures are checked
against vLLM's benchmark, and repeated runs give intervals and a verdict.
"""

from __future__ import annotations

import json

import pytest
import torch

from deploy import plan_from_config
from models.cpu_dtype import native_bf16
from models.embedded_pair import GOALS, check_goals, free_running_goal, goal_lines, greedy_goals
from deploy.engine_args import engine_arguments
from models.widen import widen_llama
from loadtest.measurement import second_opinion
from loadtest.traffic import vllm_bench
from loadtest.measurement.derive import summarize_speedups
from loadtest.measurement.figures import (Agreement, BenchFigures, ClientFigures, Distribution, HistogramFigures,
                                          ServerFigures)
from loadtest.measurement.results import Closed, LevelResult, SweepResults, VariantResult
from loadtest.reports.sweep_summary import headline
from loadtest.traffic.request_settings import RequestSettings
from loadtest.measurement.stats import mean_interval
from loadtest.traffic.workloads import load_workload
from tuning import step_costs


def _tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # non-trivial norms, so that tiling them is really exercised
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("copies,kv_copies", [(3, 1), (6, 2), (4, 4)])
def test_widened_model_computes_the_same_logits(copies: int, kv_copies: int) -> None:
    model = _tiny_llama()
    wide = widen_llama(model, copies, kv_copies)
    cfg = wide.config
    assert (cfg.hidden_size, cfg.intermediate_size) == (64 * copies, 96 * copies)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (2 * copies, 2 * kv_copies)
    assert not cfg.tie_word_embeddings
    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        narrow_logits, wide_logits = model(input_ids=ids).logits, wide(input_ids=ids).logits
    assert torch.allclose(narrow_logits, wide_logits, atol=1e-4, rtol=1e-4)
    assert sum(p.numel() for p in wide.parameters()) > copies * sum(p.numel() for p in model.parameters())


def test_widening_refuses_what_it_cannot_preserve() -> None:
    with pytest.raises(ValueError, match="multiple of kv_copies"):
        widen_llama(_tiny_llama(), 3, 2)


def _costs(plain: float, verify: float, draft: float, propose: float | None, k: int = 4) -> dict:
    figures = {"plain": {"step_ms": plain}, "verify": {"step_ms": verify}, "draft": {"step_ms": draft}}
    if propose is not None:
        figures["draft"]["propose_ms"] = propose
    return {"k": k, "batches": {"1": figures}}


def test_step_cost_ratios() -> None:
    (r,) = step_costs.ratios(_costs(10.0, 11.0, 13.0, 2.0)).values()
    assert (r.verify_ratio, r.draft_step, r.step_cost) == pytest.approx((1.1, 0.05, 1.3))
    # Without a timed drafter the draft cost falls back to the difference of the two engines.
    (fallback,) = step_costs.ratios(_costs(10.0, 11.0, 13.0, None)).values()
    assert fallback.draft_step == pytest.approx(0.05)


def test_cost_variants_are_built_from_the_served_config(embedded_pair) -> None:
    overrides = step_costs.variant_overrides(4)
    args = {}
    for name, (extra, no_spec) in overrides.items():
        resolved, _ = plan_from_config("embedded-code", extra, no_spec)
        args[name] = engine_arguments(resolved)
    assert "speculative_config" not in args["plain"]
    assert args["verify"]["speculative_config"] == {"method": "custom_class", "num_speculative_tokens": 4,
                                                   "model": "plugins.probe.RejectedDraftProposer"}
    assert args["draft"]["speculative_config"]["method"] == "draft_model"
    # Everything else is what `make serve` gives the server: same model, dtype, lengths.
    for name in ("verify", "draft"):
        assert {k: v for k, v in args[name].items()
                if k not in ("speculative_config", "per_request_spec_decode_metrics")} == args["plain"]
    # The embedded configs say `auto`: bf16 where this CPU computes it, float32 elsewhere.
    assert args["plain"]["dtype"] == ("bfloat16" if native_bf16() else "float32")


def test_goals_are_checked_against_measured_costs(embedded_pair) -> None:
    good = {"k": 4, "ratios": {"1": {"verify_ratio": 1.05, "draft_step": 0.05},
                               "32": {"verify_ratio": 3.9, "draft_step": 0.01}}}
    lines = dict(check_goals(embedded_pair, good))
    assert sum(1 for met in lines.values() if met) >= 3 and len(lines) == 10
    assert sum(1 for line, met in lines.items() if met is None and "greedy on" in line) == 2
    # Free-running: acceptance in range, from text, not from a loop.
    text = {"checked": 8, "degenerate": 0, "distinct_4": 0.95, "vs_reference": 1.06,
            "reference": {"distinct_4": 0.89, "source": "the embedded pair's held-out code"}}
    free = {**good, "acceptance": {"1": {"acceptance_rate": 0.6, "content": text}}}
    assert free_running_goal(free)[1] is True and free_running_goal(good)[1] is None
    looping = {**text, "degenerate": 8, "distinct_4": 0.05, "vs_reference": 0.06}
    for run in ({"acceptance_rate": 0.95, "content": text}, {"acceptance_rate": 0.6, "content": looping}):
        line, met = free_running_goal({**good, "acceptance": {"1": run}})
        assert met is False and "goal 50%-85%" in line
    bad = {"k": 4, "ratios": {"1": {"verify_ratio": GOALS["verify_batch_1"] + 0.1, "draft_step": 0.5},
                              "32": {"verify_ratio": 1.2, "draft_step": 0.1}}}
    failed = [line for line, met in check_goals(embedded_pair, bad) if met is False]
    assert len(failed) >= 3 and any("batch 32" in line for line in failed)
    # A missed cost goal says what it does to the verdicts measured here.
    printed = "\n".join(goal_lines(embedded_pair, bad))
    assert "batch-32 speedups are optimistic" in printed and "every speedup here is pessimistic" in printed
    # Greedy loops and T=1 noise are goals of their own.
    noisy = {**text, "noise": 3, "noise_checked": 8}
    line, met = free_running_goal({**good, "acceptance": {"1": {"acceptance_rate": 0.6, "content": noisy}}})
    assert met is False and "3 of 8 noise" in line
    loops = {"checked": 8, "degenerate": 3, "degenerate_share": 0.375}
    greedy = dict(greedy_goals({**good, "acceptance": {"0": {"content": loops},
                                                       "greedy_code": {"content": {**loops, "degenerate": 1,
                                                                                   "degenerate_share": 0.125}}}}))
    assert list(greedy.values()) == [False, True]
    assert all(met is None for line, met in check_goals(embedded_pair, None) if "verifying" in line)


def _figures(tps: float, ttft_p50: float, per_token_p50: float, bench: bool = False) -> ClientFigures | BenchFigures:
    """A client's (or the benchmark's) throughput and p50 latencies, all that the comparison reads."""
    cls = BenchFigures if bench else ClientFigures
    return cls(output_tokens_per_s=tps, ttft_ms=Distribution(p50=ttft_p50),
               per_token_latency_ms=Distribution(p50=per_token_p50))


def test_bench_summary_and_agreement() -> None:
    raw = {"completed": 3, "failed": 1, "duration": 2.0, "total_output_tokens": 300, "output_throughput": 150.0,
           "errors": ["", "", "", "boom"], "ttfts": [0.02, 0.03, 0.04, 0.0], "output_lens": [100, 100, 100, 0],
           "latencies": [1.01, 1.02, 1.03, 0.0]}
    bench = vllm_bench.summarize(raw)
    assert bench.ttft_ms.p50 == pytest.approx(30.0)
    assert bench.per_token_latency_ms.p50 == pytest.approx(10.0)  # (1.02 - 0.03) / 99
    client = _figures(147.0, 36.0, 10.5)
    agreement = second_opinion.compare(client, bench)
    assert agreement.output_tokens_per_s.agrees and agreement.per_token_p50_ms.agrees
    assert agreement.ttft_p50_ms.agrees is False and agreement.ttft_p50_ms.difference == pytest.approx(0.2)
    assert agreement.agrees is False
    # Saved without per-request data, the benchmark's own aggregates are used.
    aggregates = {"completed": 3, "median_ttft_ms": 30.0, "mean_ttft_ms": 31.0, "median_tpot_ms": 10.0,
                  "output_throughput": 150.0}
    fallback = vllm_bench.summarize(aggregates)
    assert fallback.ttft_ms.p50 == 30.0 and fallback.per_token_latency_ms.p50 == 10.0
    assert second_opinion.compare(client, fallback).ttft_p50_ms.difference == pytest.approx(0.2)


def _window(e2e_s: float, ttft_s: float, per_token_s: float) -> ServerFigures:
    """The engine's histogram means over one client's window."""
    return ServerFigures(histograms={"e2e_s": HistogramFigures(mean=e2e_s), "ttft_s": HistogramFigures(mean=ttft_s),
                                     "per_token_latency_s": HistogramFigures(mean=per_token_s)})


def test_agreement_takes_the_engines_own_drift_out() -> None:
    # The server itself was 10% slower while the benchmark ran: its figures are 10% worse.
    client, bench = _figures(100.0, 30.0, 10.0), _figures(100.0 / 1.1, 33.0, 11.0, bench=True)
    raw = second_opinion.compare(client, bench)
    assert raw.agrees is False and raw.output_tokens_per_s.difference == pytest.approx(0.1)
    assert raw.output_tokens_per_s.engine_drift is None and raw.output_tokens_per_s.difference_adjusted is None
    steady, slower = _window(1.0, 0.020, 0.008), _window(1.1, 0.022, 0.0088)
    a = second_opinion.compare(client, bench, steady, slower)
    assert a.agrees is True
    for figure in a.figures().values():
        assert figure.engine_drift == pytest.approx(0.1)
        assert figure.difference_adjusted == pytest.approx(0.0, abs=1e-9)
        assert figure.difference != pytest.approx(0.0, abs=0.05)  # the raw figure is kept
    assert len(a.figures()) == 3
    # Drift does not excuse a client that is off: the engine was steady, the benchmark 10% faster.
    off = second_opinion.compare(client, _figures(110.0, 30.0, 10.0, bench=True), steady, steady)
    assert off.output_tokens_per_s.agrees is False and off.agrees is False
    assert off.output_tokens_per_s.difference_adjusted == pytest.approx(100 / 110 - 1)


def test_a_client_that_is_off_in_every_run_is_caught_over_the_repeats() -> None:
    def run(locust_tps: float, bench_tps: float, windows: tuple = (None, None)) -> Agreement:
        return second_opinion.compare(_figures(locust_tps, 30.0, 10.0), _figures(bench_tps, 30.0, 10.0, bench=True),
                                  *windows)

    # Drift of either sign from run to run averages out...
    noisy = second_opinion.systematic([run(108, 100), run(92, 100), run(101, 100)])
    assert noisy.agrees and noisy.output_tokens_per_s.mean == pytest.approx(0.01 / 3)
    # ...a client 8% slow in every run does not.
    biased = second_opinion.systematic([run(92, 100), run(93, 100), run(91, 100)])
    assert biased.agrees is False and biased.output_tokens_per_s.mean == pytest.approx(-0.08)
    results = SweepResults(variants=[VariantResult(name="baseline", levels=[
        LevelResult(concurrency=32, vllm_bench_agreement=a) for a in (run(92, 100), run(93, 100), run(91, 100))])])
    [entry] = second_opinion.systematic_by_level(results)
    line = second_opinion.describe_systematic(entry)
    assert "batch 32, baseline" in line and "tok/s -8.0%" in line and "3 runs" in line
    assert line.endswith("DISAGREE (tok/s -8.0% beyond 5%)")  # the line names the figure at fault
    assert line in headline(results)
    # With the engine's figures: drift taken out of each run, but a client that slows the
    # server in its own window in every run is caught by the engine's mean drift.
    steady = _window(1.0, 0.03, 0.01)

    def measured(locust_tps: float, bench_tps: float, locust_slower: float) -> Agreement:
        s = 1 + locust_slower
        return run(locust_tps, bench_tps, (_window(1.0 * s, 0.03 * s, 0.01 * s), steady))

    machine = second_opinion.systematic([measured(106, 100, -0.06), measured(107, 100, -0.065), measured(100, 100, 0)])
    assert machine.agrees and abs(machine.output_tokens_per_s.mean) < 0.01  # the benchmark's windows were slow
    loader = second_opinion.systematic([measured(92, 100, 0.087), measured(93, 100, 0.075), measured(91, 100, 0.1)])
    assert loader.output_tokens_per_s.engine_drift_mean < -0.05 and loader.agrees is False
    loader.variant, loader.concurrency = "spec", 1
    said = second_opinion.describe_systematic(loader)
    assert "the engine's tok/s 8.0% slower under Locust than under the benchmark, beyond 5%" in said


def test_benchmark_is_given_the_prompts_locust_sends(tmp_path) -> None:
    workload = load_workload("code")
    n = len(workload.items)
    path = vllm_bench.write_dataset(workload, 2 * n + 3, 0, tmp_path / "d.jsonl")
    prompts = [json.loads(line)["prompt"] for line in path.read_text().splitlines()]
    assert prompts == [workload.items[t % n].prompt for t in range(2 * n + 3)]
    # Two Locust workers split 7 requests 4 + 3, each starting at its own offset.
    two = workload.sequence(7, workers=2)
    assert two == [workload.item_for(t, 0) for t in range(4)] + [workload.item_for(t, 1) for t in range(3)]
    assert "--disable-shuffle" in vllm_bench.bench_args(
        vllm_bench.BenchJob("http://x", "m", "tok", workload, RequestSettings(max_tokens=8), Closed(1), 7, tmp_path), path, tmp_path / "r.json")


def test_mean_interval() -> None:
    one = mean_interval([2.0])
    assert one.mean == 2.0 and one.low is None
    m = mean_interval([1.9, 2.0, 2.1])
    # t(0.975, 2) = 4.303, stdev 0.1, sqrt(3): half width 0.2484
    assert m.low == pytest.approx(2.0 - 0.2484, abs=1e-3) and m.high == pytest.approx(2.0 + 0.2484, abs=1e-3)
    assert m.max_deviation == pytest.approx(0.05)


def _run(c: int, repeat: int, tps: float, name: str = "spec-k4", bench_tps: float | None = None) -> tuple:
    client = ClientFigures(ok=32, output_tokens_per_s=tps, per_token_latency_ms=Distribution(mean=1000 / tps))
    return name, LevelResult(concurrency=c, repeat=repeat, client=client, server=ServerFigures(),
                             vllm_bench=BenchFigures(output_tokens_per_s=bench_tps or tps))


def _results(runs: list[tuple]) -> SweepResults:
    variants: dict[str, VariantResult] = {}
    for name, level in runs:
        variants.setdefault(name, VariantResult(name=name, k=None if name == "baseline" else 4)).levels.append(level)
    return SweepResults(variants=list(variants.values()))


def test_repeats_give_an_interval_and_a_verdict_per_batch_size() -> None:
    runs = []
    for repeat, (s1, s32) in enumerate([(200, 800), (210, 820), (190, 790)], start=1):
        runs += [_run(1, repeat, s1), _run(1, repeat, 100, "baseline"),
                 _run(32, repeat, s32), _run(32, repeat, 1000, "baseline", bench_tps=700)]
    summary = {e.concurrency: e for e in summarize_speedups(_results(runs))}
    assert summary[1].runs == 3 and summary[1].speedup.mean == pytest.approx(2.0)
    assert summary[1].speedup.low < 2.0 < summary[1].speedup.high
    assert summary[1].verdict == "pays"
    assert summary[32].verdict.startswith("does not pay")
    # vLLM's benchmark saw the baseline at 700 tok/s: it says speculation pays, and the verdict says so.
    assert "say the opposite" in summary[32].verdict
    lines = headline(_results(runs))
    assert lines[0].startswith("batch 1, spec-k4: speculation pays: 2.00x") and "95% interval" in lines[0]
    assert lines[1].startswith("batch 32, spec-k4: speculation does not pay")


def test_an_interval_spanning_one_is_called_even() -> None:
    runs = []
    for repeat, tps in enumerate([90, 115, 100], start=1):
        runs += [_run(1, repeat, tps), _run(1, repeat, 100, "baseline")]
    (entry,) = summarize_speedups(_results(runs))
    assert entry.verdict.startswith("breaks even")
