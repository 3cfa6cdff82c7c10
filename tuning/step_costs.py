"""What one engine step costs, measured on the deployment's own engine.

Speculation pays when a step makes more tokens than it costs in plain decode steps. The costs
come from the engine, never from an HTTP client: for each variant below, vLLM's engine is built
from the config with exactly the engine arguments and environment `make serve` gives the
server (same dtype, same CPU layout: the worker bound to its core), B identical prompts are
submitted at once so they decode in lockstep, and the step time is the extra wall time of a
longer generation over its extra engine steps (prefill and start-up cancel out):

    step = (t(M2 tokens) - t(M1 tokens)) / (steps(M2) - steps(M1))

where the steps are the engine's own count of its iterations (`vllm:iteration_tokens_total`).

All three variants run with vLLM's async scheduling off. vLLM turns it on for plain decoding
and its native draft model (the scheduler of step n+1 then overlaps the forward pass of step
n) but not for custom proposers, so with it on the verify variant would pay for scheduling the
others hide, and the ratios would measure scheduling, not the forward passes.

  plain    speculation off: one target decode step
  verify   `drafter: probe` with K: every step verifies K + 1 tokens and keeps one (the cost of
           verification alone; see plugins/probe.py)
  draft    the config's own drafter with K: verification plus K draft steps

so that, at batch B:
  verify ratio = verify / plain               (about 1 where decode is bandwidth-bound)
  draft step   = propose / K / plain          (one draft step in target steps)
  step cost r  = draft / plain                (a speculative step in target steps: speculation
                                               pays when a step makes more than r tokens)

`propose` is timed inside the draft variant's worker (its drafter's `propose`, K draft forward
passes, wrapped through `collective_rpc`): a draft step is a fraction of a millisecond, below
what the difference of two engines' step times can resolve on a shared machine.

Engines of different variants run one after another, and on a shared machine one engine can be
faster than the next; each figure is the median of `repeats` measurements. Figures compared with
each other to choose (K for each batch size, `make tune`) come from one engine instead: a `k_sweep`
job builds the speculative engine with a schedule of K (vLLM's per-batch-size path, as a tuned
server's) and caps the K it drafts between measurements (`_set_k`), K=0..K in a rotating order each
round, so the K's differ by what K costs, not by which engine happened to be faster. `make paymap`
times whole generations on its engines instead of steps (`_paymap_cells`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from tqdm import tqdm

from deploy import load_config, plan_from_config
from deploy.config import Override, as_overrides
from deploy.engine_args import engine_arguments, is_secret
from loadtest.measurement import content
from loadtest.measurement.figures import ContentSummary
from loadtest.measurement.serial import Serial
from loadtest.traffic.workloads import load_workload

VARIANTS = ("plain", "verify", "draft")
LENGTHS = (8, 72)
"""M1 and M2: output tokens of the short and the long generation."""


@dataclass
class PaymapRun(Serial):
    """One timed closed-loop generation of a pay-map engine (`_paymap_cells`)."""

    seconds: float = 0.0
    steps: float = 0.0
    tokens_per_s: float = 0.0
    drafts: float = 0.0
    per_position: list[float] = field(default_factory=list)


@dataclass
class BatchFigures(Serial):
    """What one engine measured at one batch size: its step (`_engine_main`, the median of the
    repeats), or for `make paymap` its timed generations (`_paymap_cells`)."""

    step_ms: float | None = None
    step_ms_runs: list[float] | None = None
    tokens_per_step: float | None = None
    propose_ms: float | None = None
    """The drafter's `propose` call, timed in the worker (the timed variant only)."""
    propose_calls: int | None = None
    runs: list[PaymapRun] | None = None
    """Pay map, an engine without speculation: its generations."""
    cells: dict[str, list[PaymapRun]] | None = None
    """Pay map, the speculative engine: its generations per cell (`a<acceptance>-k<K>`, `k0`)."""


@dataclass
class AcceptanceFigures(Serial):
    """Generations at one temperature (`_acceptance`): per-position acceptance and the outputs'
    content; a greedy set judged for its content has `content` alone."""

    drafts: float | None = None
    per_position: list[float] | None = None
    """Share of the drafts whose position i was accepted."""
    acceptance_rate: float | None = None
    content: ContentSummary | None = None


@dataclass
class CostRatios(Serial):
    """A batch size's step costs in plain target steps (`ratios`; module doc)."""

    verify_ratio: float = 0.0
    draft_step: float = 0.0
    step_cost: float = 0.0


@dataclass
class StepCosts(Serial):
    """Step costs measured on the engine (`measure_steps`, `measure_costs`): engine_costs.json, costs.json.
    An engine's subprocess returns one with `batches` and `acceptance` alone."""

    config: str = ""
    repeats: int = 0
    lengths: list[int] = field(default_factory=list)
    batches: dict[str, dict[str, BatchFigures]] = field(default_factory=dict)
    """By batch size, then by variant (or `k<K>` for a K sweep)."""
    measured_at: str = ""
    layout: dict[str, Any] | None = None
    """The engines' device and environment (secrets left out)."""
    acceptance: dict[str, AcceptanceFigures] | None = None
    """By temperature (`0.7`), and `greedy_<set>` for a greedy set's content."""
    drafter: str | None = None
    k: int | None = None
    ratios: dict[str, CostRatios] | None = None


@dataclass
class AcceptanceJob(Serial):
    """What the engine generates to measure acceptance and content (`measure_steps`' `acceptance`)."""

    prompts: list[str] = field(default_factory=list)
    temperatures: list[float] = field(default_factory=list)
    max_tokens: int = 0
    conversations: list[Any] | None = None
    """Chat prompts, through the model's chat template (`chat_template`)."""
    chat_template: str | None = None
    fixed_length: bool = True
    """Ignore the end of text (a natural-length workload does not)."""
    embedded: bool = False
    """Judge the content against the embedded pair's reference."""
    greedy_sets: dict[str, list[str]] | None = None
    """Further prompt sets judged greedy for their content only."""


@dataclass
class PaymapJob(Serial):
    """A pay-map engine's grid (`measure_steps`' `paymap`)."""

    acceptance: list[float] = field(default_factory=list)
    ks: list[int] = field(default_factory=list)
    max_tokens: int = 0
    temperature: float = 0.0
    speculative: bool = False


@dataclass
class EngineJob(Serial):
    """One engine's measurements, sent to its subprocess (`_run_engine`, `_engine_main`)."""

    variant: str
    args: dict[str, Any]
    """The server's engine arguments."""
    batches: list[int]
    repeats: int
    prompt: str
    lengths: list[int]
    time_drafter: bool = False
    acceptance: AcceptanceJob | None = None
    k_sweep: int | None = None
    """Measure at each K from 0 to this."""
    paymap: PaymapJob | None = None


def _rotated(items: list[Any], round_: int) -> list[Any]:
    """`items` rotated by `round_`: each leads a round in turn."""
    return items[round_ % len(items):] + items[:round_ % len(items)]


def variant_overrides(k: int) -> dict[str, tuple[list[Override], bool]]:
    """Config overrides (and no-speculation) that turn the config into each variant."""
    return {
        "plain": ([], True),
        "verify": ([Override("speculation.drafter", "probe"), Override("speculation.model", None),
                    Override("speculation.implementation", "native"), Override("speculation.draft_sampling", "greedy"),
                    Override("speculation.num_speculative_tokens", k)], False),
        "draft": ([Override("speculation.num_speculative_tokens", k)], False),
    }


def measure_costs(config: str = "default", k: int | None = None, batches: tuple[int, ...] = (1, 32),
                  repeats: int = 5, overrides: Sequence[Override | str] = (),
                  free_running: AcceptanceJob | dict[str, Any] | None = None) -> StepCosts:
    """Step times of the three variants (module doc) at each batch size, and their ratios;
    `overrides` (`Override`s, or their `field=value` texts) apply to the config before each
    variant's own. `free_running` (an `AcceptanceJob`, or its JSON): the draft variant's engine
    also generates those prompts, and the result gets their acceptance and content (`acceptance`)."""
    overrides = as_overrides(overrides)
    base = load_config(config, overrides)
    if not base.speculation.enabled:
        raise ValueError(f"config {config} has no drafter; step costs compare a drafter with plain decoding")
    k = k or base.speculation.num_speculative_tokens
    result = measure_steps(config, variant_overrides(k), batches, repeats, overrides, timed="draft",
                           acceptance=("draft", free_running) if free_running else None)
    result.drafter, result.k = base.speculation.drafter, k
    result.ratios = ratios(result)
    return result


def measure_steps(config: str, variants: dict[str, tuple[Sequence[Override | str], bool]],
                  batches: tuple[int, ...], repeats: int, overrides: Sequence[Override | str] = (),
                  timed: str | None = None, acceptance: tuple[str, AcceptanceJob | dict[str, Any]] | None = None,
                  k_sweep_variant: str | None = None, k_sweep: int = 0,
                  paymap: PaymapJob | dict[str, Any] | None = None) -> StepCosts:
    """Step time and tokens per step of each variant (name -> its overrides and no-speculation)
    at each batch size, one engine per variant in turn. `timed`: the variant whose drafter's
    `propose` is timed; `acceptance`: (variant, `AcceptanceJob` or its JSON) whose engine also
    generates those prompts at each temperature and reports per-position acceptance;
    `k_sweep_variant`: a speculative variant with a schedule whose engine is measured at each K
    from 0 to `k_sweep` (module doc), reported as `k0` .. `k<k_sweep>`. `paymap` (a `PaymapJob`
    or its JSON): instead of step times, each engine times whole closed-loop generations, the
    speculative one at every synthetic acceptance and K (`_paymap_cells`)."""
    result = StepCosts(config=config, repeats=repeats, lengths=list(LENGTHS), batches={str(b): {} for b in batches},
                       measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    prompt = next(item.prompt for item in load_workload("code").items if item.prompt)
    for variant in tqdm(variants, desc="step costs (an engine each)", unit="engine"):
        extra, no_spec = variants[variant]
        resolved, plan = plan_from_config(config, [*overrides, *extra], no_spec)
        job = EngineJob(variant, engine_arguments(resolved), list(batches), repeats, prompt, list(LENGTHS),
                        time_drafter=variant == timed, k_sweep=k_sweep if variant == k_sweep_variant else None,
                        acceptance=AcceptanceJob.from_json(acceptance[1]) if acceptance and acceptance[0] == variant
                        else None,
                        paymap=replace(PaymapJob.from_json(paymap), speculative=not no_spec) if paymap else None)
        result.layout = result.layout or {"device": plan.device,
                                          "env": {n: v for n, v in plan.env.items() if not is_secret(n)}}
        run = _run_engine(job, plan.env)
        if run.acceptance is not None:
            result.acceptance = run.acceptance
        for batch, values in run.batches.items():
            result.batches[batch].update(values)
    return result


def _run_engine(job: EngineJob, env: dict[str, str]) -> StepCosts:
    """One engine in a subprocess (vLLM spawns its own processes and wants a guarded main)."""
    with tempfile.TemporaryDirectory() as tmp:
        spec, out = Path(tmp) / "job.json", Path(tmp) / "result.json"
        spec.write_text(json.dumps(job.to_json()))
        # Insecure serialization lets collective_rpc send _time_drafter and _set_worker_k (functions) to the worker.
        proc = subprocess.run([sys.executable, "-m", "tuning.step_costs", str(spec), str(out)],
                              env={**os.environ, **env, "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"},
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
            raise RuntimeError("the step-cost engine failed:\n" + "\n".join(tail))
        return StepCosts.from_json(json.loads(out.read_text()))


def _time_drafter(worker: Any) -> bool:
    """In the worker: record the wall time of every `drafter.propose` call (False: no drafter)."""
    runner = worker.model_runner
    drafter = getattr(runner, "drafter", None)
    if drafter is None:
        return False
    original, drafter.propose_seconds = drafter.propose, []

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            drafter.propose_seconds.append(time.perf_counter() - started)

    drafter.propose = timed
    return True


def _drain_drafter_times(worker: Any) -> list[float]:
    times = getattr(worker.model_runner.drafter, "propose_seconds", [])
    drained = list(times)
    times.clear()
    return drained


def _set_worker_k(worker: Any, k: int) -> bool:
    """In the worker: from the next step on, draft at most K tokens (False: no drafter).

    A plugin drafter reads K from its copy of the schedule's lookup: set it. vLLM's own drafters
    draft the K the scheduler asks for (`num_speculative_tokens`, from its lookup): cap that
    argument, which is what the scheduler's lookup would do. The scheduler lives in the engine
    core process, out of reach of a multiprocess engine's client; the cap keeps the served
    process layout (an in-process engine core runs the CPU worker on both cores)."""
    drafter = getattr(worker.model_runner, "drafter", None)
    if drafter is None:
        return False
    for holder in (drafter, getattr(drafter, "drafter", None)):
        lookup = getattr(holder, "k_by_batch", None)
        if lookup is not None:
            lookup[:] = [k] * len(lookup)
            return True
    original = getattr(drafter, "_specdeploy_propose", None) or drafter.propose
    drafter._specdeploy_propose = original

    def propose(*args: Any, **kwargs: Any) -> Any:
        if "num_speculative_tokens" in kwargs:  # draft_model, EAGLE, MTP, suffix, medusa
            kwargs["num_speculative_tokens"] = min(k, kwargs["num_speculative_tokens"])
        else:  # ngram: K is the first argument
            args = (min(k, args[0]), *args[1:])
        return original(*args, **kwargs)

    drafter.propose = propose
    return True


def _set_k(llm: Any, k: int) -> None:
    """From the next step on, the engine drafts K tokens at every batch size."""
    if not all(llm.collective_rpc(_set_worker_k, args=(k,))):
        raise RuntimeError("a K sweep needs a speculative engine")
    # The engine core's copy (plugins/k0_handoff.py): K=0 steps skip the draft hand-off, as a tuned server's do.
    try:
        llm.llm_engine.engine_core.call_utility("specdeploy_cap_k", k)
    except Exception as exc:
        raise RuntimeError(f"the engine core has no specdeploy_cap_k ({exc}): specdeploy's vLLM general plugin "
                           "plugins.k0_handoff is not installed; run `pip install -e .` (make venv)") from exc


def llm_arguments(server_args: dict[str, Any]) -> dict[str, Any]:
    """The `vllm.LLM` arguments of a step-cost engine: the server's engine arguments (those of
    vLLM's EngineArgs; host, port, middleware and the like are the API server's), async scheduling
    off (module doc), the engine's counters on."""
    from vllm.engine.arg_utils import EngineArgs

    known = {f.name for f in dataclasses.fields(EngineArgs)}
    return {**{n: v for n, v in server_args.items() if n in known}, "async_scheduling": False,
            "disable_log_stats": False}


def _engine_main(job_path: str, out_path: str) -> None:
    """In the subprocess: build the engine from the server's arguments and time generations."""
    from vllm import LLM, SamplingParams

    job = EngineJob.from_json(json.loads(Path(job_path).read_text()))
    llm = LLM(**llm_arguments(job.args))
    timing_drafter = job.time_drafter and all(llm.collective_rpc(_time_drafter))

    def iterations() -> float:
        return sum(m.count for m in llm.get_metrics() if m.name == "vllm:iteration_tokens_total")

    def generate(batch: int, tokens: int, temperature: float = 0.0) -> tuple[float, float]:
        """(seconds, engine steps) of one generation of `tokens` tokens for `batch` identical prompts."""
        params = SamplingParams(max_tokens=tokens, temperature=temperature, ignore_eos=True)
        before, started = iterations(), time.perf_counter()
        llm.generate([job.prompt] * batch, params, use_tqdm=False)
        return time.perf_counter() - started, iterations() - before

    if job.paymap:
        cells = _paymap_cells(llm, job, generate)
        Path(out_path).write_text(json.dumps(StepCosts(batches={b: {job.variant: f} for b, f in cells.items()}).to_json()))
        return

    short, long = job.lengths

    def step(batch: int) -> tuple[float, float]:
        """(ms, tokens) per engine step: the long generation's extra time over its extra steps."""
        (t1, s1), (t2, s2) = generate(batch, short), generate(batch, long)
        return 1000 * (t2 - t1) / (s2 - s1), (long - short) / (s2 - s1)

    def figures(runs: list[tuple[float, float]]) -> BatchFigures:
        return BatchFigures(step_ms=statistics.median(r[0] for r in runs), step_ms_runs=[round(r[0], 3) for r in runs],
                            tokens_per_step=statistics.median(r[1] for r in runs))

    result = StepCosts()
    ks = list(range(job.k_sweep + 1)) if job.k_sweep is not None else []
    for batch in job.batches:
        generate(batch, 4)  # warm-up: the first steps at a new batch size are slower
        if ks:
            runs: dict[int, list[tuple[float, float]]] = {k: [] for k in ks}
            for round_ in range(job.repeats):
                for k in _rotated(ks, round_):
                    _set_k(llm, k)
                    generate(batch, 2)  # the first step after a switch verifies the old K's drafts
                    runs[k].append(step(batch))
            result.batches[str(batch)] = {f"k{k}": figures(runs[k]) for k in ks}
            continue
        if timing_drafter:
            llm.collective_rpc(_drain_drafter_times)
        measured = figures([step(batch) for _ in range(job.repeats)])
        if timing_drafter:
            times = llm.collective_rpc(_drain_drafter_times)[0]
            measured.propose_ms, measured.propose_calls = 1000 * statistics.median(times), len(times)
        result.batches[str(batch)] = {job.variant: measured}
    if ks:
        _set_k(llm, ks[-1])  # acceptance is measured at the largest K: its positions cover every shorter K
    if job.acceptance:
        result.acceptance = _acceptance(llm, job.acceptance)
    Path(out_path).write_text(json.dumps(result.to_json()))


def _set_worker_acceptance(worker: Any, conditional: list[float]) -> bool:
    """In the worker: from the next step on, accept draft position i with conditional rate
    `conditional[i]` (False: the engine does not run synthetic acceptance). The rejection sampler
    passes its rate tensor to the kernels at every step, so writing into it is enough."""
    import torch

    rates = getattr(getattr(worker.model_runner, "rejection_sampler", None), "synthetic_conditional_rates", None)
    if rates is None:
        return False
    values = list(conditional[:rates.shape[0]]) + [0.0] * max(0, rates.shape[0] - len(conditional))
    rates.copy_(torch.tensor(values, dtype=rates.dtype, device=rates.device))
    return True


def _paymap_cells(llm: Any, job: EngineJob, timed_generation: Any) -> dict[str, BatchFigures]:
    """In the subprocess, for `make paymap`: per batch size, `repeats` timed closed-loop generations
    (B identical prompts at once, `max_tokens` each, EOS ignored); the speculative engine's at every
    (per-token acceptance a, K) of the grid in an order that rotates each round, each with the
    engine's own per-position acceptance, and K=0 once a round where several K are asked.
    `timed_generation`: `_engine_main`'s `generate`."""
    spec = job.paymap
    max_tokens = int(spec.max_tokens)
    generate = partial(timed_generation, temperature=float(spec.temperature))

    def run(batch: int) -> PaymapRun:
        before = _spec_counters(llm)
        seconds, steps = generate(batch, max_tokens)
        drafts, per_position = _accepted_since(llm, before)
        return PaymapRun(seconds, steps, batch * max_tokens / seconds, drafts, per_position)

    cells: list[tuple[float | None, int]] = []
    if spec.speculative:
        ks = sorted(set(spec.ks))
        cells = [(a, k) for a in spec.acceptance for k in ks] + ([(None, 0)] if len(ks) > 1 else [])
        if not all(llm.collective_rpc(_set_worker_acceptance, args=([spec.acceptance[0]] * max(ks),))):
            raise RuntimeError("the speculative engine runs no synthetic acceptance "
                               "(speculation.extra.rejection_sample_method: synthetic)")
    result: dict[str, BatchFigures] = {}
    for batch in job.batches:
        generate(batch, 4)  # warm-up: the first steps at a new batch size are slower
        if not cells:
            result[str(batch)] = BatchFigures(runs=[run(batch) for _ in range(job.repeats)])
            continue
        runs: dict[str, list[PaymapRun]] = {}
        for round_ in range(job.repeats):
            for a, k in _rotated(cells, round_):
                _set_k(llm, k)
                if a is not None:
                    llm.collective_rpc(_set_worker_acceptance, args=([a] * max(ks),))
                generate(batch, 2)  # the first step after a switch verifies the old cell's drafts
                runs.setdefault("k0" if a is None else f"a{a:g}-k{k}", []).append(run(batch))
        result[str(batch)] = BatchFigures(cells=runs)
    return result


def _spec_counters(llm: Any) -> tuple[float, list[float]]:
    """(drafts, accepted tokens per draft position) from the engine's own counters."""
    drafts, per_position = 0.0, []
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode_num_drafts"):
            drafts += m.value
        elif m.name.startswith("vllm:spec_decode_num_accepted_tokens_per_pos") and hasattr(m, "values"):
            per_position = [a + b for a, b in zip(per_position, m.values)] if per_position else list(m.values)
    return drafts, per_position


def _accepted_since(llm: Any, before: tuple[float, list[float]]) -> tuple[float, list[float]]:
    """(drafts, share of them whose position i was accepted) since the counters `before`."""
    (drafts0, accepted0), (drafts1, accepted1) = before, _spec_counters(llm)
    drafts = drafts1 - drafts0
    previous = accepted0 or [0.0] * len(accepted1)
    return drafts, [(a - b) / drafts if drafts else 0.0 for a, b in zip(accepted1, previous)]


def _content(outputs: list[Any], embedded: bool) -> ContentSummary | None:
    """Whether the outputs are text or loops (loadtest.measurement.content)."""
    figs = [content.figures(list(o.outputs[0].token_ids), text=o.outputs[0].text, prompt_text=o.prompt)
            for o in outputs]
    return content.summarize(figs, content.reference_for(figs, embedded))


def _acceptance(llm: Any, spec: AcceptanceJob) -> dict[str, AcceptanceFigures]:
    """Per temperature: the share of drafts whose position i was accepted (so a draft of K' <= K
    tokens makes 1 + sum of the first K' shares tokens a step), on the user's prompts."""
    from vllm import SamplingParams

    out = {}
    for temperature in spec.temperatures:
        before = _spec_counters(llm)
        # A natural-length workload ends at the model's end of text: past it, drafts predict unusually well.
        params = SamplingParams(max_tokens=spec.max_tokens, temperature=temperature, ignore_eos=spec.fixed_length,
                                seed=0)
        outputs = llm.generate(spec.prompts, params, use_tqdm=False) if spec.prompts else []
        if spec.conversations:  # chat prompts go through the model's chat template, as the chat API does
            outputs += llm.chat(spec.conversations, params, use_tqdm=False, chat_template=spec.chat_template)
        drafts, per_position = _accepted_since(llm, before)
        out[f"{temperature:g}"] = AcceptanceFigures(
            drafts, per_position, sum(per_position) / len(per_position) if per_position else None,
            _content(outputs, spec.embedded))
    # Further prompt sets judged greedy for their content only (the embedded pair's loop goal).
    for name, prompts in (spec.greedy_sets or {}).items():
        params = SamplingParams(max_tokens=spec.max_tokens, temperature=0.0, ignore_eos=True)
        out[f"greedy_{name}"] = AcceptanceFigures(content=_content(llm.generate(prompts, params, use_tqdm=False),
                                                                   spec.embedded))
    return out


def ratios(result: StepCosts | dict[str, Any]) -> dict[str, CostRatios]:
    """Per batch size: verify ratio, draft step (in target steps) and step cost r."""
    result = StepCosts.from_json(result)
    out = {}
    for batch, v in result.batches.items():
        plain, verify, draft = (v[name] for name in VARIANTS)
        propose = draft.step_ms - verify.step_ms if draft.propose_ms is None else draft.propose_ms
        out[batch] = CostRatios(verify.step_ms / plain.step_ms, propose / result.k / plain.step_ms,
                                draft.step_ms / plain.step_ms)
    return out


def describe(result: StepCosts | dict[str, Any]) -> str:
    """The costs as a table a person reads (`result`: a stored engine_costs.json's content too)."""
    result = StepCosts.from_json(result)
    lines = [f"engine step costs of {result.config} ({result.drafter}, K={result.k}; median of "
             f"{result.repeats}), measured {result.measured_at}:",
             f"{'batch':>5}  {'plain ms':>9}  {'verify ms':>9}  {'draft ms':>9}  {'verify/plain':>12}  "
             f"{'draft step':>10}  {'step cost r':>11}"]
    for batch, v in result.batches.items():
        r = result.ratios[batch]
        plain, verify, draft = (v[name].step_ms for name in VARIANTS)
        lines.append(f"{batch:>5}  {plain:>9.2f}  {verify:>9.2f}  {draft:>9.2f}  {r.verify_ratio:>11.2f}x  "
                     f"{r.draft_step:>10.1%}  {r.step_cost:>11.2f}")
    lines.append("draft step: one draft forward pass in target steps; step cost r: a speculative step in "
                 "target steps (speculation pays where a step makes more than r tokens)")
    return "\n".join(lines)


if __name__ == "__main__":
    _engine_main(*sys.argv[1:3])
