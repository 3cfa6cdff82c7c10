"""Each config declares the traffic its model is measured with; the commands send it unless an
option replaces a field, and say which traffic ran (issue 45)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deploy import ConfigError, load_config
from deploy.config import CONFIGS_DIR
from loadtest.traffic import declared as traffic
from loadtest.__main__ import build_parser
from loadtest.traffic.request_settings import RequestSettings
from loadtest.traffic.workloads import request_for, load_workload
from tuning.__main__ import build_parser as tuning_parser

REPO = Path(__file__).resolve().parent.parent
CHAT_PRESETS = ("default", "embedded-bigram", "embedded-small-plugin", "llama70b-7b", "llama70b-1b", "qwen3-4b-0.6b", "smollm2-1.7b-360m", "llama3.1-8b-eagle3")


def test_every_preset_declares_its_traffic_and_the_chat_models_get_chat():
    for path in sorted(CONFIGS_DIR.glob("*.yaml")):
        config = load_config(path)
        assert "traffic" in config.model_fields_set, f"{path.name} declares no traffic"
        t = config.traffic
        if path.stem in CHAT_PRESETS:
            assert (t.workload, t.api, t.lengths) == ("chat", "chat", "natural"), path.name
        else:
            assert (t.workload, t.lengths) == ("code", "fixed"), path.name


def test_the_config_is_the_default_and_each_option_replaces_one_field():
    run = build_parser()
    declared, source = traffic.declared("llama70b-7b.yaml")
    opts = run.parse_args(["run", "llama70b-7b.yaml"])
    values = traffic.chosen(opts, declared)
    assert values == {"workload": "chat", "api": "chat", "max_tokens": 256, "fixed_length": False, "temperature": 0.7}
    assert source == "llama70b-7b.yaml's traffic section" and traffic.given_options(opts) == []
    opts = run.parse_args(["run", "llama70b-7b.yaml", "--fixed-length", "--max-tokens", "64"])
    assert traffic.chosen(opts, declared) == {**values, "fixed_length": True, "max_tokens": 64}
    # A workload given without --api: the prompts pick the API, not the config's API for its own prompts.
    opts = run.parse_args(["run", "llama70b-7b.yaml", "--workload", "code"])
    assert traffic.chosen(opts, declared) == {**values, "workload": "code", "api": "auto"}
    opts = run.parse_args(["run", "embedded-code.yaml", "--no-fixed-length"])
    assert traffic.chosen(opts, traffic.declared("embedded-code.yaml")[0])["fixed_length"] is False
    # advise takes the same fields; tune its workload, API and lengths (its proof keeps its own length).
    adv = tuning_parser().parse_args(["advise", "llama70b-7b.yaml"])
    assert traffic.chosen(adv, declared) == values
    tun = tuning_parser().parse_args(["tune", "llama70b-7b.yaml"])
    assert tun.max_tokens == 64 and tun.workload is None and tun.fixed_length is None


def test_the_chat_traffic_sends_chat_requests_of_natural_length():
    declared, _ = traffic.declared("llama70b-7b.yaml")
    request = RequestSettings(**traffic.chosen(build_parser().parse_args(("run",)), declared))
    path, body = request_for(load_workload(request.workload).items[0], "m", request.max_tokens, request.temperature,
                             request.fixed_length, request.api)
    assert path == "/v1/chat/completions" and "messages" in body and "ignore_eos" not in body
    assert body["max_tokens"] == 256 and body["temperature"] == 0.7


def test_the_traffic_line_and_the_fixed_length_caveat():
    chat = RequestSettings(workload="chat", api="chat", max_tokens=256, fixed_length=False, temperature=0.7)
    (line,) = traffic.describe(chat, "x.yaml's traffic section")
    assert line == ("traffic: chat prompts through the chat API (/v1/chat/completions), natural lengths (each ends "
                    "at the model's end of text, at most 256 tokens), temperature 0.7 (x.yaml's traffic section)")
    fixed = traffic.describe(RequestSettings(workload="chat", fixed_length=True), "")
    assert len(fixed) == 2 and fixed[1].startswith("caveat: fixed lengths (ignore_eos) keep a chat model writing")
    code = traffic.describe(RequestSettings(), "")
    assert code == ["traffic: code-completion prompts through the completions API (/v1/completions), fixed "
                    "lengths (128 output tokens each, ignore_eos), temperature 1"]
    mixed = traffic.describe(RequestSettings(workload="mixed"), "")[0]
    assert "the chat API (/v1/chat/completions) and the completions API (/v1/completions)" in mixed


def test_a_maximum_that_leaves_no_room_for_a_prompt_is_refused():
    with pytest.raises(ConfigError, match=r"traffic.max_tokens 4096 leaves no room for a prompt within "
                                          r"target.max_model_len 4096"):
        load_config("llama70b-7b.yaml", ["traffic.max_tokens=4096"])
    with pytest.raises(ConfigError, match="traffic.lengths"):
        load_config("embedded-code.yaml", ["traffic.lengths=exact"])


def test_the_quick_starts_dry_run_names_chat_traffic():
    """`make loadtest CONFIG=llama70b-7b.yaml USERS=1,32 DRY_RUN=1`, the README's first load test."""
    done = subprocess.run([sys.executable, "-m", "loadtest", "run", "llama70b-7b.yaml", "--users", "1,32", "--dry-run"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1] == ("  traffic: chat prompts through the chat API (/v1/chat/completions), natural lengths (each "
                        "ends at the model's end of text, at most 256 tokens), temperature 0.7 (llama70b-7b.yaml's "
                        "traffic section)")
    assert not any(line.lstrip().startswith("caveat:") for line in lines)
    assert "weights: meta-llama/Llama-2-70b-chat-hf about 140 GB" in done.stdout
    assert "server.startup_timeout_s (900 s) counts the whole start" in done.stdout
    fixed = subprocess.run([sys.executable, "-m", "loadtest", "run", "llama70b-7b.yaml", "--dry-run", "--fixed-length"],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "  caveat: fixed lengths (ignore_eos)" in fixed.stdout


def test_vllms_benchmark_runs_forked_from_one_import_and_a_stuck_run_is_killed(tmp_path: Path, embedded_pair):
    """Each run of vLLM's benchmark is a child of one process that imported it: its own exit code and
    log; one past its time limit is killed (here, on a server that accepts and never answers), and
    the next run still gets its own answer from the same process."""
    import os
    import socket

    from loadtest.traffic.vllm_bench import Forks

    forks = Forks()
    env = dict(os.environ)
    assert forks.run(["--no-such-option"], tmp_path / "bad.log", env, 300) == 2  # argparse's exit
    assert "unrecognized arguments: --no-such-option" in (tmp_path / "bad.log").read_text()
    assert forks.proc is not None
    server = forks.proc.pid
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        args = ["--backend", "vllm", "--base-url", f"http://127.0.0.1:{silent.getsockname()[1]}", "--model", "m",
                "--tokenizer", str(embedded_pair.plumbing_target), "--dataset-name", "random", "--random-input-len",
                "8", "--random-output-len", "4", "--num-prompts", "1", "--ready-check-timeout-sec", "0"]
        assert forks.run(args, tmp_path / "stuck.log", env, 5) is None
    assert forks.run(["--no-such-option"], tmp_path / "again.log", env, 300) == 2
    assert forks.proc.pid == server
    forks.proc.stdin.close()  # the process forking them ends with its input
    assert forks.proc.wait(timeout=60) == 0
