"""A vLLM server that is already running somewhere: what the sweep needs to know to load it.

`make serve` on a GPU node, a Kubernetes Service, two deployments side by side: the sweep
loads them as it loads the servers it starts, once it knows the served model name, whether
the server speculates (and with which K), the API key, and a tokenizer for vLLM's benchmark.
Those come from the server itself (`/health`, `/v1/models`, `/metrics`) and, when given, from
the deployment's YAML. Every way this can go wrong ends in one `EndpointError` line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import requests

from deploy.launcher import answers_health
from loadtest.measurement import prom
from loadtest.traffic.client import auth_headers


class EndpointError(Exception):
    """A running server that cannot be load-tested as asked; the message says what to fix."""


@dataclass
class RemoteServer:
    """A server the sweep did not start. Fields mirror what the sweep reads from its own servers."""

    base_url: str
    served_name: str
    api_key_env: str = ""
    tokenizer: str = ""
    """For vLLM's benchmark: a local folder or a hub id; empty when none is known (the benchmark is skipped)."""
    speculates: bool = False
    """The server has vLLM's speculative-decoding counters in `/metrics`."""
    spec_k: int | None = None
    """K, read from the per-position acceptance counters (one per draft position)."""
    metrics: bool = True
    """Whether `/metrics` answered when the sweep looked; without it the engine's figures are missing."""

    def headers(self) -> dict[str, str] | None:
        return auth_headers(self.api_key_env)

    def alive(self) -> bool:
        return answers_health(self.base_url)

    def exit_reason(self) -> str:
        return f"server at {self.base_url} stopped answering /health mid-run"


def _get(url: str, headers: dict[str, str] | None, what: str) -> requests.Response:
    try:
        return requests.get(url, headers=headers, timeout=10)
    except requests.ConnectionError:
        raise EndpointError(f"cannot reach {what} at {url}: connection refused or host unknown "
                            f"(is the server running? `make serve` prints its address)") from None
    except requests.RequestException as exc:
        raise EndpointError(f"cannot reach {what} at {url}: {type(exc).__name__}") from None


def discover(url: str, model: str = "", api_key_env: str = "", tokenizer: str = "") -> RemoteServer:
    """Look at the server at `url` and describe it, or raise `EndpointError` with the fix.

    `model`: the served name expected (from the YAML or the command line); empty: the server's
    only model. `tokenizer`: for vLLM's benchmark; empty: the served model's folder when it
    exists on this machine (vLLM reports it as the model's `root`).
    """
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise EndpointError(f"'{url}' is not a server address; give one like http://127.0.0.1:8000")
    base = url.rstrip("/")
    if parsed.path not in ("", "/"):
        raise EndpointError(f"give the server's root address, not a path: {parsed.scheme}://{parsed.netloc}")
    health = _get(f"{base}/health", None, "the server's /health")
    if health.status_code != 200:
        raise EndpointError(f"{base}/health answered HTTP {health.status_code}: the server is not ready")
    server = RemoteServer(base_url=base, served_name="", api_key_env=api_key_env)
    if api_key_env and not os.environ.get(api_key_env):
        raise EndpointError(f"the API key variable {api_key_env} is not set; export it with the server's key")
    listing = _get(f"{base}/v1/models", server.headers(), "the server's model list")
    if listing.status_code == 401:
        raise EndpointError(
            f"{base} wants an API key: " + (f"the key in ${api_key_env} was refused" if api_key_env else
                                            "name the variable holding it (--api-key-env VAR, or the config's "
                                            "server.api_key_env)"))
    if listing.status_code != 200:
        raise EndpointError(f"{base}/v1/models answered HTTP {listing.status_code}: is this a vLLM OpenAI server?")
    try:
        models = {m["id"]: m for m in listing.json()["data"]}
    except (ValueError, KeyError, TypeError):
        raise EndpointError(f"{base}/v1/models did not return an OpenAI model list") from None
    if model and model not in models:
        raise EndpointError(f"the server at {base} does not serve '{model}'; it serves: {', '.join(models) or 'nothing'}")
    if not model:
        if len(models) != 1:
            raise EndpointError(f"the server at {base} serves {len(models)} models ({', '.join(models)}); "
                                f"name one with --model")
        model = next(iter(models))
    server.served_name = model
    root = str(models[model].get("root") or "")
    server.tokenizer = tokenizer or (root if root and Path(root).is_dir() else "")
    try:
        snapshot = prom.scrape(base, headers=server.headers())
    except (requests.RequestException, ValueError):
        server.metrics = False
    else:
        positions = snapshot.by_label(prom.ACCEPTED_PER_POS, "position")
        server.speculates = snapshot.has(prom.DRAFTS) or bool(positions)
        server.spec_k = len(positions) or None
    return server
