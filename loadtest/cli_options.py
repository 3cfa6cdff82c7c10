"""Command-line options declared once, beside the settings they fill.

A settings class (`loadtest.sweeps.settings.SweepSettings`, `loadtest.sweeps.capacity.CapacitySettings`)
keeps a table of its options: the flag, its argparse keywords, its help. Every command that takes
one of them registers it from that table (`add_cli_options`), choosing which (`only`, `skip`) and
where a command words it its own way (`helps`, `defaults`, `required`); the table's order is the
order `--help` lists them in.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class CliOption:
    flags: tuple[str, ...]
    """`("--set",)`, or a positional's name (`("config",)`)."""
    help: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """argparse's keywords besides the help (type, default, action, metavar, dest, ...)."""
    field: str = ""
    """The settings field it fills (default: the option's own name, its dest)."""
    value: Callable[[Any], Any] = _same
    """The field's value from the parsed one (a `--no-x` flag: `not`)."""
    group: str = ""
    """Title of the argument group `--help` lists it under ("" : the parser's own options)."""
    exclusive: str = ""
    """Options with the same name here are one-or-the-other (a mutually exclusive group)."""


def add_cli_options(parser: Any, options: Mapping[str, CliOption], only: Collection[str] | None = None,
                    skip: Collection[str] = (), helps: Mapping[str, str] | None = None,
                    defaults: Mapping[str, Any] | None = None, required: Collection[str] = (),
                    expand: Mapping[str, Callable[[Any], None]] | None = None) -> None:
    """Register `options` (those in `only`, less `skip`; table order) on an argparse parser or group.
    `helps`/`defaults` replace an option's; `required`: options that must be given. `expand`: entries
    registered by a function of the container instead (another settings class's options)."""
    helps, defaults, expand = helps or {}, defaults or {}, expand or {}
    groups: dict[str, Any] = {}
    for name, option in options.items():
        if (only is not None and name not in only) or name in skip:
            continue
        if name in expand:
            expand[name](parser)
            continue
        where = parser
        if option.group:
            where = _container(groups, option.group, lambda: parser.add_argument_group(option.group))
        if option.exclusive:
            where = _container(groups, f"exclusive:{option.exclusive}", where.add_mutually_exclusive_group)
        kwargs = {**option.kwargs, "help": helps.get(name, option.help)}
        if name in defaults:
            kwargs["default"] = defaults[name]
        if name in required:
            kwargs["required"] = True
        where.add_argument(*option.flags, **kwargs)


def _container(groups: dict[str, Any], key: str, make: Callable[[], Any]) -> Any:
    """The group made for `key` in this call, made on first use."""
    if key not in groups:
        groups[key] = make()
    return groups[key]


def cli_values(options: Mapping[str, CliOption], opts: Any) -> dict[str, Any]:
    """The settings fields of the options `opts` has (parsed by `add_cli_options`), by field name."""
    return {option.field or name: option.value(getattr(opts, name))
            for name, option in options.items() if option.flags and hasattr(opts, name)}
