"""The argument list of vLLM's OpenAI-compatible server, as a snapshot.

Configs may pass extra engine arguments through to vLLM; they are checked against this
list before anything starts. The list is a snapshot of the pinned vLLM version so that
validation (and `DRY_RUN=1`) works at once, without importing vLLM (which takes a while)
and on machines where vLLM is not installed. `tests/test_vllm_args.py` checks the snapshot
against the installed vLLM; refresh it with `python -m deploy.vllm_args --refresh`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

SNAPSHOT = Path(__file__).with_name("vllm_args.json")


@dataclass(frozen=True)
class VllmArg:
    dest: str
    """Python name of the argument (`max_model_len`)."""
    flag: str
    """The long option that sets it (`--max-model-len`)."""
    kind: str
    """`bool` (a flag with a `--no-` form), `store_true`, `json` (dict/config), `list` or `value`."""


def read_live_parser() -> dict[str, VllmArg]:
    """Introspect the installed vLLM's server argument parser (slow: imports vLLM)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    args: dict[str, VllmArg] = {}
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--") and not s.startswith("--no-")]
        if not longs or action.dest == "help":
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            kind = "bool"
        elif isinstance(action, argparse._StoreTrueAction):
            kind = "store_true"
        elif action.nargs in ("+", "*"):
            kind = "list"
        elif action.dest.endswith("_config") or action.dest in ("hf_overrides", "additional_config"):
            kind = "json"
        else:
            kind = "value"
        # Prefer the dashed spelling vLLM documents.
        flag = next((s for s in longs if "_" not in s), longs[0])
        args.setdefault(action.dest, VllmArg(action.dest, flag, kind))
    return args


@lru_cache(maxsize=1)
def known_args() -> dict[str, VllmArg]:
    """The snapshot, keyed by dest."""
    data = json.loads(SNAPSHOT.read_text())
    return {d: VllmArg(d, **v) for d, v in data["args"].items()}


def snapshot_version() -> str:
    return json.loads(SNAPSHOT.read_text())["vllm_version"]


@lru_cache(maxsize=1)
def speculative_config_fields() -> frozenset[str]:
    """Field names of vLLM's SpeculativeConfig (what `--speculative-config` accepts)."""
    return frozenset(json.loads(SNAPSHOT.read_text())["speculative_config_fields"])


def read_live_speculative_fields() -> frozenset[str]:
    import dataclasses

    from vllm.config import SpeculativeConfig

    return frozenset(f.name for f in dataclasses.fields(SpeculativeConfig) if f.init)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refresh", action="store_true", help="rewrite the snapshot from the installed vLLM")
    opts = parser.parse_args()
    if not opts.refresh:
        print(f"{len(known_args())} arguments, vLLM {snapshot_version()} ({SNAPSHOT})")
        return
    import vllm

    live = read_live_parser()
    SNAPSHOT.write_text(json.dumps({
        "vllm_version": vllm.__version__,
        "args": {d: {"flag": a.flag, "kind": a.kind} for d, a in sorted(live.items())},
        "speculative_config_fields": sorted(read_live_speculative_fields()),
    }, indent=1) + "\n")
    print(f"wrote {len(live)} arguments of vLLM {vllm.__version__} to {SNAPSHOT}")


if __name__ == "__main__":
    main()
