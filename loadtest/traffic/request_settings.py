"""What every request of a load test looks like and how users start sending them, declared once.

The same settings travel through the sweep (`SweepSettings.request`), the Locust job and its
command line, the locustfile's options and vLLM's serving benchmark. `add_cli_args` declares a
Locust process's options (every field, its default the field's), `as_options` writes them back;
a command whose traffic is its config's takes `add_traffic_args` (each option defaulting to the
config's traffic section) and `add_timing_args`.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from deploy.config import overrides_as_text
from loadtest.traffic.workloads import BUILTIN

API_CHOICES = ("auto", "completions", "chat")
WORKLOAD_HELP = f"built-in set ({', '.join(BUILTIN)}) or a JSONL / ShareGPT file"
API_HELP = "auto: chat API for chat messages, completions API for plain prompts"
MAX_TOKENS_HELP = "output tokens per request"
TEMPERATURE_HELP = "sampling temperature (default 1, vLLM's own when a request sets none; 0: greedy)"
"""The request options' helps, shared by the two ways of defaulting them (the field's, the config's)."""


@dataclass(frozen=True)
class RequestSettings:
    workload: str = "code"
    """The prompts: a built-in set or a user's file (see `loadtest.traffic.workloads`)."""
    api: str = "auto"
    max_tokens: int = 128
    fixed_length: bool = True
    """Every request generates exactly `max_tokens` (ignore_eos), so runs compare equal work."""
    temperature: float = 1.0
    """What users send: vLLM's default. Greedy output forced to a fixed length loops on many models, and a
    loop is what drafts predict best (see `loadtest.measurement.content`): measure greedy on purpose, not by default."""
    request_timeout_s: float = 300.0
    """Seconds before a request counts as failed."""
    arrival_gap_s: float = 0.05
    """Seconds between the users' first requests, in Locust and in vLLM's benchmark alike
    (`--request-rate 1/gap --burstiness inf`, far above what the server completes, so the loop
    stays closed after the first C). Fixed-length requests started together stay in lockstep:
    without speculation all C finish in one step and come back together, and where those waves
    fall would move TTFT from run to run more than anything measured."""

    def as_options(self) -> list[str]:
        """The command-line options that `add_cli_args` reads back into these settings."""
        return ["--workload", self.workload, "--api", self.api, "--max-tokens", str(self.max_tokens),
                *([] if self.fixed_length else ["--no-fixed-length"]), "--temperature", str(self.temperature),
                "--request-timeout", str(self.request_timeout_s), "--arrival-gap", str(self.arrival_gap_s)]

    @classmethod
    def from_cli_args(cls, opts: argparse.Namespace, **changes: Any) -> RequestSettings:
        """The settings `opts` has (None: not given, nor defaulted); the others keep their defaults."""
        return cls(**{**given_fields(cls, opts), **changes})

    @classmethod
    def add_cli_args(cls, parser: Any) -> None:
        """An option for each field, its default the field's, on an argparse-like parser (Locust's
        configargparse too): a Locust process's command line (`as_options`)."""
        parser.add_argument("--workload", default=cls.workload, help=f"{WORKLOAD_HELP} (default: %(default)s)")
        parser.add_argument("--api", default=cls.api, choices=API_CHOICES, help=f"{API_HELP} (default: %(default)s)")
        parser.add_argument("--max-tokens", type=int, default=cls.max_tokens,
                            help=f"{MAX_TOKENS_HELP} (default: %(default)s)")
        parser.add_argument("--no-fixed-length", dest="fixed_length", action="store_false",
                            help="let requests stop at EOS (default: ignore_eos, exactly --max-tokens each)")
        parser.add_argument("--temperature", type=float, default=cls.temperature,
                            help=f"{TEMPERATURE_HELP} (default: %(default)s)")
        add_timing_args(parser)


def add_traffic_args(parser: Any, temperature: str = TEMPERATURE_HELP) -> None:
    """The options of a config's traffic section (`TRAFFIC_FIELDS`), each None unless given, so that
    `loadtest.traffic.declared.chosen` takes the config's value for each option not given;
    `temperature`: the help of --temperature where a command words it its own way."""
    add_prompt_args(parser)
    add_length_args(parser)
    parser.add_argument("--temperature", type=float, default=None,
                        help=f"{temperature} (default: the config's traffic.temperature)")


def add_prompt_args(parser: Any) -> None:
    """--workload and --api, defaulting to the config's traffic section."""
    parser.add_argument("--workload", default=None, help=f"{WORKLOAD_HELP} (default: the config's traffic.workload)")
    parser.add_argument("--api", default=None, choices=API_CHOICES,
                        help=f"{API_HELP} (default: the config's traffic.api)")


def add_length_args(parser: Any) -> None:
    """--max-tokens and --fixed-length / --no-fixed-length, defaulting to the config's traffic section."""
    from loadtest.traffic.declared import add_fixed_length_flags

    parser.add_argument("--max-tokens", type=int, default=None,
                        help=f"{MAX_TOKENS_HELP} (default: the config's traffic.max_tokens)")
    add_fixed_length_flags(parser)


def add_timing_args(parser: Any, arrival_gap: bool = True) -> None:
    """--request-timeout and, unless `arrival_gap` is False (capacity and soak keep the default gap),
    --arrival-gap."""
    parser.add_argument("--request-timeout", dest="request_timeout_s", type=float,
                        default=RequestSettings.request_timeout_s,
                        help="seconds before a request counts as failed (default: %(default)s)")
    if arrival_gap:
        parser.add_argument("--arrival-gap", dest="arrival_gap_s", type=float, default=RequestSettings.arrival_gap_s,
                            metavar="S", help="seconds between the users' first requests, in Locust and vLLM's "
                                              "benchmark alike (0: all at once) (default: %(default)s)")


OVERRIDE_FIELDS = ("overrides", "alternatives")
"""Settings fields holding config overrides (`deploy.config.Override`), alone or in (name, overrides)
pairs: result files keep them as written (`--set`'s text)."""


def given_fields(settings: type, opts: argparse.Namespace) -> dict[str, Any]:
    """The fields of a settings dataclass that `opts` has, by name (an option's dest is its field's;
    None: not given, nor defaulted, so the field keeps its default)."""
    given = vars(opts)
    return {f.name: given[f.name] for f in fields(settings) if given.get(f.name) is not None}


def settings_record(settings: Any) -> dict[str, Any]:
    """A command's settings dataclass as its result files keep them: flat (the request settings
    beside the command's own, as readers of older reports expect), paths and config overrides as text."""
    flat = asdict(settings)
    flat.update({name: overrides_as_text(getattr(settings, name)) for name in OVERRIDE_FIELDS if name in flat})
    flat.update(flat.pop("request", {}))
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in flat.items()}
