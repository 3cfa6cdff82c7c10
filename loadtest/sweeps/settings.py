"""What a sweep is asked to do (`SweepSettings`), the variants a config makes of it (speculation
at each K, the tuned schedule, alternatives, the baseline), and the sizes of its runs."""

from __future__ import annotations

import argparse
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy import load_config
from deploy.config import DEFAULT_CONFIG, ConfigError, Override, as_overrides
from models.embedded_pair import is_pair_folder, pair_kind
from deploy.preflight import ResolvedDeployment
from loadtest.arg_types import int_list, name_list, positive_int, rate_list, temperature_list
from loadtest.measurement.slo import parse_targets
from loadtest.sweeps.plan import ORDERS, LoopKind
from loadtest.traffic import declared as traffic
from loadtest.traffic.request_settings import (RequestSettings, add_length_args, add_prompt_args, add_timing_args,
                                               given_fields, settings_record)



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
    def add_cli_args(cls, parser: Any) -> None:
        """Every option of a sweep (`loadtest run`), in the order `--help` lists them; `loadtest capacity`
        takes the groups it shares (`add_servers_args`, the traffic's, `add_level_args`, `add_remote_args`)."""
        add_servers_args(parser, f"config file or preset name (default: {DEFAULT_CONFIG}; with --url: read only when "
                                 f"given, for the model name, API key variable and tokenizer)",
                         no_spec_help="run the baseline (speculation off) only")
        add_variant_args(parser)
        add_levels_args(parser)
        add_prompt_args(parser)
        add_length_args(parser)
        parser.add_argument("--temperature", type=temperature_list, default=None, metavar="T,T",
                            help="sampling temperatures (default: the config's traffic.temperature; 0: greedy); "
                                 "several, e.g. 0,0.7,1 (the config's speculation.temperatures), run one sweep each "
                                 "and add a summary of acceptance and speedup against temperature (temperature.md)")
        add_timing_args(parser)
        add_level_args(parser)
        parser.add_argument("--slo", type=slo_targets, default=None, metavar="TARGETS",
                            help="service targets, e.g. ttft_p95=500ms,tpot_p95=50ms (metrics ttft, tpot, e2e): per "
                                 "run the share of requests meeting each, the goodput, and the highest concurrency "
                                 "meeting all")
        add_remote_args(parser)
        parser.add_argument("--out", type=Path, default=None, help="report folder (default: reports/<config>-<time>)")

    @classmethod
    def from_cli_args(cls, opts: argparse.Namespace, **changes: Any) -> SweepSettings:
        """The settings the options `opts` has ask for (each option's dest is its field's; a field
        without one keeps its default; `changes` replace any). The config: the one given, else without
        --url the default config; its traffic section gives each request option not given (several
        temperatures: the request is the first's). Raises ConfigError (or OSError) for a config that
        cannot be read."""
        config = opts.config or ("" if opts.url else DEFAULT_CONFIG)
        overrides = as_overrides(opts.overrides)  # --set's texts parsed once, here
        declared, source = traffic.declared(config, overrides)
        values = traffic.chosen(opts, declared)
        if isinstance(values["temperature"], list):
            values["temperature"] = values["temperature"][0]
        asked = given_fields(cls, opts)
        for levels in ("users", "rates"):
            if levels in asked:
                asked[levels] = sorted(dict.fromkeys(asked[levels]))
        asked.update(config=config, overrides=overrides, request=RequestSettings.from_cli_args(opts, **values),
                     traffic_source=traffic.origin(source, traffic.given_options(opts)),
                     requests_per_user=declared.requests_per_user, requests_min=declared.requests_min)
        return cls(**{**asked, **changes})


def slo_targets(text: str) -> str:
    """--slo: service targets `loadtest.measurement.slo` reads, refused before any work if it cannot."""
    try:
        parse_targets(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_servers_args(parser: Any, config_help: str, no_spec_help: str) -> None:
    """The config, --set and --no-spec: what the servers a command starts serve (with --url they run
    already); the config's and --no-spec's helps as the command words them."""
    parser.add_argument("config", nargs="?", default=None, help=config_help)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a config field for every variant (repeatable)")
    parser.add_argument("--no-spec", action="store_true", help=no_spec_help)


def add_variant_args(parser: Any) -> None:
    """The variants besides the config's speculation: the baseline, other K, the config's alternatives."""
    parser.add_argument("--no-baseline", dest="baseline", action="store_false", help="skip the baseline variant")
    parser.add_argument("--k", dest="extra_k", type=int_list, default=[], metavar="K,K",
                        help="extra speculative variants with these K")
    parser.add_argument("--drafters", type=name_list, default=[], metavar="all|NAME,NAME",
                        help="also measure the config's alternative drafters (its `alternatives` section) against the "
                             "same baseline: all, or names")


def add_levels_args(parser: Any) -> None:
    """The levels (users or rates), their repeats and order, and each level's requests."""
    levels = parser.add_mutually_exclusive_group()
    levels.add_argument("--users", type=int_list, default=None, metavar="C,C",
                        help="concurrency levels (closed-loop users) (default: 1,32)")
    levels.add_argument("--rates", type=rate_list, default=None, metavar="R,R",
                        help="open loop instead: arrival rates in requests/s; requests arrive by a Poisson process "
                             "whether or not earlier ones finished, nothing caps those in flight (so queueing shows); "
                             "speculation and baseline get the same arrivals (docs/load-tests.md)")
    parser.add_argument("--repeat", type=positive_int, default=SweepSettings.repeat,
                        help="runs of every variant at every concurrency; speedups get a 95%% interval (default: "
                             "%(default)s)")
    parser.add_argument("--order", choices=ORDERS, default=SweepSettings.order,
                        help="alternate: the variants take turns every repeat (who goes first flips); grouped: each "
                             "variant's server starts once and runs all its levels and repeats; auto: grouped where "
                             "servers cannot be up together on GPUs, else alternate (default: %(default)s)")
    parser.add_argument("--node-gpus", type=positive_int, default=None, metavar="N",
                        help="GPUs of the node the variants' servers share (default: this machine's); where two or "
                             "more fit side by side they run on disjoint GPUs and take turns; a dry run elsewhere "
                             "plans for this many")
    parser.add_argument("--requests", type=int, default=None,
                        help="measured requests per run (default: the config's traffic.requests_min and "
                             "requests_per_user, max(32, 8 x concurrency) unless it sets them; with --rates: max(32, "
                             "60 s x rate))")
    parser.add_argument("--duration", dest="duration_s", type=float, default=None, metavar="S",
                        help="measure each level for S seconds instead of a request count (with --rates: the "
                             "requests arriving in S seconds)")
    parser.add_argument("--warmup", type=int, default=SweepSettings.warmup,
                        help="warm-up requests per user before each level (default: %(default)s)")


def add_level_args(parser: Any, vllm_bench: bool = True) -> None:
    """How each level runs and when it is abandoned; `vllm_bench`: with the options of vLLM's benchmark
    after it (capacity runs the benchmark at levels of its own choosing)."""
    parser.add_argument("--workers", type=int, default=SweepSettings.workers,
                        help="Locust worker processes (0: one local process)")
    if vllm_bench:
        parser.add_argument("--no-vllm-bench", dest="vllm_bench", action="store_false",
                            help="skip vLLM's serving benchmark after each Locust run (the independent check)")
        parser.add_argument("--vllm-bench-every-repeat", action="store_true",
                            help="run vLLM's serving benchmark after every repeat's Locust run (default: after the "
                                 "first repeat's only)")
    parser.add_argument("--level-timeout", dest="level_timeout_s", type=float, default=SweepSettings.level_timeout_s,
                        metavar="LEVEL_TIMEOUT", help="seconds before a level is abandoned")
    parser.add_argument("--startup-timeout", dest="startup_timeout_s", type=float, default=None,
                        metavar="STARTUP_TIMEOUT", help="seconds to wait for each server")
    parser.add_argument("--tolerance", type=float, default=SweepSettings.tolerance,
                        help="allowed difference between our token counts and the server's (default: %(default)s)")


def add_remote_args(parser: Any, url: str = "load this running server, e.g. one started by `make serve`",
                    baseline_url: str = "a running server without speculation to compare with",
                    tokenizer: str = "tokenizer for vLLM's benchmark (default: the served model's folder when it is "
                                     "on this machine)",
                    api_key_env: str = "variable holding the servers' API key (default: the config's "
                                       "server.api_key_env)") -> None:
    """The servers already running, in a group of their own; the helps as a command words them."""
    remote = parser.add_argument_group("servers already running (instead of starting them)")
    remote.add_argument("--url", default="", help=url)
    remote.add_argument("--baseline-url", default="", help=baseline_url)
    remote.add_argument("--model", default="", help="served model name (default: the config's, else the server's "
                                                    "only one)")
    remote.add_argument("--tokenizer", default="", help=tokenizer)
    remote.add_argument("--api-key-env", default=None, metavar="VAR", help=api_key_env)


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


def default_out_dir(config: str, kind: str = "") -> Path:
    """`reports/<config's stem><kind>-<time>`; `kind` names the command's report, e.g. `-capacity`."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", Path(config).stem)
    return Path("reports") / f"{stem}{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
