"""Every route behind the API key: an ASGI middleware vLLM loads with `--middleware`.

vLLM 0.32 checks `--api-key` / `VLLM_API_KEY` only under /v1, /v2, /inference and /cohere, so
with a key set `/invocations` (full completions), `/tokenize`, `/detokenize`,
`/scale_elastic_ep`, `/docs` and `/metrics` still answer anyone. specdeploy adds this middleware
whenever `server.api_key_env` is set (deploy/engine_args.py): every path but the open ones
(`/health`, plus `/metrics` with `server.public_metrics: true`) wants `Authorization: Bearer <key>`.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from typing import Any

KEY_ENV = "VLLM_API_KEY"
OPEN_PATHS_ENV = "SPECDEPLOY_OPEN_PATHS"
"""Comma-separated paths that answer without the key (set by specdeploy's launch plan)."""


class GuardEveryRoute:
    """Pure ASGI middleware: 401 for any HTTP or websocket request without the key, but the open paths."""

    def __init__(self, app: Any) -> None:
        key = os.environ.get(KEY_ENV, "")
        if not key:
            # Never fall open: a server started with this middleware and no key refuses to start.
            raise RuntimeError(f"specdeploy's GuardEveryRoute needs the API key in {KEY_ENV}")
        self.app = app
        self.key_hash = hashlib.sha256(key.encode()).digest()
        self.open_paths = frozenset(p for p in os.environ.get(OPEN_PATHS_ENV, "/health").split(",") if p)

    def _authorized(self, scope: dict[str, Any]) -> bool:
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and secrets.compare_digest(
                    hashlib.sha256(token.strip().encode()).digest(), self.key_hash)
        return False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)  # lifespan events; CORS pre-flight carries no key
            return
        path = scope["path"].removeprefix(scope.get("root_path", "")) or "/"
        if path.rstrip("/") in self.open_paths or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
            return
        body = b'{"error":"Unauthorized"}'
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
