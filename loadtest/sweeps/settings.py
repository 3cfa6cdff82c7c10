"""What a sweep is asked to do (`SweepSettings`), the variants a config makes of it (speculation
at each K, the tuned schedule, alternatives, the baseline), and the sizes of its runs."""

from __future__ import annotations

import argparse
import math
import operator
import re
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy import load_config
from deploy.config import DEFAULT_CONFIG, ConfigError, Override, as_overrides
from models.embedded_pair import is_pair_folder, pair_kind
from deploy.preflight import ResolvedDeployment
from loadtest.arg_types import int_list, name_list, positive_int, rate_list
from loadtest.cli_options import CliOption, add_cli_options, cli_values
from loadtest.measurement.slo import parse_targets
from loadtest.sweeps.plan import ORDERS, LoopKind
from loadtest.traffic import declared as traffic
from loadtest.traffic.declared import TRAFFIC_FIELDS
from loadtest.traffic.request_settings import RequestSettings, settings_record



@dataclass
class SweepSettings:
    config: str
    overrides: list[Override] = field(default_factory=list)
    """Config fields set for every variant (`--set`; texts given here are parsed: `as_overrides`)."""
    no_spec: bool = False
    """Run the baseline only."""
    baseline: bool = True
    """Also run the baseline (speculation off) beside the speculative variants."""
    extra_k: list[int] = field(default_factory=list)
    """More speculative variants with these K (num_speculative_tokens)."""
    alternatives: list[tuple[str, list[Override]]] = field(default_factory=list)
    """More speculative variants, each (name, overrides) of the config: another draft model, say."""
    drafters: list[str] = field(default_factory=list)
    """The config's named alternatives to measure beside its drafter, against the same baseline
    (`--drafters all` or names; the config's `alternatives` section)."""
    users: list[int] = field(default_factory=lambda: [1, 32])
    rates: list[float] = field(default_factory=list)
    """Open loop: the levels are these arrival rates (requests/s), not `users`; empty: closed loop."""
    loop: LoopKind = "closed"
    """`open` (the levels are arrival rates) or `closed` (the levels are `users`); `rates` make it
    open, and a search that picks its rates as it goes (capacity) gives `open` with none. Read this,
    not `rates`, for the kind of load. Not in results.json (`record`): its levels' `rate` or
    `concurrency` say it there, as in reports made before this field."""
    repeat: int = 3
    """Runs of every (variant, concurrency); speedups get a 95% interval over them."""
    node_gpus: int | None = None
    """GPUs of the node the servers share (default: this machine's, from nvidia-smi): where two or
    more variants' servers fit side by side, they run on disjoint GPUs (`loadtest.sweeps.plan`)."""
    order: str = "auto"
    """`alternate`, `grouped` or `auto` (`loadtest.sweeps.plan.choose_order`)."""
    requests: int | None = None
    """Measured requests of each run, shared by its users; default: see `requests_for` (open loop:
    `requests_for_rate`)."""
    duration_s: float | None = None
    """Measure for this long per level instead of a request count (open loop: the requests that
    arrive in this long at the level's rate)."""
    warmup: int = 1
    """Warm-up requests per user before each run (not measured; open loop: per warm-up user)."""
    request: RequestSettings = field(default_factory=RequestSettings)
    """What each request looks like (workload, length, temperature, ...) and how users start."""
    traffic_source: str = ""
    """Where `request`'s traffic came from (`loadtest.traffic.declared.origin`), for the plan and the report."""
    workers: int = 0
    """Locust worker processes (0: one local process)."""
    vllm_bench: bool = True
    """After a Locust run, run vLLM's serving benchmark on the same server and compare."""
    vllm_bench_every_repeat: bool = False
    """vLLM's benchmark after every repeat's run; by default after the first repeat's only (the
    second opinion checks the method, the repeats the spread; it doubles a run's time)."""
    requests_per_user: int = 8
    """Without `requests`: measured requests per user at a closed-loop level (the config's
    `traffic.requests_per_user`) ..."""
    requests_min: int = 32
    """... and at least this many (`traffic.requests_min`)."""
    level_timeout_s: float = 1800
    startup_timeout_s: float | None = None
    """Default: the config's server.startup_timeout_s."""
    tolerance: float = 0.05
    """Allowed relative difference between our token counts and the server's counter."""
    slo: str = ""
    """Service targets, e.g. `ttft_p95=500ms,tpot_p95=50ms` (see `loadtest.measurement.slo`); empty: none."""
    url: str = ""
    """Load the server already running here instead of starting one (`make serve` elsewhere)."""
    baseline_url: str = ""
    """With `url`: a running server without speculation to compare with."""
    model: str = ""
    """With `url`: the served model name (default: the config's, else the server's only model)."""
    tokenizer: str = ""
    """With `url`: tokenizer for vLLM's benchmark (default: the served model's folder if it is here)."""
    api_key_env: str | None = None
    """With `url`: variable holding the API key (default: the config's server.api_key_env)."""
    out: Path | None = None

    def __post_init__(self) -> None:
        # Overrides are data from here on; a caller may still give their `field=value` texts.
        self.overrides = as_overrides(self.overrides)
        self.alternatives = [(name, as_overrides(overrides)) for name, overrides in self.alternatives]
        if self.rates:
            self.loop = "open"

    def record(self) -> dict[str, Any]:
        """The settings as results.json keeps them: flat (`settings_record`), without `loop` (a
        reader tells the loop by `rates`, in older results too)."""
        return {k: v for k, v in settings_record(self).items() if k != "loop"}

    @classmethod
    def add_cli_args(cls, parser: Any, only: Collection[str] | None = None, skip: Collection[str] = (),
                     helps: Mapping[str, str] | None = None, defaults: Mapping[str, Any] | None = None,
                     required: Collection[str] = (), request_skip: Collection[str] = (),
                     several_temperatures: bool = False) -> None:
        """Register the sweep's options (`SWEEP_OPTIONS`: those in `only`, less `skip`) on an argparse
        parser or group; `helps`/`defaults`/`required` as a command words them. "request" stands for
        the request's options (`RequestSettings`, less `request_skip`, their defaults the config's
        traffic section); `several_temperatures`: --temperature takes several, one sweep each."""
        expand = {"request": lambda where: RequestSettings.add_cli_args(
            where, skip=request_skip, from_config=TRAFFIC_FIELDS, several_temperatures=several_temperatures,
            helps={"temperature": TEMPERATURES_HELP} if several_temperatures else None)}
        add_cli_options(parser, SWEEP_OPTIONS, only, skip, helps, defaults, required, expand)

    @classmethod
    def from_cli_args(cls, opts: argparse.Namespace, **changes: Any) -> SweepSettings:
        """The settings the options of `add_cli_args` ask for (those `opts` lacks keep their defaults;
        `changes` replace any). The config: the one given, else without --url the default config;
        its traffic section gives each request option not given (several temperatures: the request
        is the first's). Raises ConfigError (or OSError) for a config that cannot be read."""
        config = opts.config or ("" if opts.url else DEFAULT_CONFIG)
        overrides = as_overrides(opts.overrides)  # --set's texts parsed once, here
        declared, source = traffic.declared(config, overrides)
        given = traffic.given_options(opts)
        values = traffic.chosen(opts, declared)
        if isinstance(values["temperature"], list):
            values["temperature"] = values["temperature"][0]
        asked = cli_values(SWEEP_OPTIONS, opts)
        asked.update(config=config, overrides=overrides, request=RequestSettings.from_cli_args(opts, **values),
                     traffic_source=traffic.origin(source, given), requests_per_user=declared.requests_per_user,
                     requests_min=declared.requests_min)
        return cls(**{**asked, **changes})


def slo_targets(text: str) -> str:
    """--slo: service targets `loadtest.measurement.slo` reads, refused before any work if it cannot."""
    try:
        parse_targets(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


TEMPERATURES_HELP = ("sampling temperatures (default: the config's traffic.temperature; 0: greedy); several, e.g. "
                     "0,0.7,1 (the config's speculation.temperatures), run one sweep each and add a summary of "
                     "acceptance and speedup against temperature (temperature.md)")
"""--temperature where a sweep takes several (`loadtest run`)."""

REMOTE = "servers already running (instead of starting them)"

SWEEP_OPTIONS: dict[str, CliOption] = {
    "config": CliOption(("config",), f"config file or preset name (default: {DEFAULT_CONFIG}; with --url: read only "
                                     f"when given, for the model name, API key variable and tokenizer)",
                        {"nargs": "?", "default": None}),
    "overrides": CliOption(("--set",), "override a config field for every variant (repeatable)",
                           {"dest": "overrides", "action": "append", "default": [], "metavar": "FIELD=VALUE"}),
    "no_spec": CliOption(("--no-spec",), "run the baseline (speculation off) only", {"action": "store_true"}),
    "no_baseline": CliOption(("--no-baseline",), "skip the baseline variant", {"action": "store_true"},
                             field="baseline", value=operator.not_),
    "k": CliOption(("--k",), "extra speculative variants with these K",
                   {"type": int_list, "default": [], "metavar": "K,K"}, field="extra_k"),
    "drafters": CliOption(("--drafters",), "also measure the config's alternative drafters (its `alternatives` "
                                           "section) against the same baseline: all, or names", {
                              "type": name_list, "default": [], "metavar": "all|NAME,NAME"}),
    "users": CliOption(("--users",), "concurrency levels (closed-loop users) (default: 1,32)",
                       {"type": int_list, "default": None, "metavar": "C,C"}, exclusive="levels",
                       value=lambda users: sorted(dict.fromkeys(users or [1, 32]))),
    "rates": CliOption(("--rates",), "open loop instead: arrival rates in requests/s; requests arrive by a Poisson "
                                     "process whether or not earlier ones finished, nothing caps those in flight (so "
                                     "queueing shows); speculation and baseline get the same arrivals "
                                     "(docs/load-tests.md)",
                       {"type": rate_list, "default": None, "metavar": "R,R"}, exclusive="levels",
                       value=lambda rates: sorted(dict.fromkeys(rates or []))),
    "repeat": CliOption(("--repeat",), "runs of every variant at every concurrency; speedups get a 95%% interval "
                                       "(default: 3)", {"type": positive_int, "default": 3}),
    "order": CliOption(("--order",), "alternate: the variants take turns every repeat (who goes first flips); "
                                     "grouped: each variant's server starts once and runs all its levels and "
                                     "repeats; auto: grouped where servers cannot be up together on GPUs, else "
                                     "alternate (default: auto)", {"choices": ORDERS, "default": "auto"}),
    "node_gpus": CliOption(("--node-gpus",), "GPUs of the node the variants' servers share (default: this "
                                             "machine's); where two or more fit side by side they run on disjoint "
                                             "GPUs and take turns; a dry run elsewhere plans for this many",
                           {"type": positive_int, "default": None, "metavar": "N"}),
    "requests": CliOption(("--requests",), "measured requests per run (default: the config's traffic.requests_min "
                                           "and requests_per_user, max(32, 8 x concurrency) unless it sets them; with "
                                           "--rates: max(32, 60 s x rate))", {"type": int, "default": None}),
    "duration": CliOption(("--duration",), "measure each level for S seconds instead of a request count (with "
                                           "--rates: the requests arriving in S seconds)",
                          {"type": float, "default": None, "metavar": "S"}, field="duration_s"),
    "warmup": CliOption(("--warmup",), "warm-up requests per user before each level (default: 1)",
                        {"type": int, "default": 1}),
    "request": CliOption((), "the request's options (RequestSettings)"),
    "workers": CliOption(("--workers",), "Locust worker processes (0: one local process)", {"type": int, "default": 0}),
    "no_vllm_bench": CliOption(("--no-vllm-bench",), "skip vLLM's serving benchmark after each Locust run (the "
                                                     "independent check)", {"action": "store_true"},
                               field="vllm_bench", value=operator.not_),
    "vllm_bench_every_repeat": CliOption(("--vllm-bench-every-repeat",), "run vLLM's serving benchmark after every "
                                         "repeat's Locust run (default: after the first repeat's only)",
                                         {"action": "store_true"}),
    "level_timeout": CliOption(("--level-timeout",), "seconds before a level is abandoned",
                               {"type": float, "default": 1800}, field="level_timeout_s"),
    "startup_timeout": CliOption(("--startup-timeout",), "seconds to wait for each server",
                                 {"type": float, "default": None}, field="startup_timeout_s"),
    "tolerance": CliOption(("--tolerance",), "allowed difference between our token counts and the server's "
                                             "(default: 0.05)", {"type": float, "default": 0.05}),
    "slo": CliOption(("--slo",), "service targets, e.g. ttft_p95=500ms,tpot_p95=50ms (metrics ttft, tpot, e2e): per "
                                 "run the share of requests meeting each, the goodput, and the highest concurrency "
                                 "meeting all", {"type": slo_targets, "default": None, "metavar": "TARGETS"},
                     value=lambda slo: slo or ""),
    "url": CliOption(("--url",), "load this running server, e.g. one started by `make serve`", {"default": ""},
                     group=REMOTE),
    "baseline_url": CliOption(("--baseline-url",), "a running server without speculation to compare with",
                              {"default": ""}, group=REMOTE),
    "model": CliOption(("--model",), "served model name (default: the config's, else the server's only one)",
                       {"default": ""}, group=REMOTE),
    "tokenizer": CliOption(("--tokenizer",), "tokenizer for vLLM's benchmark (default: the served model's folder "
                                             "when it is on this machine)", {"default": ""}, group=REMOTE),
    "api_key_env": CliOption(("--api-key-env",), "variable holding the servers' API key (default: the config's "
                                                 "server.api_key_env)", {"default": None, "metavar": "VAR"},
                             group=REMOTE),
    "out": CliOption(("--out",), "report folder (default: reports/<config>-<time>)", {"type": Path, "default": None}),
}
"""Every option of a sweep, by its dest, in the order `loadtest run --help` lists them: declared here
once, taken by `loadtest run`, `loadtest capacity` and where `tuning` starts sweeps."""


def is_embedded(config: Any = None, folder: str = "") -> bool:
    """Whether a config or a model folder serves the kit's own code pair (`SPECDEPLOY_PAIR=cost` or
    `plumbing`), whose held-out code is the content check's reference text."""
    model = str(config.target.model) if config is not None else ""
    return model.startswith("embedded:code-") or (model.startswith("embedded:") and pair_kind() != "smollm2") \
        or is_pair_folder(folder)


def requests_for(concurrency: int, requested: int | None, per_user: int = 8, minimum: int = 32) -> int:
    """Measured requests of a run: `requested`, or max(`minimum`, `per_user` x concurrency) (a
    config's traffic section sets both: a slow model measures fewer)."""
    return max(1, requested or max(minimum, per_user * concurrency))


OPEN_LOOP_SECONDS = 60.0
"""An open-loop level's default length: the requests that arrive in about this long."""
OPEN_LOOP_MIN_REQUESTS = 32


def requests_for_rate(rate: float, requested: int | None, duration_s: float | None = None) -> int:
    """Measured requests of an open-loop run: `requested`, else those arriving in `duration_s`,
    else in OPEN_LOOP_SECONDS, at least OPEN_LOOP_MIN_REQUESTS (percentiles need some)."""
    if requested:
        return max(1, requested)
    if duration_s:
        return max(1, round(duration_s * rate))
    return max(OPEN_LOOP_MIN_REQUESTS, math.ceil(OPEN_LOOP_SECONDS * rate))


def seed_for(repeat: int) -> int:
    """The arrival schedule's seed of an open-loop run: one per repeat, shared by all variants."""
    return repeat


# The variants' names, in every report, compare table and doc: `spec-k<K>` speculation at one K,
# `spec-schedule` speculation with the config's K by batch size, `baseline` speculation off.
SCHEDULE_VARIANT = "spec-schedule"


@dataclass(frozen=True)
class Variant:
    name: str
    label: str
    overrides: tuple[Override, ...]
    no_speculation: bool
    k: int | None
    drafter: str | None


def plan_variants(settings: SweepSettings) -> list[Variant]:
    config = load_config(settings.config, settings.overrides)
    spec = config.speculation
    baseline = Variant("baseline", "no speculation", (), True, None, None)
    if settings.no_spec or not spec.enabled:
        return [baseline]
    if spec.schedule:
        # A tuned config: its schedule against each fixed K it chose from (schedule removed, and
        # the temperature gate a tuned plugin config carries too: a fixed K drafts for every request).
        schedule = ", ".join(f"{a}-{b}: {k}" for a, b, k in spec.schedule)
        gate = "" if spec.draft_max_temperature is None else f", drafts at T <= {spec.draft_max_temperature:g}"
        tuned = Variant(SCHEDULE_VARIANT, f"{spec.drafter} K by batch size ({schedule}{gate})", (), False,
                        spec.num_speculative_tokens, spec.drafter)
        fixed = [Variant(f"spec-k{k}", f"{spec.drafter} K={k}", (Override("speculation.schedule", None),
                                                                 Override("speculation.draft_max_temperature", None),
                                                                 Override("speculation.num_speculative_tokens", k)),
                         False, k, spec.drafter) for k in dict.fromkeys(settings.extra_k)]
        return [tuned, *fixed, *_alternatives(settings, config)] + ([baseline] if settings.baseline else [])
    ks = [spec.num_speculative_tokens] + [k for k in settings.extra_k if k != spec.num_speculative_tokens]
    variants = []
    for k in dict.fromkeys(ks):
        extra = () if k == spec.num_speculative_tokens else (Override("speculation.num_speculative_tokens", k),)
        variants.append(Variant(f"spec-k{k}", f"{spec.drafter} K={k}", extra, False, k, spec.drafter))
    return variants + _alternatives(settings, config) + ([baseline] if settings.baseline else [])


def _alternatives(settings: SweepSettings, config: Any) -> list[Variant]:
    spec = config.speculation
    given = [Variant(name, f"{spec.drafter} K={spec.num_speculative_tokens}, " + " ".join(map(str, overrides)),
                     tuple(overrides), False, spec.num_speculative_tokens, spec.drafter)
             for name, overrides in settings.alternatives]
    named = []
    for name in chosen_drafters(settings.drafters, config, settings.config):
        alt = config.alternatives[name]
        named.append(Variant(name, drafter_label(alt), (config.alternative_override(name),), False,
                             alt.num_speculative_tokens, alt.drafter))
    return given + named


def drafter_label(spec: Any) -> str:
    """A drafter as reports name it: `ngram K=4`, `small_model (plugin) K=1`."""
    path = f" ({spec.implementation})" if spec.drafter == "small_model" else ""
    return f"{spec.drafter}{path} K={spec.num_speculative_tokens}"


def chosen_drafters(asked: list[str], config: Any, source: str) -> list[str]:
    """The alternatives `--drafters` names (`all`: every one), in the config's order; ConfigError
    for a name the config does not have."""
    if not asked:
        return []
    names = list(config.alternatives)
    if not names:
        raise ConfigError(source, ["--drafters: this config names no alternatives (an `alternatives:` section, "
                                   "docs/configuration.md)"])
    if asked == ["all"]:
        return names
    unknown = [n for n in asked if n not in names]
    if unknown:
        raise ConfigError(source, [f"--drafters: no alternative named {', '.join(repr(n) for n in unknown)}; "
                                   f"this config's: {', '.join(names)} (or all)"])
    return [n for n in names if n in asked]


def configured_k(resolved: ResolvedDeployment | None, variant: Variant, users: int) -> int | None:
    """K the config gives a step at `users` running requests (its schedule's, where it has one);
    None without speculation. The effective K the server reports is read beside it."""
    if variant.no_speculation:
        return None
    if resolved is None:  # a running server given by URL: what it told
        return variant.k
    return resolved.config.speculation.k_at_batch(users)


def default_out_dir(config: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", Path(config).stem)
    return Path("reports") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
