"""Which traffic a measurement sends, and the line that says so.

A config declares the traffic its model is measured with (`traffic:` in deploy/config.py: the
workload, the API, fixed or natural output lengths, the temperature). `make loadtest`, `capacity`,
`advise` and `tune` send it; an option given on their command line replaces that one field. The
plan, the report's first line and the terminal say which traffic ran and where it came from.
"""

from __future__ import annotations

import argparse
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from deploy.config import Override, TrafficConfig, load_config
from loadtest.traffic.workloads import Workload, load_workload, split_spec, uses_chat

# RequestSettings fields a config's `traffic` section sets (`fixed_length` is its `lengths`).
TRAFFIC_FIELDS = ("workload", "api", "max_tokens", "fixed_length", "temperature")

FIXED_CAVEAT = ("fixed lengths (ignore_eos) keep a chat model writing past its answer, where drafts predict its "
                "text unusually well: speedups can read higher than on the answers users get (natural lengths: "
                "traffic.lengths: natural, or --no-fixed-length)")


def declared(config: str, overrides: Sequence[Override | str] = ()) -> tuple[TrafficConfig, str]:
    """The config's traffic section and where it came from (the kit's defaults without a config).
    Raises ConfigError for a config that does not validate."""
    if not config:
        return TrafficConfig(), "the kit's defaults (no config given)"
    return load_config(config, list(overrides)).traffic, f"{Path(config).name}'s traffic section"


def chosen(opts: argparse.Namespace, traffic: TrafficConfig, only: Collection[str] = TRAFFIC_FIELDS) -> dict[str, Any]:
    """RequestSettings values for the traffic fields in `only`: each option given on the command line
    (not None), else the config's. A workload given without --api takes `auto`: the API follows
    the prompts (chat messages to the chat API), not the config's API for its own workload."""
    values = {}
    for name in only:
        given = getattr(opts, name, None)
        if given is not None:
            values[name] = given
        elif name == "api" and getattr(opts, "workload", None) is not None:
            values[name] = "auto"
        else:
            values[name] = traffic.fixed_length if name == "fixed_length" else getattr(traffic, name)
    return values


def given_options(opts: argparse.Namespace, only: Collection[str] = TRAFFIC_FIELDS) -> list[str]:
    """The traffic fields set on the command line."""
    return [name for name in only if getattr(opts, name, None) is not None]


def add_fixed_length_flags(parser: Any) -> None:
    """--fixed-length / --no-fixed-length, neither given: the config's `traffic.lengths`."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--fixed-length", dest="fixed_length", action="store_const", const=True, default=None,
                       help="exactly --max-tokens output tokens per request (ignore_eos) (default: the config's "
                            "traffic.lengths)")
    group.add_argument("--no-fixed-length", dest="fixed_length", action="store_const", const=False,
                       help="let each request end at the model's end of text, at most --max-tokens")


def _apis(items: Workload | None, api: str) -> list[str]:
    """The APIs the requests go to: `chat`, `completions` or both (a mixed set with api auto)."""
    if api != "auto":
        return [api]
    if items is None:
        return ["auto"]  # the measurement itself reports an unreadable workload
    kinds = {uses_chat(item, "auto") for item in items.items}
    return [name for name, chat in (("chat", True), ("completions", False)) if chat in kinds]


def _readable(workload: str) -> Workload | None:
    """The workload, or None where it cannot be read (the measurement itself reports why)."""
    try:
        return load_workload(workload)
    except (ValueError, OSError):
        return None


def origin(source: str, given: Sequence[str] = ()) -> str:
    """Where the traffic came from: the config's section, and the options that replaced its fields."""
    flags = ", ".join(_flag(g) for g in given)
    return "; ".join(x for x in (source, f"from the command line: {flags}" if flags else "") if x)


def describe(request: Any, source: str | None = None) -> list[str]:
    """`traffic: ...` (what every request looks like, and from where), and the fixed-length caveat
    where chat prompts are forced to a length. `request` is a RequestSettings or a report's flat
    settings record (which keeps `traffic_source`)."""
    get = request.get if isinstance(request, dict) else (lambda k, d=None: getattr(request, k, d))
    workload, api = get("workload", "code"), get("api", "auto")
    items = _readable(workload)  # read once: the APIs its prompts take, their categories
    apis = _apis(items, api)
    name = split_spec(workload)[0]
    prompts = {"code": "code-completion prompts", "chat": "chat prompts", "edit": "copy/edit prompts",
               "mixed": "mixed prompts (code, chat, edit)", "categories": "the kit's category prompts"}.get(
        name, f"prompts of {Path(name).name}")
    if items and items.categories:
        prompts += f" in {len(items.categories)} categories ({', '.join(items.categories)})"
    through = " and ".join({"chat": "the chat API (/v1/chat/completions)",
                            "completions": "the completions API (/v1/completions)",
                            "auto": "the API their form picks"}[a] for a in apis)
    tokens = get("max_tokens")
    lengths = (f"fixed lengths ({tokens} output tokens each, ignore_eos)" if get("fixed_length", True) else
               f"natural lengths (each ends at the model's end of text, at most {tokens} tokens)")
    temperature = get("temperature")
    temp = f"temperature {temperature:g}" if isinstance(temperature, (int, float)) else f"temperature {temperature}"
    where = source if source is not None else str(get("traffic_source", "") or "")
    lines = [f"traffic: {prompts} through {through}, {lengths}, {temp}" + (f" ({where})" if where else "")]
    if get("fixed_length", True) and ("chat" in apis or workload in ("chat", "mixed")):
        lines.append(f"caveat: {FIXED_CAVEAT}")
    return lines


def _flag(field: str) -> str:
    return {"fixed_length": "--fixed-length/--no-fixed-length", "max_tokens": "--max-tokens"}.get(
        field, f"--{field.replace('_', '-')}")

