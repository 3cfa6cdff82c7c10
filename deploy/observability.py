"""A Prometheus scrape config and a Grafana dashboard for a deployment's speculative decoding.

vLLM exports its speculative-decoding counters on `/metrics` beside throughput and latency
histograms; what it does not give is a view that says whether the drafter pays. The
dashboard puts side by side, per served model:
  - acceptance rate (accepted / proposed draft tokens) and mean accepted length
    (1 + accepted / drafts: tokens the target keeps per verification step),
  - acceptance per draft position (where the drafter loses the thread),
  - drafts per second, output tokens per second, running and waiting requests,
  - TTFT and per-token latency percentiles from vLLM's histograms.
Every panel's query is plain PromQL over fixed windows, so the test can run each one against a
real Prometheus scraping a real server (`tests/test_observability.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from deploy.config import DeploymentConfig

WINDOW = "1m"


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    """Grafana's unit id (`percentunit`, `s`, `short`, ...)."""
    queries: tuple[tuple[str, str], ...]
    """(legend, PromQL) pairs."""
    speculation_only: bool = False
    """Empty on a server without speculation: left out of the baseline's dashboard."""


def panels(model: str) -> list[Panel]:
    """The dashboard's panels for one served model name."""
    sel = f'{{model_name="{model}"}}'

    def rate(metric: str) -> str:
        return f"sum(rate({metric}{sel}[{WINDOW}]))"

    def quantile(q: float, histogram: str) -> str:
        return f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket{sel}[{WINDOW}])))"

    accepted, drafted = "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"
    drafts = "vllm:spec_decode_num_drafts_total"
    return [
        Panel("Acceptance rate", "percentunit", (("accepted / proposed", f"{rate(accepted)} / {rate(drafted)}"),),
              speculation_only=True),
        Panel("Mean accepted length (tokens per verification step)", "short",
              (("1 + accepted / drafts", f"1 + {rate(accepted)} / {rate(drafts)}"),), speculation_only=True),
        Panel("Acceptance by draft position", "percentunit",
              (("position {{position}}",
                f"sum by (position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total{sel}[{WINDOW}])) "
                f"/ ignoring(position) group_left {rate(drafts)}"),), speculation_only=True),
        Panel("Drafts per second", "short", (("verification steps with a draft", rate(drafts)),),
              speculation_only=True),
        Panel("Output tokens per second", "short", (("generated", rate("vllm:generation_tokens_total")),)),
        Panel("Requests", "short", (("running", f"sum(vllm:num_requests_running{sel})"),
                                    ("waiting", f"sum(vllm:num_requests_waiting{sel})"))),
        Panel("Time to first token", "s", (("p50", quantile(0.5, "vllm:time_to_first_token_seconds")),
                                           ("p95", quantile(0.95, "vllm:time_to_first_token_seconds")))),
        Panel("Per-token latency", "s", (("p50", quantile(0.5, "vllm:request_time_per_output_token_seconds")),
                                         ("p95", quantile(0.95, "vllm:request_time_per_output_token_seconds")))),
    ]


def dashboard_panels(config: DeploymentConfig) -> list[Panel]:
    return [p for p in panels(config.served_name) if config.speculation.enabled or not p.speculation_only]


def grafana_dashboard(config: DeploymentConfig) -> dict[str, Any]:
    """A Grafana dashboard (JSON model) reading a Prometheus data source chosen on import."""
    source = {"type": "prometheus", "uid": "${datasource}"}
    grid = []
    for i, panel in enumerate(dashboard_panels(config)):
        grid.append({
            "id": i + 1, "type": "timeseries", "title": panel.title, "datasource": source,
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
            "targets": [{"refId": chr(ord("A") + n), "datasource": source, "expr": expr, "legendFormat": legend}
                        for n, (legend, expr) in enumerate(panel.queries)],
        })
    return {
        "title": f"specdeploy: {config.name}", "uid": f"specdeploy-{config.name}"[:40],
        "tags": ["specdeploy", "vllm", "speculative-decoding"], "timezone": "browser",
        "schemaVersion": 39, "refresh": "10s", "time": {"from": "now-30m", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus"}]},
        "panels": grid,
    }


def scrape_config(config: DeploymentConfig, targets: list[str], interval_s: float = 5,
                  key_file: str = "/etc/prometheus/specdeploy-api-key") -> str:
    """prometheus.yml scraping the deployment's servers (`host:port` each). Behind an API key
    (without `server.public_metrics`) Prometheus sends it from `key_file`."""
    job: dict[str, Any] = {"job_name": f"specdeploy-{config.name}", "metrics_path": "/metrics",
                           "scrape_interval": f"{interval_s:g}s", "static_configs": [{"targets": targets}]}
    if config.server.api_key_env and not config.server.public_metrics:
        job["authorization"] = {"type": "Bearer", "credentials_file": key_file}
    return yaml.safe_dump({"global": {"scrape_interval": f"{interval_s:g}s"}, "scrape_configs": [job]},
                          sort_keys=False)
