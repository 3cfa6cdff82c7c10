"""Can this machine download a config's hub models? `make check` asks the hub before a start does.

A gated model (Llama) fails late otherwise: minutes into `make serve`, or at a load test's
tokenizer. One HEAD request per repository (its config.json, as a download starts), with the
token vLLM would use (HF_TOKEN, else huggingface_hub's saved login), answers which: reachable,
no token, a token without access (licence not accepted), no such repository, or no answer at all
(no network, offline mode), which is said as such rather than taken for success or failure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import requests

TIMEOUT_S = 5.0
"""A hub that does not answer within this is 'not checked': `make check` must not hang offline."""


@dataclass(frozen=True)
class Access:
    repo: str
    status: str
    """`ok`, `no_token`, `denied`, `not_found`, or `unchecked` (the hub could not be asked)."""
    message: str

    @property
    def problem(self) -> bool:
        return self.status in ("no_token", "denied", "not_found")


def _token() -> str | None:
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if token:
        return token
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:  # noqa: BLE001 - no saved login, or an old huggingface_hub: no token
        return None


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def check_repo(repo: str, revision: str | None = None, timeout_s: float = TIMEOUT_S) -> Access:
    """One repository's access, in one line."""
    page = f"{endpoint()}/{repo}"
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return Access(repo, "unchecked", f"{repo}: access not checked (HF_HUB_OFFLINE is set); a start uses the "
                                         f"local cache only")
    token = _token()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"{page}/resolve/{revision or 'main'}/config.json"
    try:
        reply = requests.head(url, headers=headers, timeout=timeout_s, allow_redirects=False)
    except requests.RequestException as exc:
        reason = (f"no answer within {timeout_s:g} s" if isinstance(exc, requests.Timeout) else
                  "no connection" if isinstance(exc, requests.ConnectionError) else type(exc).__name__)
        return Access(repo, "unchecked", f"{repo}: access not checked: this machine cannot reach the hub "
                                         f"({endpoint()}: {reason}); the first start finds out")
    code = reply.status_code
    error = reply.headers.get("X-Error-Code", "")
    if code < 400:
        return Access(repo, "ok", f"{repo}: access OK" + (" (with HF_TOKEN)" if token else " (public)"))
    if code == 401 and not token:
        return Access(repo, "no_token", f"{repo} is gated or private and no Hugging Face token is set: export "
                                        f"HF_TOKEN=<token> of an account that accepted its licence at {page}")
    if code in (401, 403) and (error == "GatedRepo" or code == 403):
        return Access(repo, "denied", f"{repo}: the token's account has no access (licence not accepted, or the "
                                      f"request still pending): accept it at {page} with that account, then retry")
    if code == 401:
        return Access(repo, "denied", f"{repo}: the hub refused the token (HF_TOKEN expired or wrong?): make a new "
                                      f"read token at {endpoint()}/settings/tokens")
    if code == 404:
        return Access(repo, "not_found", f"{repo}" + (f" at revision {revision}" if revision else "")
                      + f": no such repository or file on the hub ({url}): check the name")
    return Access(repo, "unchecked", f"{repo}: access not checked: the hub answered HTTP {code}")


def hub_repos(config: object) -> list[tuple[str, str | None]]:
    """(hub id, revision) of the config's models that are downloaded from the hub: not local
    folders, not the embedded pair."""
    from deploy.preflight import looks_like_path

    target = getattr(config, "target")
    spec = getattr(config, "speculation")
    refs = [(target.model, target.revision), (target.tokenizer, target.revision)]
    if spec.enabled and spec.model:
        refs.append((spec.model, None))
    out: list[tuple[str, str | None]] = []
    for ref, revision in refs:
        if not ref or ref.startswith("embedded:") or looks_like_path(ref) or os.path.isdir(ref):
            continue
        if ref not in [r for r, _ in out]:
            out.append((ref, revision))
    return out


def check_config(config: object, timeout_s: float = TIMEOUT_S) -> list[Access]:
    """Every hub model of the config, asked in turn; once the hub cannot be reached the rest are
    not asked (the same network would keep each waiting)."""
    found: list[Access] = []
    for repo, revision in hub_repos(config):
        if found and found[-1].status == "unchecked" and "cannot reach" in found[-1].message:
            found.append(Access(repo, "unchecked", f"{repo}: access not checked (the hub cannot be reached)"))
            continue
        found.append(check_repo(repo, revision, timeout_s))
    return found
