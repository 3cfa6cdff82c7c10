"""specdeploy's cache folder: the built pair, its training runs and token streams, load-test timings."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """specdeploy's cache folder: `$SPECDEPLOY_CACHE`, else `$XDG_CACHE_HOME/specdeploy` or `~/.cache/specdeploy`."""
    if os.environ.get("SPECDEPLOY_CACHE"):
        return Path(os.environ["SPECDEPLOY_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "specdeploy"
