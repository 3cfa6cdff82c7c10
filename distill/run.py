"""`make distill`: check -> collect the target's continuations -> fine-tune the draft -> write the
draft folder and a config using it -> measure acceptance and speedup before and after.

Everything that can refuse does so before any work: the config (a draft-model drafter, folders
that exist, a draft with the target's tokens: `deploy.preflight`), the data file, and whether
training fits the machine (`distill.fit`). The measurement is one load test per temperature in
which the original draft, the distilled one and no speculation take turns on held-out prompts
(`loadtest.sweeps.runner`, variants interleaved on the same machine minutes apart).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from deploy import free_port, load_config, plan_from_config, preflight, start_server
from deploy.config import Override, overrides_as_text, resolve_config_path
from deploy.config_text import with_speculation
from deploy.preflight import target_tokenizer
from distill import fit
from distill.collect import Example, collect
from distill.data import DistillData, load_data, stdlib_test_prompts, write_prompts
from distill.train import Offline, TrainSettings, TrainStats, evaluate, fine_tune, load_draft, save_draft
from loadtest.reports import markdown
from loadtest.files import bullet_sections, write_atomic, write_json, write_result
from loadtest.measurement.derive import content_warnings, summarize_speedups
from loadtest.measurement.derived import SpeedupSummary
from loadtest.measurement.figures import Interval
from loadtest.measurement.serial import Serial
from loadtest.reports.report import write_report
from loadtest.traffic.request_settings import RequestSettings, settings_record
from loadtest.measurement.results import CREATED_FORMAT
from loadtest.sweeps.settings import SweepSettings, default_out_dir
from loadtest.sweeps.runner import Sweep

log = logging.getLogger("specdeploy.distill")
STDLIB_TESTS = "stdlib-tests"
CHARS_PER_TOKEN = 3.0  # to size the training set before tokenizing it (byte-level BPE on code: ~3)


@dataclass
class DistillSettings:
    config: str
    overrides: list[Override] = field(default_factory=list)
    """Config fields set for every server (`--set`, parsed by the command line)."""
    data: str = STDLIB_TESTS
    """Prompts of the user's domain (a workload file), or `stdlib-tests`: windows of the Python
    standard library's tests, which the embedded pair never trained on."""
    held_out: str | None = None
    """Prompts to measure on (default: every fifth prompt of `data`, never trained on)."""
    max_tokens: int = 128
    """Tokens of the target's continuation collected per prompt."""
    temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0])
    """One continuation per prompt at each: greedy and sampled text both occur in traffic."""
    top_logprobs: int = 20
    """The target's top log-probabilities per position (vLLM's `max_logprobs` allows 20 by default)."""
    train: TrainSettings = field(default_factory=TrainSettings)
    max_minutes: float = 60
    """Refuse training estimated to take longer on this machine."""
    measure: bool = True
    batches: list[int] = field(default_factory=lambda: [1, 32])
    measure_temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0])
    repeat: int = 1
    requests: int | None = None
    measure_max_tokens: int = 64
    vllm_bench: bool = False
    draft_out: Path | None = None
    """The distilled draft's folder (default: `<out>/draft`)."""
    output: Path | None = None
    """The config using it (default: `<config>-distilled.yaml` beside the input)."""
    out: Path | None = None


@dataclass
class Checked:
    """What the checks found, for the work that follows."""

    config_path: Path
    draft_dir: Path
    tokenizer: str
    data: DistillData
    out: Path
    fit: fit.Needs


@dataclass
class DataRecord(Serial):
    file: str
    sha256: str
    train_prompts: int
    held_out_prompts: int


@dataclass
class Collected(Serial):
    train_sequences: int
    train_tokens: int
    with_logprobs: bool
    """Every sequence came with the target's top log-probabilities."""


@dataclass
class OfflineCheck(Serial):
    before: Offline
    after: Offline


@dataclass
class MeasuredRow(Serial):
    """One draft (`original` or `distilled`) at one temperature and batch: means over the repeats."""

    temperature: float
    batch: int
    draft: str
    acceptance: float | None = None
    tokens_per_step: float | None = None
    speedup: float | None = None
    """Output tokens/s over no speculation's."""
    speedup_interval: Interval | None = None
    vllm_bench_speedup: float | None = None
    runs: int = 0
    degenerate_share: float | None = None


@dataclass
class MeasuredReport(Serial):
    temperature: float
    report: str
    """The load test's report, relative to the distillation's folder."""
    status: str
    problems: list[str] = field(default_factory=list)


@dataclass
class Measured(Serial):
    rows: list[MeasuredRow] = field(default_factory=list)
    reports: list[MeasuredReport] = field(default_factory=list)
    content_warnings: list[str] = field(default_factory=list)


@dataclass
class DistillResult(Serial):
    """distill.json in the report folder. `status`: `distilled` (not measured), `measured`,
    `not_better` (further from the target on held-out prompts than the deployed draft: no config
    written) or `failed` (a measurement failed)."""

    config: str
    settings: dict[str, Any]
    """The settings as given, flat (`settings_record`)."""
    data: DataRecord
    needs: fit.Needs
    out: str
    collected: Collected | None = None
    training: TrainStats | None = None
    offline: OfflineCheck | None = None
    draft: str | None = None
    yaml: str | None = None
    """The config using the distilled draft (None: not better, none written)."""
    status: str = ""
    measured: Measured | None = None


def check(settings: DistillSettings) -> Checked:
    """Refuse what cannot work, before any server starts or any model trains (ValueError/ConfigError)."""
    config_path = resolve_config_path(settings.config)
    config = load_config(settings.config, settings.overrides)
    if config.speculation.drafter != "small_model":
        raise ValueError(f"{config_path.name}: distillation fine-tunes a draft model, and speculation.drafter is "
                         f"'{config.speculation.drafter}'; use a config with drafter: small_model")
    resolved = preflight(config, config_path.parent)  # missing folders, a draft with other tokens
    assert resolved.draft is not None
    if not resolved.draft.local:
        raise ValueError(f"the draft {resolved.draft.ref} is not a folder on this machine: download it "
                         f"(hf download {resolved.draft.ref}) and point speculation.model at it")
    if not 1 <= settings.top_logprobs <= 20:
        raise ValueError(f"--top-logprobs {settings.top_logprobs}: vLLM returns 1 to 20 by default")
    out = settings.out or default_out_dir(f"distill-{config_path.name}")  # whose stem is the config's
    data_file = (stdlib_test_prompts(out / "data.jsonl") if settings.data == STDLIB_TESTS else settings.data)
    data = load_data(data_file, settings.held_out)
    chars = sum(map(len, data.train)) / len(data.train)
    tokens = len(data.train) * len(settings.temperatures) * int(settings.max_tokens + chars / CHARS_PER_TOKEN)
    need, problems = fit.fit_problems(resolved.draft.params or 0.0, tokens, settings.train.epochs, resolved.machine,
                                      settings.max_minutes)
    if problems:
        raise ValueError("; ".join(problems))
    return Checked(config_path, Path(resolved.draft.path), target_tokenizer(resolved), data, out, need)


def collect_from_target(settings: DistillSettings, checked: Checked) -> tuple[list[Example], list[Example]]:
    """The target (speculation off) served as configured; its continuations of the training
    prompts at each temperature, and greedy ones of the held-out prompts (for the offline check)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checked.tokenizer)
    _, plan = plan_from_config(str(checked.config_path), [*settings.overrides, Override("server.port", free_port())],
                               no_speculation=True)
    key_env = load_config(str(checked.config_path), settings.overrides).server.api_key_env or ""
    log.info("starting the target to collect its continuations (log %s)", checked.out / "logs" / "target.log")
    with start_server(plan, checked.out / "logs" / "target.log") as server:
        train = collect(server.base_url, plan.served_name, tokenizer, checked.data.train, settings.max_tokens,
                        settings.temperatures, settings.top_logprobs, key_env, desc="target continuations")
        held = collect(server.base_url, plan.served_name, tokenizer, checked.data.held_out, settings.max_tokens,
                       [0.0], settings.top_logprobs, key_env, desc="held-out continuations")
    return train, held


def distill(settings: DistillSettings) -> DistillResult:
    """The whole run; its result is also distill.json / distill.md in the report folder."""
    import torch

    checked = check(settings)
    out = checked.out
    out.mkdir(parents=True, exist_ok=True)
    data = checked.data
    result = DistillResult(str(checked.config_path), settings_record(settings),
                           DataRecord(data.source, data.sha256, len(data.train), len(data.held_out)), checked.fit,
                           str(out))
    held_file = write_prompts(data.held_out, out / "held-out.jsonl")
    train_examples, held_examples = collect_from_target(settings, checked)
    result.collected = Collected(len(train_examples), sum(len(e.completion_ids) for e in train_examples),
                                 all(e.top for e in train_examples))

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    model = load_draft(checked.draft_dir, device)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    before = evaluate(model, held_examples, pad, device)
    result.training = fine_tune(model, train_examples, settings.train, pad, device)
    after = evaluate(model, held_examples, pad, device)
    result.offline = OfflineCheck(before, after)
    log.info("held-out greedy agreement (teacher-forced): %.1f%% -> %.1f%%", 100 * before.greedy_agreement,
             100 * after.greedy_agreement)

    draft_out = (settings.draft_out or out / "draft").resolve()
    save_draft(model, checked.draft_dir, draft_out)
    write_record(settings, checked, result, draft_out, device, torch.__version__)
    result.draft = str(draft_out)
    if after.loss >= before.loss:
        # A draft further from the target than the one deployed: keep it to look at, deploy nothing.
        log.error("the distilled draft is further from the target on held-out prompts (loss %.4f -> %.4f): no "
                  "config written; give more prompts, fewer --epochs or a lower --lr", before.loss, after.loss)
        result.status = "not_better"
        return _written(result)
    yaml_path = settings.output or checked.config_path.with_name(f"{checked.config_path.stem}-distilled.yaml")
    comments = [f"distilled by `make distill` from {data.source} ({len(data.train)} prompts)",
                f"held-out greedy agreement {100 * before.greedy_agreement:.1f}% -> "
                f"{100 * after.greedy_agreement:.1f}% (teacher-forced); record: {draft_out / 'distill.json'}"]
    write_atomic(yaml_path, with_speculation(checked.config_path.read_text(), {"model": str(draft_out)}, comments))
    load_config(yaml_path)  # what was written must validate
    result.yaml = str(yaml_path)

    result.status = "distilled"
    if settings.measure:
        result.measured = measure(settings, checked, draft_out, held_file)
        failed = any(r.status == "failed" for r in result.measured.reports)
        result.status = "failed" if failed else "measured"
    return _written(result)


def _written(result: DistillResult) -> DistillResult:
    write_result(Path(result.out), "distill", result.to_json(), describe(result))
    return result


def write_record(settings: DistillSettings, checked: Checked, result: DistillResult, draft_out: Path, device: str,
                 torch_version: str) -> None:
    """distill.json beside the distilled draft: what it was made from and how (the overrides as written)."""
    assert result.collected and result.training and result.offline
    write_json(draft_out / "distill.json", {
        "base_draft": str(checked.draft_dir), "target_config": str(checked.config_path),
        "overrides": overrides_as_text(settings.overrides), "data": result.data.to_json(),
        "collected": result.collected.to_json(),
        "collection": {"max_tokens": settings.max_tokens, "temperatures": settings.temperatures,
                       "top_logprobs": settings.top_logprobs},
        "training": {**asdict(settings.train), **result.training.to_json(), "device": device},
        "offline": result.offline.to_json(), "created": time.strftime(CREATED_FORMAT),
        "torch": torch_version})


def measure(settings: DistillSettings, checked: Checked, draft: Path, held_file: Path) -> Measured:
    """One load test per temperature on the held-out prompts: the original draft (`spec-k<K>`), the
    distilled one and no speculation, taking turns at each batch size."""
    measured = Measured()
    for temperature in settings.measure_temperatures:
        sweep_out = checked.out / f"measure-T{temperature:g}"
        results = Sweep(SweepSettings(
            str(checked.config_path), overrides=settings.overrides,
            alternatives=[("distilled", [Override("speculation.model", str(draft))])],
            users=settings.batches, repeat=settings.repeat, requests=settings.requests,
            request=RequestSettings(workload=str(held_file), temperature=temperature,
                                    max_tokens=settings.measure_max_tokens),
            vllm_bench=settings.vllm_bench, out=sweep_out)).run()
        write_report(results, sweep_out)
        measured.reports.append(MeasuredReport(temperature, f"{sweep_out.name}/report.md", results.status,
                                               results.problems))
        for entry in summarize_speedups(results):
            measured.rows.append(_row(temperature, entry))
            measured.content_warnings += [f"T={temperature:g}, {w}" for w in content_warnings(entry)]
    return measured


def _row(temperature: float, entry: SpeedupSummary) -> MeasuredRow:
    """One variant at one concurrency (`summarize_speedups`) as one draft's figures."""
    return MeasuredRow(temperature, entry.concurrency, "distilled" if entry.variant == "distilled" else "original",
                       entry.acceptance_rate.mean, entry.mean_accepted_length.mean, entry.speedup.mean,
                       entry.speedup, entry.vllm_bench_speedup.mean, entry.runs,
                       entry.content.degenerate_share if entry.content else None)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def describe(result: DistillResult) -> str:
    """distill.md: what was made, from what, and what it changed."""
    data, collected, training, off = result.data, result.collected, result.training, result.offline
    assert collected and training and off
    lines = [f"# Distilled draft for {Path(result.config).name}", "",
             f"Data `{data.file}`: {data.train_prompts} training prompts, {data.held_out_prompts} held out. The "
             f"target's continuations: {collected.train_sequences} sequences, {collected.train_tokens:,} tokens"
             f"{' with its top log-probabilities' if collected.with_logprobs else ''}. "
             f"Training: {training.steps} steps in {training.seconds} s, loss "
             f"{training.loss_first} -> {training.loss_last}.", "",
             f"Held-out greedy agreement (teacher-forced on the target's greedy continuations): "
             f"{_pct(off.before.greedy_agreement)} -> {_pct(off.after.greedy_agreement)}.", "",
             f"Draft: `{result.draft}` (its record: distill.json). " + (
                 f"Config: `{result.yaml}` (serve it: `make serve CONFIG={Path(result.yaml).name}`)."
                 if result.yaml else "**Not better than the deployed draft on held-out prompts: no config "
                 "written.** Give more prompts, fewer --epochs or a lower --lr.")]
    if result.measured:
        lines += measured_lines(result.measured)
    return "\n".join(lines) + "\n"


def measured_lines(measured: Measured) -> list[str]:
    """The before/after table of the load tests, their reports, and what they warned of."""
    by = {(r.temperature, r.batch, r.draft): r for r in measured.rows}
    rows = []
    for t, b in sorted({(r.temperature, r.batch) for r in measured.rows}):
        o, d = (by.get((t, b, draft), MeasuredRow(t, b, draft)) for draft in ("original", "distilled"))
        tps = [f"{v:.2f}" if v is not None else "-" for v in (o.tokens_per_step, d.tokens_per_step)]
        rows.append([f"{t:g}", str(b), _pct(o.acceptance), _pct(d.acceptance), *tps, markdown.speedup(o.speedup), markdown.speedup(d.speedup)])
    return ["", "Measured on the engine on the held-out prompts (one load test per temperature; the original draft, "
            "the distilled one and no speculation taking turns); speedup = output tokens/s over no speculation's:", "",
            markdown.table(["T", "batch", "acceptance before", "after", "tokens/step before", "after",
                            "speedup before", "after"], rows, align="r" * 8),
            "", "Reports: " + ", ".join(f"[{r.report}]({r.report}) ({r.status})" for r in measured.reports),
            *bullet_sections({"content": measured.content_warnings,
                              "problems": [p for r in measured.reports for p in r.problems]},
                             {"content": "Content (degenerate outputs behind these figures):",
                              "problems": "Problems:"})]
