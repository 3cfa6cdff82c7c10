"""`make advise CONFIG=...`: is this draft worth deploying, and at which batch sizes?

Measured on the real engine, for the user's workload and temperature: compatibility (preflight:
a draft that does not speak the target's tokenizer is the verdict, before any engine starts), step
costs (`step_costs.measure_costs`: a draft step as a fraction of a target step, a speculative step
as r target steps), acceptance and speedup in a load test of the speculative server beside the
baseline, and the cost model's prediction (tokens per step / r) beside the measured speedup: it
says which cost ate the gain in a verdict a person can act on (`verdict`). Where this machine
cannot run the deployment (a GPU preset on a laptop), it says what it would measure and refuses
(exit 2) without starting anything.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from deploy import ConfigError, load_config, preflight
from deploy.config import DeploymentConfig, Override, resolve_config_path
from loadtest.reports import markdown
from loadtest.files import bullet_sections, write_result
from loadtest.measurement.derive import content_warnings, levels, summarize_speedups
from loadtest.measurement.derived import SpeedupSummary
from loadtest.measurement.results import SweepResults
from loadtest.measurement.serial import Serial
from loadtest.reports.report import write_report
from loadtest.traffic.request_settings import RequestSettings, settings_record
from loadtest.sweeps.settings import SweepSettings, default_out_dir
from loadtest.sweeps.runner import Sweep
from loadtest.sweeps.plan import duration_text
from loadtest.traffic import declared as traffic
from tuning import step_costs
from tuning.step_costs import StepCosts

log = logging.getLogger("specdeploy.advise")

SECTIONS = {"would_measure": "What it would measure on a machine that runs the deployment:", "problems": "Problems:",
            "notes": "Notes:"}
"""The lists a result may end with, and their titles in its Markdown (tune's too)."""
# Preflight problems that are the draft's own unsuitability, not a config mistake.
VOCABULARY_WORDS = ("vocab_size", "tokenizer vocabulary", "not the same ones")
NOT_SMALLER = "is not smaller than"


PLAIN = "plain"
"""The plain engine every step-cost measurement has (`step_costs.VARIANTS`, `tune.cost_variants`)."""


@dataclass
class CommandResult(Serial):
    """What each tuning command's result file holds besides its figures: the config, the report
    folder, the `status`, and the lists its report ends with (`SECTIONS`)."""

    config: str = ""
    out: str = ""
    status: str = ""
    problems: list[str] | None = None
    would_measure: list[str] | None = None
    notes: list[str] | None = None

    def write(self, stem: str, text: str) -> Self:
        """Into the report folder as `<stem>.json` and, for people, `text` as `<stem>.md`."""
        write_result(Path(self.out), stem, self.to_json(), text)
        return self


@dataclass
class SettingsRecord(Serial):
    """A command's settings as its result keeps them (`settings_record`), those its report reads."""

    overrides: list[str] = field(default_factory=list)
    workload: str = ""
    temperature: float = 0.0
    max_tokens: int = 0
    cost_repeats: int = 0


@dataclass
class ReportLink(Serial):
    """A load test's report beside a command's result: where it is, its status and problems."""

    report: str = ""
    status: str = ""
    problems: list[str] = field(default_factory=list)


@dataclass
class AdviceRow(Serial):
    """One batch size: the step costs, the engine's acceptance, and predicted beside measured speedup."""

    batch: int = 0
    plain_step_ms: float = 0.0
    draft_step: float = 0.0
    """One draft token's forward pass in target steps."""
    verify_ratio: float = 0.0
    step_cost: float = 0.0
    """A speculative step in target steps."""
    acceptance_rate: float | None = None
    per_position_acceptance: list[float] | None = None
    tokens_per_step: float | None = None
    predicted_speedup: float | None = None
    measured_speedup: float | None = None
    """Locust's output tokens/s over the baseline's."""
    engine_speedup: float | None = None
    """On the engine's per-token clock."""
    degenerate_share: float | None = None


@dataclass
class Advice(CommandResult):
    """The advice as advice.json holds it; `status` `advised`, `unsuitable`, `cannot_measure` or `failed`."""

    settings: SettingsRecord = field(default_factory=SettingsRecord)
    drafter: str = ""
    k: int = 0
    draft_sampling: str = ""
    verdict: str = ""
    compatibility: str | None = None
    step_costs: StepCosts | None = None
    load_test: ReportLink | None = None
    rows: list[AdviceRow] | None = None
    content_warnings: list[str] | None = None


@dataclass
class AdviceSettings:
    config: str
    overrides: list[Override] = field(default_factory=list)
    """Config fields set for every engine and load test (`--set`, parsed by the command line)."""
    batches: list[int] = field(default_factory=lambda: [1, 32])
    """Batch sizes (closed-loop users) to advise on."""
    request: RequestSettings = field(default_factory=RequestSettings)
    """The user's traffic (workload file or built-in set), the temperature they send, the output length."""
    requests: int | None = None
    """Measured requests per batch size (default: the load test's, max(32, 8 x batch))."""
    cost_repeats: int = 3
    """Measurements per step cost; the median is kept."""
    repeat: int = 1
    """Load-test runs per batch size (the measured speedup is their mean, with an interval from 2)."""
    vllm_bench: bool = False
    """Also run vLLM's serving benchmark after each run, as the load test does (slower)."""
    out: Path | None = None
    traffic_source: str = ""
    """Where `request` came from (`loadtest.traffic.declared.origin`): the config's traffic section, options."""

    def load_test(self, out: Path | None = None) -> Sweep:
        """The load test at the batch sizes: the speculative server beside the baseline."""
        return Sweep(SweepSettings(self.config, overrides=list(self.overrides), users=self.batches, repeat=self.repeat,
                                   requests=self.requests, request=self.request, traffic_source=self.traffic_source,
                                   vllm_bench=self.vllm_bench, out=out))


def drafter_config(config: str, overrides: Sequence[Override | str], doing: str) -> DeploymentConfig:
    """The config with its overrides, refused where it has no drafter (nothing to `doing`)."""
    loaded = load_config(config, overrides)
    if not loaded.speculation.enabled:
        raise ValueError(f"config {config} has no drafter (speculation.drafter: none): nothing to {doing}")
    return loaded


def would_measure(settings: AdviceSettings, k: int) -> list[str]:
    """What `advise` measures, in words (printed where this machine cannot run it)."""
    batches = ", ".join(map(str, settings.batches))
    return [f"step costs at batch {batches}: a plain target step, a verification of {k + 1} tokens, a speculative "
            f"step with the drafter ({settings.cost_repeats} measurements each, on 3 engines in turn)",
            f"a load test at batch {batches}: the speculative server and the baseline, workload "
            f"'{settings.request.workload}', temperature {settings.request.temperature:g}, "
            f"{settings.request.max_tokens} output tokens{'' if settings.request.fixed_length else ' at most'}: "
            f"per-position acceptance, tokens per step and the measured speedup",
            "the cost model's speedup (tokens per step / step cost) beside the measured one, and a verdict"]


def dry_run(settings: AdviceSettings) -> int:
    """Print what `advise` would measure on the machine its config describes; start nothing."""
    try:
        config = drafter_config(settings.config, settings.overrides, "advise on")
        plan = settings.load_test().plan(dry_run=True)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    engine = next((s for s in plan.servers if s.name != "baseline"), plan.servers[0])
    start = plan.start_estimate(engine).seconds
    print("\n".join([
        f"advise plan (dry run: nothing starts): {settings.config}",
        *[f"  {line}" for line in traffic.describe(settings.request, settings.traffic_source)],
        *[f"  {i}. {step}" for i, step in enumerate(would_measure(settings, config.speculation.num_speculative_tokens), 1)],
        f"  step costs: 3 engines started in turn in this process (about {duration_text(start)} each, as a server's "
        f"start), {settings.cost_repeats} measurements per batch size",
        "  the load test's own plan:",
        *[f"  {line}" for line in plan.describe(dry_run=True).splitlines()[1 + len(plan.traffic):]],
        f"  estimated duration: about {duration_text(3 * start + plan.total_s())} (the load test's estimate and "
        f"the step costs' engine starts)"]))
    return 0 if plan.servers else 2


def advise(settings: AdviceSettings) -> Advice:
    """Measure and judge; the advice (also written as advice.json / advice.md) has a `verdict`, a
    `status` (`advised`, `unsuitable`, `cannot_measure`, `failed`) and the figures."""
    out = settings.out or default_out_dir(f"advise-{Path(settings.config).stem}")
    config = drafter_config(settings.config, settings.overrides, "advise on")
    spec = config.speculation
    advice = Advice(settings.config, str(out), settings=SettingsRecord.from_json(settings_record(settings)),
                    drafter=spec.drafter, k=spec.num_speculative_tokens, draft_sampling=spec.draft_sampling)
    try:
        resolved = preflight(config, resolve_config_path(settings.config).parent, plan_only=True)
    except ConfigError as exc:
        vocabulary = [p for p in exc.problems if any(w in p for w in VOCABULARY_WORDS)]
        larger = [p for p in exc.problems if NOT_SMALLER in p]
        advice.verdict = ("vocabularies differ: " + vocabulary[0] if vocabulary else "too slow a draft: " + larger[0]
                          if larger else "the config cannot run: " + "; ".join(exc.problems))
        advice.status, advice.problems = "unsuitable" if vocabulary or larger else "failed", exc.problems
        return advice.write("advice", describe(advice))
    advice.notes, advice.compatibility = resolved.notes, compatibility(resolved)
    if resolved.machine_problems:
        count = len(resolved.machine_problems)
        advice.status, advice.problems = "cannot_measure", resolved.machine_problems
        advice.would_measure = would_measure(settings, spec.num_speculative_tokens)
        advice.verdict = (f"not measured: this machine cannot run the deployment ({count} problem"
                          f"{'s' if count > 1 else ''} below); run `make advise` where it is meant to run")
        return advice.write("advice", describe(advice))

    log.info("advise %s: step costs at batch %s", settings.config, settings.batches)
    advice.step_costs = costs = step_costs.measure_costs(settings.config, None, tuple(settings.batches),
                                                         settings.cost_repeats, tuple(settings.overrides))
    log.info("advise %s: load test at batch %s", settings.config, settings.batches)
    sweep_out = out / "load-test"
    results = settings.load_test(sweep_out).run()
    write_report(results, sweep_out)
    advice.load_test = ReportLink("load-test/report.md", results.status, results.problems)
    advice.rows = advice_rows(costs, results)
    advice.content_warnings = [w for e in summarize_speedups(results) for w in content_warnings(e)]
    if not any(r.measured_speedup is not None for r in advice.rows):
        advice.status = "failed"
        advice.verdict = ("not measured: the load test produced no speedup ("
                          + "; ".join(results.problems or [results.status]) + ")")
    else:
        advice.status = "advised"
        advice.verdict = verdict(advice.rows, spec.num_speculative_tokens, sampled_remedy(spec))
    return advice.write("advice", describe(advice))


def compatibility(resolved: Any) -> str:
    """What the vocabulary check saw (it passed: preflight refuses a draft that fails it)."""
    target, draft = resolved.target, resolved.draft
    if draft is None:
        return f"{resolved.config.speculation.drafter} drafts from the target's own tokens: no second vocabulary"
    if target.tokens and draft.tokens:
        return f"the draft's tokenizer is the target's: the same {len(target.tokens)} tokens with the same ids"
    if target.vocab_size and draft.vocab_size:
        return (f"vocabulary sizes match ({target.vocab_size}); the tokens themselves were not compared (no "
                f"tokenizer.json on this machine)")
    return "not checked: the models' config.json are not on this machine (vLLM checks the sizes when it loads them)"


def advice_rows(costs: StepCosts, results: SweepResults) -> list[AdviceRow]:
    """Per batch size: the step costs, the engine's acceptance, and predicted beside measured speedup."""
    by_batch = {e.concurrency: e for e in summarize_speedups(results)}
    runs: dict[int, list[list[float]]] = {}
    for variant, level in levels(results):
        if variant.k and level.server and level.server.per_position_acceptance:
            runs.setdefault(level.concurrency, []).append(level.server.per_position_acceptance)
    # Averaged over the repeats, as the tokens per step beside them are (sampled runs differ).
    per_position = {b: [sum(p) / len(p) for p in zip(*r)] for b, r in runs.items()}
    rows = []
    for batch, ratio in sorted((costs.ratios or {}).items(), key=lambda item: int(item[0])):
        entry = by_batch.get(int(batch)) or SpeedupSummary()
        tokens = entry.mean_accepted_length.mean
        rows.append(AdviceRow(
            int(batch), costs.batches[batch][PLAIN].step_ms, ratio.draft_step, ratio.verify_ratio, ratio.step_cost,
            entry.acceptance_rate.mean, per_position.get(int(batch)), tokens,
            tokens / ratio.step_cost if tokens else None, entry.speedup.mean, entry.measured_speedup.mean,
            entry.content.degenerate_share if entry.content else None))
    return rows


def sampled_remedy(spec: Any) -> str:
    """What this drafter can do about drafts rarely accepted at a temperature > 0."""
    if spec.plugin_class and (spec.draft_sampling == "probabilistic" or not spec.samples_drafts):
        # already sampling (or deterministic): a plugin can still keep these requests off its drafts
        return "draft_max_temperature below it, so these requests decode without drafts"
    if spec.samples_drafts:
        return "draft_sampling: probabilistic"
    return ""


def verdict(rows: list[AdviceRow], k: int, remedy: str = "") -> str:
    """One sentence a person can act on, from the measured speedup at each batch size (the
    prediction explains it: which cost ate the gain). `remedy`: what the drafter can change where
    drafts are rarely accepted at this temperature (`sampled_remedy`)."""
    rows = sorted((r for r in rows if r.measured_speedup is not None), key=lambda r: r.batch)
    if not rows:
        return "not measured"
    paying = next((i for i, r in enumerate(rows) if r.measured_speedup <= 1), len(rows))  # rows before the first loss
    if paying == len(rows):
        return (f"use it at every batch size measured (up to {rows[-1].batch}): "
                + ", ".join(f"{r.measured_speedup:.2f}x at batch {r.batch}" for r in rows))
    if paying:
        last, first_loss = rows[paying - 1], rows[paying]
        return (f"use it at batch <= {last.batch} ({last.measured_speedup:.2f}x there); at batch "
                f"{first_loss.batch} it makes {first_loss.measured_speedup:.2f}x: "
                f"{why_not(first_loss, k, remedy)}; set speculation.schedule to turn it off above {last.batch}")
    return (f"do not speculate with this drafter: {rows[0].measured_speedup:.2f}x at batch {rows[0].batch}, "
            f"{why_not(rows[0], k, remedy)}")


LOW_ACCEPTANCE = 0.3
"""Below this share of drafted tokens accepted, the draft is the problem whatever it costs."""


def why_not(row: AdviceRow, k: int, remedy: str = "") -> str:
    """Which cost outweighs the tokens a step makes at this batch size."""
    tokens, cost, acceptance = row.tokens_per_step, row.step_cost, row.acceptance_rate
    if tokens is None:
        return f"a speculative step costs {cost:.2f} target steps"
    head = f"a step makes {tokens:.2f} tokens and costs {cost:.2f} target steps"
    drafting, verifying = k * row.draft_step, row.verify_ratio - 1
    if acceptance is not None and acceptance < LOW_ACCEPTANCE:
        return (f"too rarely accepted: {head}, with {acceptance:.0%} of draft tokens accepted; a draft closer to "
                f"the target on this traffic{f' (or at this temperature, {remedy})' if remedy else ''} would help")
    if drafting >= verifying:
        return (f"too slow a draft: {head}, of which drafting is {drafting:.2f} "
                f"({row.draft_step:.1%} of a target step per draft token)")
    return (f"verification too costly at this batch size: {head}; verifying {k + 1} tokens per request costs "
            f"{row.verify_ratio:.2f}x a plain step (the target is compute-bound here)")


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def describe(advice: Advice) -> str:
    """The advice as a person reads it (also advice.md)."""
    lines = [f"# Advice: {advice.config} ({advice.drafter}, K={advice.k}, draft sampling {advice.draft_sampling})",
             "", f"**Verdict: {advice.verdict}**", "", *[f"**{w}**" for w in advice.content_warnings or []],
             *([""] if advice.content_warnings else [])]
    if advice.compatibility:
        lines += [f"Vocabulary: {advice.compatibility}.", ""]
    s, link = advice.settings, advice.load_test
    if advice.rows and link:
        lines += [f"Workload '{s.workload}', temperature {s.temperature:g}, {s.max_tokens} output tokens. "
                  "Step costs in target steps (the engine's clock, median of "
                  f"{s.cost_repeats}); acceptance from the engine's counters; measured speedup: Locust's output "
                  "tokens/s over the baseline's (the engine's per-token clock beside it); predicted: tokens per "
                  "step / step cost.", "",
                  markdown.table(["batch", "plain step ms", "draft step", "verify", "step cost", "acceptance",
                                  "per position", "tokens per step", "predicted", "measured", "engine",
                                  "degenerate outputs"], map(_advice_row, advice.rows), align="rrrrrrlrrrrr"),
                  "", f"The load test's own report: [{link.report}]({link.report}) ({link.status})."]
    lines += bullet_sections(advice, SECTIONS)
    return "\n".join(lines) + "\n"


def _advice_row(r: AdviceRow) -> list[str]:
    per_position = " ".join(f"{a:.0%}" for a in r.per_position_acceptance or []) or "-"
    return [str(r.batch), f"{r.plain_step_ms:.2f}", f"{r.draft_step:.1%}", f"{r.verify_ratio:.2f}x",
            f"{r.step_cost:.2f}", _fmt(r.acceptance_rate, ".1%"), per_position, _fmt(r.tokens_per_step, ".2f"),
            f"{_fmt(r.predicted_speedup, '.2f')}x", f"{_fmt(r.measured_speedup, '.2f')}x",
            f"{_fmt(r.engine_speedup, '.2f')}x", _fmt(r.degenerate_share, ".0%")]
