"""The Prometheus scrape config and Grafana dashboard, against a real Prometheus scraping a real
server: every panel's query returns data."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import yaml

from conftest import CODE_PROMPTS, complete
from deploy import free_port
from deploy.config import load_config
from deploy.observability import dashboard_panels, scrape_config

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS = shutil.which("prometheus")


def test_dashboard_and_scrape_config_from_a_config(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "deploy", "observability", "llama70b-7b", "--out", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    dashboard = json.loads((tmp_path / "grafana-dashboard.json").read_text())
    titles = [p["title"] for p in dashboard["panels"]]
    assert {"Acceptance rate", "Acceptance by draft position", "Drafts per second",
            "Output tokens per second", "Time to first token"} <= set(titles)
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert all('model_name="llama70b-7b"' in e for e in exprs)
    scrape = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    [job] = scrape["scrape_configs"]
    assert job["static_configs"] == [{"targets": ["127.0.0.1:8000"]}]
    assert job["authorization"]["type"] == "Bearer"  # the preset keeps /metrics behind its key
    public = yaml.safe_load(scrape_config(load_config("llama70b-7b", ["server.public_metrics=true"]), ["h:1"]))
    assert "authorization" not in public["scrape_configs"][0]
    baseline = [p.title for p in dashboard_panels(load_config("embedded-code", no_speculation=True))]
    assert "Acceptance rate" not in baseline and "Output tokens per second" in baseline


@pytest.mark.engine
def test_every_dashboard_query_returns_data_from_a_real_prometheus(servers, tmp_path: Path) -> None:
    assert PROMETHEUS, ("no `prometheus` on PATH: `make venv` installs Debian's package where it runs as root with "
                        "apt; elsewhere install it (apt install prometheus, or a release binary on PATH)")
    server = servers.get("embedded-code")
    config = load_config("embedded-code")
    target = server.base_url.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(scrape_config(config, [target], interval_s=1))
    port = free_port()
    prometheus = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        deadline = time.monotonic() + 60
        while True:  # the server's target is up
            try:
                targets = requests.get(f"{api}/targets", timeout=5).json()["data"]["activeTargets"]
                if targets and targets[0]["health"] == "up":
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()[-2000:]
            time.sleep(1)
        # Traffic spread over several scrapes, so every rate has two samples with a change between.
        for _ in range(4):
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda p: complete(server, p, max_tokens=32), CODE_PROMPTS))
            time.sleep(1.5)
        time.sleep(2)
        empty = []
        for panel in dashboard_panels(config):
            for legend, expr in panel.queries:
                reply = requests.get(f"{api}/query", params={"query": expr}, timeout=10).json()
                assert reply["status"] == "success", (expr, reply)
                values = [float(r["value"][1]) for r in reply["data"]["result"]]
                if not values or not any(v == v for v in values):  # none, or all NaN
                    empty.append(f"{panel.title} / {legend}: {expr}")
        assert not empty, "queries without data:\n" + "\n".join(empty)
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
