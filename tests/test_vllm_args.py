"""The argument snapshot that configs are validated against matches the installed vLLM."""

from __future__ import annotations

import vllm

from deploy.vllm_args import (
    known_args, read_live_parser, read_live_speculative_fields, snapshot_version, speculative_config_fields,
)


def test_snapshot_matches_installed_vllm() -> None:
    assert snapshot_version() == vllm.__version__, "refresh with: python -m deploy.vllm_args --refresh"
    assert known_args() == read_live_parser()
    assert speculative_config_fields() == read_live_speculative_fields()
