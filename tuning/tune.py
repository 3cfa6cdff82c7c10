"""`make tune CONFIG=... USERS=1,4,16,32`: K for each batch size, written into a new YAML and proven.

1. Measure on the engine (`step_costs.measure_steps`): the step time at each batch size of plain
   decoding and, in one speculative engine whose K is capped between measurements, of the drafter
   at each K from 0 (what the schedule's "off" really costs: a draft model still runs its forward
   pass) to the config's K; at the largest K, per-position acceptance on the user's workload at each
   temperature the config is tuned for. One engine for every K: on a shared machine separate
   engines differ by as much as one more draft token costs.
2. Choose (`choose`): a draft of K' tokens makes 1 + p_1 + ... + p_K' tokens a step (p_i averaged
   over the temperatures); K(B) is the K that makes most per unit of step time (within `TIE`, the
   shorter draft, which wastes less when acceptance dips).
3. Write `<config>-tuned.yaml` beside the input (`write_tuned`): the input's text with the schedule
   and the measurements that chose it as comments. A plugin drafter also gets
   `draft_max_temperature`, the largest temperature measured: hotter requests, whose acceptance
   was not measured, draft nothing.
4. Prove it (`prove`, unless `--no-prove`): load tests of the tuned config beside every fixed K
   and the baseline (`PROOF_RATIO`).

vLLM picks K from the number of requests it schedules in a step, prefills included (vLLM issue
49548): K can flip at a range boundary while requests arrive. The proof's load tests run the
real server, so a schedule that flips badly shows there as a failed criterion.
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from deploy import ConfigError, load_config, preflight
from deploy.config import Override, as_overrides, resolve_config_path
from deploy.config_text import with_speculation
from loadtest.reports import markdown
from loadtest.files import bullet_sections, write_atomic
from loadtest.measurement.derive import content_warnings, summarize_speedups
from loadtest.measurement.derived import SpeedupSummary
from loadtest.measurement.serial import Serial
from loadtest.reports.report import write_report
from loadtest.traffic.request_settings import RequestSettings, settings_record
from loadtest.sweeps.settings import SCHEDULE_VARIANT, SweepSettings, default_out_dir
from loadtest.sweeps.runner import Sweep
from loadtest.sweeps.plan import duration_text
from loadtest.traffic import declared as traffic
from loadtest.traffic.workloads import as_text, load_workload, uses_chat
from tuning import step_costs
from tuning.advise import PLAIN, SECTIONS, CommandResult, ReportLink, SettingsRecord, drafter_config
from tuning.step_costs import AcceptanceJob, StepCosts

log = logging.getLogger("specdeploy.tune")

PROOF_RATIO = 0.97
"""The tuned config's throughput must reach this share of the baseline's (largest batch) and of
the best fixed K's (every other batch) in the proof."""
TIE = 0.01
"""Ks whose tokens per unit of time are within this share of the best count as a tie."""
TUNED_FIELDS = (("speculation", "num_speculative_tokens"), ("speculation", "schedule"))
SPEC = "spec"
"""The speculative engine's name in `cost_variants`, beside the plain one's (`advise.PLAIN`)."""
ACCEPTANCE_PROMPTS = 32
ACCEPTANCE_TOKENS = 96


@dataclass
class ScheduleRow(Serial):
    """K chosen at one batch size and the speedup predicted with it (what `schedule_from` reads)."""

    batch: int = 0
    k: int = 0
    predicted_speedup: float = 0.0


@dataclass
class KOption(Serial):
    """One K at one batch size: its step time, tokens per step, and tokens per plain-step time (`rate`)."""

    k: int = 0
    step_ms: float = 0.0
    tokens_per_step: float = 0.0
    rate: float = 0.0


@dataclass
class TuneRow(ScheduleRow):
    """A batch size's plain step time and every K's figures, the K chosen from them (`choose`)."""

    plain_step_ms: float = 0.0
    options: list[KOption] = field(default_factory=list)


@dataclass
class ProofCheck(Serial):
    """The tuned config against the baseline (largest batch) or the best fixed K at one temperature and batch size."""

    temperature: float = 0.0
    batch: int = 0
    tuned_speedup: float | None = None
    fixed_speedups: dict[int, float] = field(default_factory=dict)
    """By K: each fixed K's speedup over the baseline."""
    best_fixed_k: int | None = None
    against: str = ""
    ratio: float | None = None
    passed: bool = False
    degenerate_share: float | None = None


@dataclass
class ProofReport(ReportLink):
    temperature: float = 0.0


@dataclass
class Proof(Serial):
    """The proof's checks, its load tests' reports and notes (`prove`)."""

    checks: list[ProofCheck] = field(default_factory=list)
    reports: list[ProofReport] = field(default_factory=list)
    passed: bool = False
    notes: list[str] = field(default_factory=list)


@dataclass
class TuneResult(CommandResult):
    """A tuning as tune.json holds it; `status` `tuned`, `proven`, `not_proven`, `cannot_measure` or `failed`."""

    drafter: str = ""
    k_max: int = 0
    draft_sampling: str = ""
    temperatures: list[float] = field(default_factory=list)
    settings: SettingsRecord = field(default_factory=SettingsRecord)
    costs: StepCosts | None = None
    per_position: list[float] | None = None
    """Acceptance per draft position, the mean over the temperatures."""
    rows: list[TuneRow] | None = None
    schedule: list[list[int]] | None = None
    k: int | None = None
    written_schedule: list[list[int]] | None = None
    draft_max_temperature: float | None = None
    output: str | None = None
    proof: Proof | None = None


@dataclass
class TuneSettings:
    config: str
    overrides: list[Override] = field(default_factory=list)
    """Config fields set for every engine and load test (`--set`; texts given here are parsed)."""
    batches: list[int] = field(default_factory=lambda: [1, 4, 16, 32])
    """Batch sizes (closed-loop users) to choose K for."""
    request: RequestSettings = field(default_factory=lambda: RequestSettings(max_tokens=64))
    """The user's traffic (a built-in set or a JSONL / ShareGPT file), for acceptance and the proof,
    and the proof's output length (its temperatures are `proof_temperatures`)."""
    temperatures: list[float] | None = None
    """Temperatures acceptance is averaged over (default: the config's `speculation.temperatures`)."""
    cost_repeats: int = 3
    prove: bool = True
    proof_temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0])
    requests: int | None = None
    """Measured requests per proof run (default: the load test's, max(32, 8 x batch))."""
    output: Path | None = None
    """The tuned YAML (default: `<config>-tuned.yaml` beside the input)."""
    out: Path | None = None
    """The report folder."""
    traffic_source: str = ""
    """Where `request`'s workload, API and lengths came from (`loadtest.traffic.declared.origin`)."""
    proof_repeats: int = 2
    """Runs of each proof level (each beside its own baseline run); the proof judges their mean.
    One run on a shared machine varies by more than the proof's margin (`PROOF_RATIO`). Two, because
    the variants' order flips from one repeat to the next (`loadtest.sweeps.plan.run_order`): with one
    run the tuned server always goes first."""

    def __post_init__(self) -> None:
        self.overrides = as_overrides(self.overrides)  # data from here on, whoever gave texts

    def proof(self, config: str, overrides: list[Override], k_max: int, out: Path | None = None,
              temperature: float | None = None) -> Sweep:
        """A proof's load test: `config` beside every fixed K up to `k_max` and the baseline."""
        return Sweep(SweepSettings(config, overrides=overrides, extra_k=list(range(1, k_max + 1)), users=self.batches,
                                   repeat=self.proof_repeats, requests=self.requests, request=self.request,
                                   traffic_source=self.traffic_source, vllm_bench=False, out=out),
                     temperature=temperature)


def acceptance_prompts(request: RequestSettings) -> tuple[list[str], list[list[dict[str, str]]]]:
    """The workload's first prompts as the engine takes them: plain text, and chat conversations
    (through the model's chat template), each as its API would send it."""
    items = load_workload(request.workload).items[:ACCEPTANCE_PROMPTS]
    prompts = [item.prompt if item.prompt is not None else as_text(item.messages or ())
               for item in items if not uses_chat(item, request.api)]  # type: ignore[arg-type]
    conversations = [list(item.messages) if item.messages else [{"role": "user", "content": item.prompt or ""}]
                     for item in items if uses_chat(item, request.api)]  # type: ignore[arg-type]
    return prompts, conversations


def would_measure(settings: TuneSettings, k: int) -> list[str]:
    batches = ", ".join(map(str, settings.batches))
    return [f"step times at batch {batches} of plain decoding and of the drafter at K=0..{k} (one engine, K "
            f"switched between measurements)",
            f"per-position acceptance of K={k} drafts on workload '{settings.request.workload}' at each temperature",
            f"a load test per temperature ({', '.join(f'{t:g}' for t in settings.proof_temperatures)}) of the tuned "
            f"config, every fixed K and the baseline at batch {batches}"]


def cost_variants(k: int, max_batch: int) -> dict[str, tuple[list[Override], bool]]:
    """The engines step 1 measures: name -> (config overrides, no speculation). The speculative one
    carries a schedule so that vLLM (or the plugin) takes the per-batch-size path a tuned server takes,
    and no temperature gate, so that acceptance is measured at every temperature asked for."""
    return {PLAIN: ([], True),
            SPEC: ([Override("speculation.num_speculative_tokens", k),
                    Override("speculation.schedule", [[1, max_batch, k]]),
                    Override("speculation.draft_max_temperature", None)], False)}


def choose(costs: StepCosts, per_position: list[float], k_max: int) -> list[TuneRow]:
    """Per batch size: each K's tokens per step, step time and tokens per plain-step time, and the
    K chosen (0: no drafts; a schedule cannot turn the draft model off, so K=0 is the k0 engine)."""
    rows = []
    for batch, engines in sorted(costs.batches.items(), key=lambda item: int(item[0])):
        plain = engines[PLAIN].step_ms
        options = []
        for k in range(0, k_max + 1):
            step, tokens = engines[f"k{k}"].step_ms, 1.0 + sum(per_position[:k])
            options.append(KOption(k, step, tokens, tokens / (step / plain)))
        chosen = best_k({o.k: o.rate for o in options})
        rows.append(TuneRow(int(batch), chosen, options[chosen].rate, plain_step_ms=plain, options=options))
    return rows


def best_k(options: dict[int, float]) -> int:
    """The K that makes most; within `TIE` of it, the shorter draft."""
    top = max(options.values())
    return min(k for k, v in options.items() if v >= top * (1 - TIE))


def schedule_from(rows: list[ScheduleRow], max_batch: int) -> list[list[int]]:
    """Inclusive batch-size ranges with one K each; a boundary sits at the geometric middle of two
    measured batch sizes, the last range runs to the server's largest batch."""
    ranges: list[list[int]] = []
    start = 1
    for i, row in enumerate(rows):
        end = max_batch if i == len(rows) - 1 else max(row.batch, math.isqrt(row.batch * rows[i + 1].batch))
        if ranges and ranges[-1][2] == row.k:
            ranges[-1][1] = end
        else:
            ranges.append([start, end, row.k])
        start = end + 1
    return ranges


def tuned_yaml(source: str, k: int, schedule: list[list[int]] | None, comments: list[str],
               draft_max_temperature: float | None = None) -> str:
    """The input's text (its comments kept) with `num_speculative_tokens: k`, the schedule (or
    none) and the temperature gate (or none) set under `speculation:`, the comments above them."""
    return with_speculation(source, {
        "num_speculative_tokens": str(k),
        "schedule": f"[{', '.join(f'[{a}, {b}, {kk}]' for a, b, kk in schedule)}]" if schedule else None,
        "draft_max_temperature": None if draft_max_temperature is None else f"{draft_max_temperature:g}"},
        comments)


def deployed_k(schedule: list[list[int]]) -> tuple[int, list[list[int]] | None]:
    """K and the schedule to write: one K everywhere needs no schedule (vLLM's dynamic path then
    stays off), and K is the schedule's largest (vLLM sizes its buffers for it)."""
    ks = {k for _, _, k in schedule}
    if len(ks) == 1 and 0 not in ks:
        return ks.pop(), None
    return max(max(ks), 1), schedule


def dry_run(settings: TuneSettings) -> int:
    """Print what `tune` would measure on the machine its config describes; start nothing."""
    try:
        spec = drafter_config(settings.config, settings.overrides, "tune").speculation
        k_max = spec.num_speculative_tokens
        proof = settings.proof(settings.config, list(settings.overrides), k_max).plan(dry_run=True)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    temperatures = settings.temperatures or spec.temperatures
    proofs = settings.proof_temperatures if settings.prove else []
    said = {**settings_record(settings), "temperature": ", ".join(f"{t:g}" for t in proofs) + " (the proof's)"}
    start = proof.start_estimate(proof.servers[-1]).seconds
    per_proof = proof.total_s()
    lines = [f"tune plan (dry run: nothing starts): {settings.config}",
             *[f"  {line}" for line in traffic.describe(said)],
             *[f"  {i}. {step}" for i, step in enumerate(would_measure(settings, k_max)[:2 + bool(proofs)], 1)],
             f"  step times and acceptance (at T={', '.join(f'{t:g}' for t in temperatures)}, the config's "
             f"speculation.temperatures unless --temperature): 2 engines started in turn in this process, about "
             f"{duration_text(start)} each"]
    if proofs:
        lines.append(f"  each proof (one per temperature), as planned for the tuned config (the schedule written "
                     f"then; K={k_max} here):")
        lines += [f"  {line}" for line in proof.describe(dry_run=True).splitlines()[1 + len(proof.traffic):]]
    lines.append(f"  estimated duration: about {duration_text(2 * start + per_proof * len(proofs))} (engine starts, "
                 f"{len(proofs)} proof(s); the step-time measurements themselves not counted)")
    print("\n".join(lines))
    return 0 if proof.servers else 2


def tune(settings: TuneSettings) -> TuneResult:
    """Measure, choose, write the tuned YAML and prove it; the result (also tune.json / tune.md)
    has `status` (`tuned`, `proven`, `not_proven`, `cannot_measure`, `failed`)."""
    path = resolve_config_path(settings.config)
    config = drafter_config(settings.config, settings.overrides, "tune")
    spec = config.speculation
    out = settings.out or default_out_dir(f"tune-{path.stem}")
    output = settings.output or path.with_name(f"{path.stem}-tuned.yaml")
    k_max = spec.num_speculative_tokens
    max_batch = config.resources.max_num_seqs or 256
    temperatures = settings.temperatures or spec.temperatures
    result = TuneResult(settings.config, str(out), settings=SettingsRecord.from_json(settings_record(settings)),
                        drafter=spec.drafter, k_max=k_max, draft_sampling=spec.draft_sampling, temperatures=temperatures)
    resolved = preflight(config, path.parent, plan_only=True)
    if resolved.machine_problems:
        result.status, result.problems = "cannot_measure", resolved.machine_problems
        result.would_measure = would_measure(settings, k_max)
        return result.write("tune", describe(result))

    prompts, conversations = acceptance_prompts(settings.request)
    log.info("tune %s: step times of plain decoding and of K=0..%d at batch %s, acceptance at T=%s",
             settings.config, k_max, settings.batches, temperatures)
    job = AcceptanceJob(prompts, temperatures, ACCEPTANCE_TOKENS, conversations,
                        config.engine_args.get("chat_template"), settings.request.fixed_length)
    result.costs = costs = step_costs.measure_steps(
        settings.config, cost_variants(k_max, max_batch), tuple(settings.batches), settings.cost_repeats,
        tuple(settings.overrides), acceptance=(SPEC, job), k_sweep_variant=SPEC, k_sweep=k_max)
    costs.save(out / "costs.json")  # minutes of engine time: kept whatever happens next
    if not (prompts or conversations) or not costs.acceptance:
        result.status, result.problems = "failed", ["no acceptance measured: the workload has no prompts"]
        return result.write("tune", describe(result))
    rows = write_tuned(result, path, output, max_batch, bool(spec.plugin_class))
    try:
        load_config(output, settings.overrides)
    except ConfigError as exc:  # a bug here, not the user's: say so and keep the file to look at
        result.status, result.problems = "failed", [f"the tuned config {output} does not validate: {exc}"]
        return result.write("tune", describe(result))
    result.status, result.output = "tuned", str(output)
    log.info("tune %s: K=%d, schedule %s written to %s", settings.config, result.k, result.written_schedule, output)
    if settings.prove:
        # Without a schedule the tuned config is one fixed K: the load test names it spec-k<K>.
        tuned_name = SCHEDULE_VARIANT if result.written_schedule else f"spec-k{result.k}"
        top = rows[-1]  # the largest batch: what K=0 costs there says why no schedule may pass
        result.proof = prove(settings, output, k_max, out, tuned_name,
                             k0_cost=top.options[0].step_ms / top.plain_step_ms)
        result.status = "proven" if result.proof.passed else "not_proven"
        result.notes = result.proof.notes
    return result.write("tune", describe(result))


def write_tuned(result: TuneResult, source: Path, output: Path, max_batch: int, plugin: bool) -> list[TuneRow]:
    """Steps 2 and 3: from the measurements in `result` (its `costs`), K for each batch size and the
    schedule (into `result`), and the tuned YAML written to `output`."""
    by_temperature = list((result.costs.acceptance or {}).values())
    result.per_position = [sum(t.per_position[i] for t in by_temperature) / len(by_temperature)
                           for i in range(result.k_max)]
    result.rows = rows = choose(result.costs, result.per_position, result.k_max)
    result.schedule = schedule_from(rows, max_batch)
    result.k, result.written_schedule = deployed_k(result.schedule)
    # A plugin drafts only at the temperatures the tuning measured; hotter requests keep off (plugins.temperature_gate).
    result.draft_max_temperature = max(result.temperatures) if plugin else None
    write_atomic(output, tuned_yaml(source.read_text(), result.k, result.written_schedule, comments(result, rows),
                                    result.draft_max_temperature))
    return rows


def comments(result: TuneResult, rows: list[TuneRow]) -> list[str]:
    """The measurements that chose the schedule, as comment lines above it."""
    temps = ", ".join(f"{t:g}" for t in result.temperatures)
    lines = [f"Tuned by `make tune` on {result.costs.measured_at}: K per running batch size (vLLM's",
             "num_speculative_tokens_per_batch_size). Per-position acceptance of "
             f"K={result.k_max} drafts, mean over T={temps}:",
             "  " + " ".join(f"{p:.0%}" for p in result.per_position),
             "batch  plain ms  " + "  ".join(f"K={o.k} tok/t" for o in rows[0].options) + "  chosen",
             *(f"{row.batch:>5}  {row.plain_step_ms:>8.2f}  " + "  ".join(f"{o.rate:>9.2f}" for o in row.options)
               + f"  K={row.k}" for row in rows),
             "tok/t: tokens per plain-step time (tokens per step / the step's time in plain steps)."]
    if result.draft_max_temperature is not None:
        lines.append(f"Plugin drafter: requests above T={result.draft_max_temperature:g}, where this "
                     "was not measured, get no drafts.")
    if result.settings.overrides:
        lines.append("Measured with --set " + " ".join(result.settings.overrides) + " (not written here).")
    return lines


def prove(settings: TuneSettings, tuned: Path, k_max: int, out: Path, tuned_name: str = SCHEDULE_VARIANT,
          k0_cost: float | None = None) -> Proof:
    """Load tests of the tuned config beside every fixed K and the baseline, one per temperature.
    `k0_cost`: the measured K=0 step time in plain steps at the largest batch, for the notes."""
    proof, warnings = Proof(), []
    largest = max(settings.batches)
    # The tuned file carries K and the schedule; an override of either would undo the tuning.
    overrides = [o for o in settings.overrides if o.path not in TUNED_FIELDS]
    for temperature in settings.proof_temperatures:
        sweep_out = out / f"proof-T{temperature:g}"
        results = settings.proof(str(tuned), overrides, k_max, sweep_out, temperature).run()
        write_report(results, sweep_out)
        proof.reports.append(ProofReport(f"{sweep_out.name}/report.md", results.status, results.problems,
                                         temperature=temperature))
        entries = summarize_speedups(results)
        speedups = {(e.variant, e.concurrency): e.speedup.mean for e in entries}
        tuned_entries = {e.concurrency: e for e in entries if e.variant == tuned_name}
        warnings += [f"T={temperature:g}, {w}" for e in tuned_entries.values() for w in content_warnings(e)]
        for batch in settings.batches:
            proof.checks.append(check(temperature, batch, largest, speedups.get((tuned_name, batch)),
                                      {k: speedups.get((f"spec-k{k}", batch)) for k in range(1, k_max + 1)},
                                      tuned_entries.get(batch)))
    proof.passed = bool(proof.checks) and all(c.passed for c in proof.checks)
    proof.notes = warnings + out_of_reach(proof.checks, largest, k0_cost)
    return proof


def check(temperature: float, batch: int, largest: int, tuned_x: float | None, fixed: dict[int, float | None],
          tuned: SpeedupSummary | None) -> ProofCheck:
    """The tuned config at one batch size against the baseline (the largest batch) or the best fixed K."""
    fixed = {k: v for k, v in fixed.items() if v is not None}
    best_k = max(fixed, key=fixed.get) if fixed else None
    if batch == largest:
        against, reference = "baseline", 1.0
    else:
        against, reference = (f"K={best_k}", fixed[best_k]) if best_k else ("best fixed K", None)
    ratio = tuned_x / reference if tuned_x is not None and reference else None
    return ProofCheck(temperature, batch, tuned_x, fixed, best_k, against, ratio,
                      ratio is not None and ratio >= PROOF_RATIO,
                      tuned.content.degenerate_share if tuned and tuned.content else None)


def out_of_reach(checks: list[ProofCheck], largest: int, k0_cost: float | None = None) -> list[str]:
    """Why a proof cannot pass whatever the schedule: at the largest batch, no K of this drafter (the
    tuned schedule included) reached the plain server. `k0_cost`: this run's K=0 step in plain steps there."""
    notes = []
    for c in checks:
        speeds = [v for v in (c.tuned_speedup, *c.fixed_speedups.values()) if v is not None]
        if c.batch == largest and not c.passed and speeds and max(speeds) < PROOF_RATIO:
            notes.append(
                f"T={c.temperature:g}, batch {largest}: no K of this drafter reached {PROOF_RATIO}x the plain "
                f"server (the best made {max(speeds):.2f}x), so no schedule can. In vLLM 0.32 a speculative server "
                "pays for speculation even where its schedule says K=0: a draft model still runs its forward pass "
                "(to keep its KV cache in step), and with no draft at all (a plugin drafter's K=0) the speculative "
                "step's own work remains"
                + (f": here a K=0 step took {k0_cost:.2f} plain steps at batch {largest}" if k0_cost else "")
                + ". Serve this load without speculation (a separate plain server for high-batch traffic).")
    return notes


def describe(result: TuneResult) -> str:
    """The tuning as a person reads it (also tune.md)."""
    lines = [f"# Tuning: {result.config} ({result.drafter}, K up to {result.k_max}, draft sampling "
             f"{result.draft_sampling})", "", f"**Status: {result.status}**", ""]
    if result.schedule and result.rows:
        chosen = ", ".join(f"batch {a}-{b}: K={k}" for a, b, k in result.schedule)
        written = (f"`schedule: {result.written_schedule}`, `num_speculative_tokens: {result.k}`"
                   if result.written_schedule else
                   f"`num_speculative_tokens: {result.k}` and no schedule (one K everywhere)")
        lines += [f"Chosen: {chosen}. Written to `{result.output}`: {written}.", "",
                  "Per-position acceptance (mean over T=" + ", ".join(f"{t:g}" for t in result.temperatures) + "): "
                  + " ".join(f"{p:.1%}" for p in result.per_position or []), ""]
        for t, a in ((result.costs.acceptance if result.costs else None) or {}).items():
            lines.append(f"- T={t}: " + " ".join(f"{p:.1%}" for p in a.per_position) + f" ({a.drafts:.0f} drafts)")
        options = result.rows[0].options
        lines += ["", "Engine step time (ms) and tokens per plain-step time for each K; K=0 is the speculative "
                  "engine told to draft nothing:", "",
                  markdown.table(["batch", "plain ms", *(f"K={o.k} ms" for o in options),
                                  *(f"K={o.k} tok/t" for o in options), "K chosen", "predicted"],
                                 [[row.batch, f"{row.plain_step_ms:.2f}", *(f"{o.step_ms:.2f}" for o in row.options),
                                   *(f"{o.rate:.2f}" for o in row.options), row.k, f"{row.predicted_speedup:.2f}x"]
                                  for row in result.rows], align="r" * (2 * len(options) + 4))]
    if result.proof:
        lines += ["", f"## Proof: load tests, tuned against the baseline at the largest batch and against the best "
                  f"fixed K elsewhere (pass: >= {PROOF_RATIO}x)", "",
                  markdown.table(["T", "batch", "tuned vs baseline", "fixed K vs baseline", "against", "ratio", "pass",
                                  "tuned outputs degenerate"], map(_proof_row, result.proof.checks), align="rrrllrlr")]
        lines += ["", *[f"- T={r.temperature:g}: [{r.report}]({r.report}) ({r.status})"
                        + ("; " + "; ".join(r.problems) if r.problems else "") for r in result.proof.reports]]
    lines += bullet_sections(result, SECTIONS)
    return "\n".join(lines) + "\n"


def _proof_row(c: ProofCheck) -> list[str]:
    fixed = ", ".join(f"K={k} {v:.2f}x" for k, v in sorted(c.fixed_speedups.items(), key=lambda i: int(i[0])))
    return [f"{c.temperature:g}", str(c.batch), markdown.speedup(c.tuned_speedup), fixed or "-", c.against,
            markdown.speedup(c.ratio), "yes" if c.passed else "NO",
            "-" if c.degenerate_share is None else f"{c.degenerate_share:.0%}"]
