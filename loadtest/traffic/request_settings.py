"""What every request of a load test looks like and how users start sending them, declared once.

The same settings travel through the sweep (`SweepSettings.request`), the Locust job and its
command line, the locustfile's options and vLLM's serving benchmark. Each field carries its
option (flag and help) so the CLI parsers and the locustfile register options from here and
`as_options` writes the command line back: a setting added here reaches every place at once.
"""

from __future__ import annotations

import argparse
from collections.abc import Collection, Mapping
from dataclasses import Field, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

from deploy.config import overrides_as_text
from loadtest.arg_types import temperature_list
from loadtest.traffic.workloads import BUILTIN

API_CHOICES = ("auto", "completions", "chat")


class Option(NamedTuple):
    """A field's command-line option: its flag, help, and further argparse keywords."""

    flag: str
    help: str
    argparse: dict[str, Any]


def _option(flag: str, help: str, **argparse_kw: Any) -> dict[str, Option]:
    return {"option": Option(flag, help, argparse_kw)}


def option(f: Field) -> Option:
    """The option a RequestSettings field declares."""
    return f.metadata["option"]


@dataclass(frozen=True)
class RequestSettings:
    workload: str = field(default="code", metadata=_option(
        "--workload", f"built-in set ({', '.join(BUILTIN)}) or a JSONL / ShareGPT file"))
    """The prompts: a built-in set or a user's file (see `loadtest.traffic.workloads`)."""
    api: str = field(default="auto", metadata=_option(
        "--api", "auto: chat API for chat messages, completions API for plain prompts", choices=API_CHOICES))
    max_tokens: int = field(default=128, metadata=_option("--max-tokens", "output tokens per request"))
    fixed_length: bool = field(default=True, metadata=_option(
        "--no-fixed-length", "let requests stop at EOS (default: ignore_eos, exactly --max-tokens each)"))
    """Every request generates exactly `max_tokens` (ignore_eos), so runs compare equal work."""
    temperature: float = field(default=1.0, metadata=_option(
        "--temperature", "sampling temperature (default 1, vLLM's own when a request sets none; 0: greedy)"))
    """What users send: vLLM's default. Greedy output forced to a fixed length loops on many models, and a
    loop is what drafts predict best (see `loadtest.measurement.content`): measure greedy on purpose, not by default."""
    request_timeout_s: float = field(default=300.0, metadata=_option(
        "--request-timeout", "seconds before a request counts as failed"))
    arrival_gap_s: float = field(default=0.05, metadata=_option(
        "--arrival-gap", "seconds between the users' first requests, in Locust and vLLM's benchmark alike "
                         "(0: all at once)", metavar="S"))
    """Seconds between the users' first requests, in Locust and in vLLM's benchmark alike
    (`--request-rate 1/gap --burstiness inf`, far above what the server completes, so the loop
    stays closed after the first C). Fixed-length requests started together stay in lockstep:
    without speculation all C finish in one step and come back together, and where those waves
    fall would move TTFT from run to run more than anything measured."""

    def as_options(self) -> list[str]:
        """The command-line options that `add_cli_args` reads back into these settings."""
        args: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool):
                if value != f.default:  # a bool's flag turns its default off
                    args.append(option(f).flag)
            else:
                args += [option(f).flag, str(value)]
        return args

    @classmethod
    def from_cli_args(cls, opts: argparse.Namespace, only: Collection[str] | None = None,
                      **changes: Any) -> RequestSettings:
        """The settings parsed by `add_cli_args` (or those in `only`); the others keep their defaults."""
        known = {f.name: getattr(opts, f.name) for f in fields(cls)  # None: not given, nor defaulted
                 if getattr(opts, f.name, None) is not None and (only is None or f.name in only)}
        return cls(**{**known, **changes})

    @classmethod
    def add_cli_args(cls, parser: Any, only: Collection[str] | None = None, skip: Collection[str] = (),
                     defaults: Mapping[str, Any] | None = None, helps: Mapping[str, str] | None = None,
                     from_config: Collection[str] = (), several_temperatures: bool = False) -> None:
        """Register an option for each field (or those in `only`, less `skip`) on an argparse-like
        parser (Locust's configargparse too); `defaults`/`helps` replace a field's. `from_config`:
        fields (of a config's `traffic` section) whose options default to None, so that
        `loadtest.traffic.declared.chosen` takes the config's value for each option not given.
        `several_temperatures`: --temperature takes a list (T,T), default None, its help (in `helps`)
        saying whose default it is."""
        defaults, helps = defaults or {}, helps or {}
        for f in fields(cls):
            if (only is not None and f.name not in only) or f.name in skip:
                continue
            text = helps.get(f.name, option(f).help)
            if f.name == "temperature" and several_temperatures:
                parser.add_argument(option(f).flag, dest=f.name, type=temperature_list, default=None,
                                    metavar="T,T", help=text)
            elif f.name in from_config:
                _add_from_config(parser, f, text)
            else:
                _add_with_default(parser, f, defaults.get(f.name, f.default), text)


def _add_from_config(parser: Any, f: Field, text: str) -> None:
    """A field's option whose default is the config's `traffic` section (None here)."""
    from loadtest.traffic.declared import add_fixed_length_flags

    if f.name == "fixed_length":
        add_fixed_length_flags(parser)
    else:
        parser.add_argument(option(f).flag, dest=f.name, type=type(f.default), default=None,
                            help=f"{text} (default: the config's traffic.{f.name})", **option(f).argparse)


def _add_with_default(parser: Any, f: Field, default: Any, text: str) -> None:
    """A field's option with its own default (a bool's flag turns the default off)."""
    opt = option(f)
    if isinstance(f.default, bool):
        parser.add_argument(opt.flag, dest=f.name, action="store_false" if f.default else "store_true", help=text)
    else:
        parser.add_argument(opt.flag, dest=f.name, type=type(f.default), default=default,
                            help=f"{text} (default: %(default)s)", **opt.argparse)


OVERRIDE_FIELDS = ("overrides", "alternatives")
"""Settings fields holding config overrides (`deploy.config.Override`), alone or in (name, overrides)
pairs: result files keep them as written (`--set`'s text)."""


def settings_record(settings: Any) -> dict[str, Any]:
    """A command's settings dataclass as its result files keep them: flat (the request settings
    beside the command's own, as readers of older reports expect), paths and config overrides as text."""
    flat = asdict(settings)
    flat.update({name: overrides_as_text(getattr(settings, name)) for name in OVERRIDE_FIELDS if name in flat})
    flat.update(flat.pop("request", {}))
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in flat.items()}
