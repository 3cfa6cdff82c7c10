"""`python -m deploy reference` (`make docs`): the generated parts of the documentation.

- docs/configuration.md, from the config schema's own field docs (deploy/config.py declares each
  field with a docstring), the drafter registry (plugins/drafters.py) and configs/default.yaml;
- README.md's command table, from `make help`, between the BEGIN and END marker lines.

Both are regenerated, never edited, so the docs cannot drift from the schema or the Makefile;
`check()` (`make docs CHECK=1`, and tests/test_docs.py) says which file is stale.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo

import deploy.config as config_module
from deploy.config import DeploymentConfig
from deploy.vllm_args import known_args
from plugins.drafters import DRAFTERS

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DOC = Path("docs/configuration.md")
README = Path("README.md")
EXAMPLE = Path("configs/default.yaml")
BEGIN = "<!-- commands: generated from make help by python -m deploy reference; do not edit -->"
END = "<!-- end commands -->"
STALE_HINT = "run `make docs`"


class DocsError(RuntimeError):
    """The docs cannot be generated (an undocumented field, README markers missing, make failing)."""


# --- the configuration reference ---------------------------------------------------------------

def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def undocumented_fields(model: type[BaseModel] = DeploymentConfig, prefix: str = "") -> list[str]:
    """Dotted paths of schema fields without a docstring (the reference would show them blank)."""
    missing = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        if not (info.description or "").strip():
            missing.append(path)
        if _is_section(info.annotation):
            missing += undocumented_fields(info.annotation, f"{path}.")
    return missing


def sections(model: type[BaseModel] = DeploymentConfig, prefix: str = "",
             intro: str = "") -> list[tuple[str, type[BaseModel], str]]:
    """(dotted path, model, intro) of the schema's sections in declaration order, nested ones after
    their parent. The intro is the section class's docstring, else its field's docstring."""
    found = [(prefix, model, " ".join((model.__doc__ or intro).split()))]
    for name, info in model.model_fields.items():
        if _is_section(info.annotation):
            found += sections(info.annotation, f"{prefix}.{name}" if prefix else name, info.description or "")
    return found


def type_text(annotation: Any) -> str:
    """A field's type as a reader writes it: `int | None`, `"greedy" | "probabilistic"`, `list[float]`."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is type(None):
        return "None"
    if annotation is Any:
        return "any"
    if origin is Literal:
        return " | ".join(json.dumps(value) for value in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_text(arg) for arg in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_text(arg) for arg in args)}]"
    return getattr(annotation, "__name__", str(annotation))


BOUNDS = ((Ge, "ge", "≥"), (Gt, "gt", ">"), (Le, "le", "≤"), (Lt, "lt", "<"))
"""annotated_types bound, its attribute, and the sign the reference shows."""


def constraint_text(info: FieldInfo) -> list[str]:
    """The field's declared bounds (`ge=1` -> `≥ 1`), length limits and pattern."""
    shown = []
    for item in info.metadata:
        bound = next(((attr, sign) for kind, attr, sign in BOUNDS if isinstance(item, kind)), None)
        if bound:
            shown.append(f"{bound[1]} {getattr(item, bound[0])}")
        elif isinstance(item, MinLen):
            shown.append(f"at least {item.min_length} item{'s' if item.min_length != 1 else ''}")
        elif isinstance(item, MaxLen):
            shown.append(f"at most {item.max_length} items")
        elif getattr(item, "pattern", None):
            shown.append(f"matches `{item.pattern}`")
    return shown


def yaml_value(value: Any) -> str:
    """A value as it is written in a config file (`null`, `true`, `[0.0]`, `127.0.0.1`)."""
    if isinstance(value, BaseModel):
        value = value.model_dump()
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, sort_keys=False).strip()
    return text.removesuffix("\n...").strip()


def default_text(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if _is_section(info.annotation):
        return "see its section"
    value = info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]
    return f"`{yaml_value(value)}`"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _cell(text: str) -> str:
    """One table cell: one line, `|` escaped (GitHub needs it inside code spans too), `<` outside
    code spans escaped so `<config>` is not taken for HTML."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;") for i, part in enumerate(parts))


def _field_rows(model: type[BaseModel], path: str) -> list[str]:
    rows = ["| field | type | default | description |", "|---|---|---|---|"]
    for name, info in model.model_fields.items():
        dotted = f"{path}.{name}" if path else name
        if _is_section(info.annotation):
            kind = f"section, see [`{dotted}`](#{_anchor(dotted)})"
        else:
            kind = " ".join([f"`{type_text(info.annotation)}`", ", ".join(constraint_text(info))]).strip()
        rows.append(f"| `{name}` | {_cell(kind)} | {_cell(default_text(info))} | {_cell(info.description or '')} |")
    return rows


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _drafter_rows() -> list[str]:
    rows = ["| drafter | vLLM's method (`implementation: native`) | specdeploy's plugin | draft model "
            "(`speculation.model`) | sampled drafts (`draft_sampling: probabilistic`) | defaults |",
            "|---|---|---|---|---|---|"]
    for d in DRAFTERS.values():
        defaults = [f"plugin `{k}: {yaml_value(v)}`" for k, v in d.options.items()]
        defaults += [f"speculative_config `{k}: {yaml_value(v)}`" for k, v in d.speculative_defaults.items()]
        if d.name == "bigram":
            defaults.append("(set in [`speculation.bigram`](#speculationbigram))")
        rows.append(f"| `{d.name}` | {f'`{d.vllm_method}`' if d.vllm_method else '-'} | "
                    f"{f'`{d.plugin_class}`' if d.plugin_class else '-'} | {_yes(d.takes_model)} | "
                    f"{_yes(d.samples_drafts)} | {', '.join(defaults) or '-'} |")
    return rows


# What vLLM calls each field the kit does not pass under vLLM's own name (engine arguments the typed
# fields own come from config.OWNED_ENGINE_ARGS). Every field of `speculation` must be here: a reader
# of vLLM's docs should find each of its speculative_config keys, and a new field without its vLLM
# name fails `make docs`.
VLLM_NAMES = {
    "speculation.drafter": "`speculative_config.method`: `small_model` is `draft_model` (native) or `custom_class` "
                           "(plugin), `bigram` and `probe` are `custom_class`, the others their own name; `none`: no "
                           "`--speculative-config`",
    "speculation.model": "`speculative_config.model` (for `custom_class`: the plugin's class; the draft then travels in "
                         "`--additional-config`)",
    "speculation.implementation": "chooses `speculative_config.method` for `small_model` (`draft_model` or "
                                  "`custom_class`)",
    "speculation.num_speculative_tokens": "`speculative_config.num_speculative_tokens`",
    "speculation.schedule": "`speculative_config.num_speculative_tokens_per_batch_size`; for the plugin drafters "
                            "`--additional-config` `schedule` (vLLM gives custom proposers none)",
    "speculation.draft_tensor_parallel_size": "`speculative_config.draft_tensor_parallel_size`",
    "speculation.prompt_lookup_min": "`speculative_config.prompt_lookup_min`",
    "speculation.prompt_lookup_max": "`speculative_config.prompt_lookup_max`",
    "speculation.draft_sampling": "`speculative_config.draft_sample_method` (not passed when `greedy`, vLLM's default)",
    "speculation.temperatures": "none: the kit's own (what `make tune` averages acceptance over, what `make loadtest` "
                                "notes as unmeasured)",
    "speculation.draft_max_temperature": "`--additional-config` `draft_max_temperature` (the plugin reads it)",
    "speculation.bigram": "`--additional-config` (the bigram plugin's options; `table` as an absolute path)",
    "speculation.extra": "`speculative_config.<key>` as written",
    "speculation.bigram.table": "`--additional-config` `table`",
    "speculation.bigram.context_weight": "`--additional-config` `context_weight`",
    "speculation.bigram.min_probability": "`--additional-config` `min_probability`",
    "speculation.bigram.max_batch_size": "`--additional-config` `max_batch_size`",
    "resources.cpu_kvcache_space_gib": "`--kv-cache-memory-bytes` (GiB x 2^30, exact); vLLM's older "
                                       "`VLLM_CPU_KVCACHE_SPACE` sets the same field in whole GiB and is refused in `env`",
    "resources.device": "`VLLM_TARGET_DEVICE=cpu` on a CPU",
    "resources.cpu_preload_iomp": "`LD_PRELOAD` of Intel's OpenMP",
    "server.api_key_env": "`VLLM_API_KEY` in the server's environment (never `--api-key` on the command line)",
    "server.keep_alive_timeout_s": "`VLLM_HTTP_TIMEOUT_KEEP_ALIVE`",
    "parallelism.nodes": "`--nnodes` (with `mp`), `--node-rank`, `--headless` on the other nodes",
    "parallelism.master_addr": "`--master-addr`",
    "parallelism.master_port": "`--master-port`",
}


def _speculation_fields(model: type[BaseModel] = DeploymentConfig, prefix: str = "") -> list[str]:
    found = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        if path.startswith("speculation."):
            found.append(path)
        if _is_section(info.annotation):
            found += _speculation_fields(info.annotation, f"{path}.")
    return found


def _vllm_name_rows() -> list[str]:
    missing = [f for f in _speculation_fields() if f not in VLLM_NAMES]
    if missing:
        raise DocsError(f"speculation fields without their vLLM name in deploy/reference.py VLLM_NAMES: "
                        f"{', '.join(missing)}")
    names = dict(VLLM_NAMES)
    for arg, field_text in config_module.OWNED_ENGINE_ARGS.items():
        path = field_text.split(" ")[0]
        if path.count(".") == 1 and path not in names and arg in known_args():
            names[path] = f"`{known_args()[arg].flag}`"
    rows = ["| field | vLLM's name |", "|---|---|"]
    return rows + [f"| `{path}` | {_cell(text)} |" for path, text in sorted(names.items())]


def configuration_reference(root: Path = ROOT) -> str:
    """docs/configuration.md, from the schema as it is loaded now."""
    missing = undocumented_fields()
    if missing:
        raise DocsError(f"config fields without a docstring in deploy/config.py: {', '.join(missing)}; "
                        f"document each where it is declared")
    module_doc = (config_module.__doc__ or "").strip().split("\n\n")
    lines = [
        "<!-- generated by `python -m deploy reference` (make docs) from deploy/config.py; do not edit -->",
        "# Configuration reference", "",
        " ".join(module_doc[0].split()), "",
        "A config is one YAML file, given as `CONFIG=` a path or a preset name under `configs/`. "
        "`SET='section.field=value ...'` overrides fields from the command line, and `NO_SPEC=1` turns "
        "speculation off. Types are Python's: `None` is YAML's `null` (or the key left out). "
        "Unknown keys, wrong types and values out of range are refused with the field's path.", "",
        "Sections:", "",
    ]
    found = sections()
    for path, _, _ in found[1:]:
        lines.append(f"- [`{path}`](#{_anchor(path)})")
    lines += ["- [Drafters](#drafters)", "- [vLLM's names](#vllms-names)", "- [Example](#example)", ""]
    for path, model, intro in found:
        lines += [f"## `{path}`" if path else "## Top level", ""]
        if intro and path:
            lines += [intro, ""]
        lines += [*_field_rows(model, path), ""]
    lines += [
        "## Drafters", "",
        "What each [`speculation.drafter`](#speculation) runs: vLLM's speculative method or specdeploy's "
        "plugin (where it has both, `speculation.implementation` picks one), whether it needs a draft "
        "checkpoint in `speculation.model`, whether its drafts can be sampled "
        "(`speculation.draft_sampling: probabilistic`), and the defaults specdeploy gives it: the plugin's "
        "options, and fields of vLLM's speculative_config the config does not set (plugins/drafters.py).", "",
        *_drafter_rows(), "",
        "## vLLM's names", "",
        "Where each field reaches vLLM 0.32 when it is not under its own name (`make serve DRY_RUN=1` prints the "
        "whole command): a flag of `vllm serve`, a key of `--speculative-config` (speculative_config), of "
        "`--additional-config` (read by specdeploy's plugins), or an environment variable of the server. "
        "Fields not listed are passed as `--<field-name>`, or are the kit's own.", "",
        *_vllm_name_rows(), "",
        "One flag comes from no field: every server with speculation, `make serve`'s as much as a load "
        "test's, starts with `--per-request-spec-decode-metrics summary`, so that each response carries its "
        "own draft counts (the content check gives acceptance over the outputs that do not loop with them). "
        "It changes nothing the engine computes: with and without it, the same requests draft and accept the "
        "same tokens at the same speed (results.md R52). `engine_args.per_request_spec_decode_metrics: none` "
        "turns it off.", "",
        "## Example", "",
        f"`{EXAMPLE.as_posix()}`, the embedded default:", "",
        "```yaml", (root / EXAMPLE).read_text().rstrip("\n"), "```", "",
    ]
    return "\n".join(lines)


# --- the README's command table, from `make help` ------------------------------------------------

@dataclass
class Help:
    commands: list[tuple[str, str]] = field(default_factory=list)
    """(usage line, description) of each `make ...` or `python -m ...` entry, in order."""
    variables: list[tuple[str, str]] = field(default_factory=list)
    """(`NAME=value`, meaning) of the variables section."""


def make_help(root: Path = ROOT) -> str:
    """`make help`'s output. Run in a clean make environment, so a `make docs` that calls this gets
    the same text as a user typing `make help`."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    try:
        done = subprocess.run(["make", "-s", "--no-print-directory", "help"], cwd=root, env=env,
                              capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise DocsError("`make` is not installed: the command table is read from `make help`") from None
    if done.returncode:
        raise DocsError(f"`make help` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


COMMAND_LINE = re.compile(r"(make|python -m) \S")
VARIABLE_LINE = re.compile(r"  (\S(?:.*?\S)?) {2,}(\S.*)")


def parse_help(text: str) -> Help:
    """Commands start at column 0 with `make ` or `python -m `, their description follows indented;
    after a `Variables:` line, each line is `  NAME=value   meaning`. Lines before the first
    command are the help's heading. Anything else is an error, so the format cannot drift unseen."""
    parsed, mode = Help(), "heading"
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.strip() == "Variables:":
            mode = "variables"
        elif mode != "variables" and COMMAND_LINE.match(line):
            parsed.commands.append((line.strip(), ""))
            mode = "command"
        elif mode == "command" and line.startswith(" "):
            usage, description = parsed.commands[-1]
            parsed.commands[-1] = (usage, f"{description} {line.strip()}".strip())
        elif mode == "variables" and (match := VARIABLE_LINE.fullmatch(line)):
            parsed.variables.append((match[1], match[2].strip()))
        elif mode != "heading":
            raise DocsError(f"make help, line {number}: cannot read {line!r} (a command starts with `make ` "
                            f"at column 0, its description is indented; variables are `  NAME=value   meaning`)")
    if not parsed.commands:
        raise DocsError("make help lists no commands")
    return parsed


VARIABLE = re.compile(r"\b([A-Z][A-Z0-9_]*)=")
# Spans kept whole as code: commands, and variable settings whose quoted value holds spaces.
CODE_PHRASE = re.compile(r"(\bpython -m [\w.]+(?: [a-z][\w-]*)?|\bmake [a-z][\w-]*|\b[A-Z][A-Z0-9_]*='[^']*')")


def _help_markdown(text: str, variables: set[str]) -> str:
    """A help description as Markdown: commands, paths, settings and variable names as code."""
    out = []
    for i, part in enumerate(CODE_PHRASE.split(text)):
        if i % 2:
            out.append(f"`{part}`")
            continue
        words = []
        for word in re.split(r"(\s+)", part):
            match = re.fullmatch(r"(\(?)(.*?)([),;:.]*)", word)
            lead, core, tail = match.groups() if match else ("", word, "")
            if core and (core in variables or re.search(r"[/<>=_$]|\w\.\w|^\.\w", core)):
                word = f"{lead}`{core}`{tail}"
            words.append(word)
        out.append("".join(words))
    return _cell("".join(out))


def commands_block(parsed: Help) -> str:
    """The README's block: a table of the commands and one of the shared variables."""
    names = {m for usage, _ in parsed.commands for m in VARIABLE.findall(usage)}
    names |= {m for usage, _ in parsed.variables for m in VARIABLE.findall(usage)}
    lines = [BEGIN, "| command | what it does |", "|---|---|"]
    lines += [f"| {_cell(f'`{usage}`')} | {_help_markdown(text, names)} |" for usage, text in parsed.commands]
    if parsed.variables:
        lines += ["", "| variable | meaning |", "|---|---|"]
        lines += [f"| {_cell(f'`{usage}`')} | {_help_markdown(text, names)} |" for usage, text in parsed.variables]
    return "\n".join([*lines, END])


def readme_with_commands(readme: str, block: str) -> str:
    """README text with the lines from BEGIN to END (both included) replaced by `block`."""
    lines = readme.split("\n")
    starts = [i for i, line in enumerate(lines) if line.strip() == BEGIN]
    ends = [i for i, line in enumerate(lines) if line.strip() == END]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise DocsError(f"{README} needs the command table's marker lines, once each and in this order, "
                        f"where the table goes:\n  {BEGIN}\n  {END}")
    return "\n".join([*lines[:starts[0]], block, *lines[ends[0] + 1:]])


# --- writing and checking -----------------------------------------------------------------------

def expected(root: Path = ROOT) -> dict[Path, str]:
    """Each generated file's path (relative to root) and the text it should have."""
    block = commands_block(parse_help(make_help(root)))
    return {CONFIG_DOC: configuration_reference(root),
            README: readme_with_commands((root / README).read_text(), block)}


def check(root: Path = ROOT) -> list[str]:
    """One message per generated file that differs from what `make docs` would write."""
    return [f"{path} is stale: {STALE_HINT}" for path, text in expected(root).items()
            if not (root / path).is_file() or (root / path).read_text() != text]


def write(root: Path = ROOT) -> list[str]:
    """Write the generated files that changed; one line per file saying what happened."""
    said = []
    for path, text in expected(root).items():
        target = root / path
        if target.is_file() and target.read_text() == text:
            said.append(f"{path} is current")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        said.append(f"wrote {path}")
    return said
