"""`make check` asks the hub whether this machine can download a config's models: over real HTTP,
against a small local server standing in for the hub (HF_ENDPOINT), and against no server at all."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from deploy import hub_access
from deploy.config import load_config
from deploy.launcher import free_port

ROOT = Path(__file__).resolve().parent.parent
GOOD_TOKEN = "hf_good"


class FakeHub(BaseHTTPRequestHandler):
    """public/*: anyone; gated/*: a token whose account accepted the licence (GOOD_TOKEN); else 404."""

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        token = self.headers.get("Authorization", "").removeprefix("Bearer ")
        if self.path.startswith("/public/"):
            self.send_response(200)
        elif self.path.startswith("/gated/"):
            status = 200 if token == GOOD_TOKEN else 401 if not token else 403
            self.send_response(status)
            if status != 200:
                self.send_header("X-Error-Code", "GatedRepo")
        else:
            self.send_response(404)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def hub(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_TOKEN_PATH", "/nonexistent/token")  # no saved login of this machine's user
    yield server
    server.shutdown()


def test_each_answer_of_the_hub_is_one_line_naming_the_repository_and_the_fix(hub, monkeypatch):
    assert hub_access.check_repo("public/model").status == "ok"
    missing = hub_access.check_repo("gated/llama")
    assert missing.status == "no_token" and missing.problem
    assert "gated/llama" in missing.message and "export HF_TOKEN=" in missing.message and "\n" not in missing.message
    monkeypatch.setenv("HF_TOKEN", "hf_other")
    denied = hub_access.check_repo("gated/llama")
    assert denied.status == "denied" and "licence not accepted" in denied.message and "/gated/llama" in denied.message
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    assert hub_access.check_repo("gated/llama").status == "ok"
    gone = hub_access.check_repo("nobody/nothing")
    assert gone.status == "not_found" and "check the name" in gone.message


def test_no_hub_is_said_in_one_line_quickly(monkeypatch):
    port = free_port()  # nothing listens there
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    config = load_config("llama70b-7b.yaml")
    began = time.monotonic()
    found = hub_access.check_config(config)
    assert time.monotonic() - began < hub_access.TIMEOUT_S + 2
    assert [a.repo for a in found] == ["meta-llama/Llama-2-70b-chat-hf", "meta-llama/Llama-2-7b-chat-hf"]
    assert all(a.status == "unchecked" and not a.problem for a in found)
    assert "cannot reach the hub" in found[0].message and "\n" not in found[0].message
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE" in hub_access.check_repo("gated/llama").message


def test_local_and_embedded_models_are_not_asked_about():
    assert hub_access.hub_repos(load_config("default.yaml")) == []


def test_make_check_fails_on_a_gated_model_without_a_token(hub, tmp_path):
    """`python -m deploy check` on a CPU config whose target is a gated hub id, with no token: exit 1
    and the one-line error (the model is not in any cache here, so preflight itself has nothing else)."""
    config = tmp_path / "gated.yaml"
    config.write_text("name: gated\ntarget:\n  model: gated/llama\nresources:\n  device: cpu\n")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{hub.server_port}", HF_TOKEN_PATH="/nonexistent/token")
    done = subprocess.run([sys.executable, "-m", "deploy", "check", str(config)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "error: gated/llama is gated or private and no Hugging Face token is set: export HF_TOKEN=" in done.stdout


def test_the_first_start_of_a_hub_preset_is_planned_and_a_local_one_has_nothing_to_download():
    from deploy import plan_from_config
    from deploy.footprint import first_start_lines

    resolved, _ = plan_from_config("llama70b-7b.yaml", [], False, True, plan_only=True)
    weights, first, gpus, nvlink = first_start_lines(resolved)
    assert weights.startswith("weights: meta-llama/Llama-2-70b-chat-hf about 140 GB; meta-llama/Llama-2-7b-chat-hf "
                              "about 14 GB: about 154 GB of disk, downloaded on the first start into the Hugging Face "
                              "cache")
    assert "server.startup_timeout_s (900 s) counts the whole start" in first and "hf download" in first
    assert "R580" in gpus and "NVLink" in nvlink
    small, _ = plan_from_config("qwen3-4b-0.6b.yaml", ["resources.device=cuda"], False, True, plan_only=True)
    assert "enough for a first start at 1 Gbit/s" in first_start_lines(small)[1]
    local, _ = plan_from_config("default.yaml", [], False, True, plan_only=True)
    assert first_start_lines(local) == []
