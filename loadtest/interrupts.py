"""Signals that stop a command as Ctrl-C does, so that one clean-up path (servers and Locust stopped,
what was measured kept) serves a Ctrl-C, a `kill` and a closed terminal alike."""

from __future__ import annotations

import signal
from types import FrameType


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def interrupt_on(*signals: signal.Signals) -> None:
    """From now on, each of `signals` raises KeyboardInterrupt in the main thread."""
    for signum in signals:
        signal.signal(signum, _interrupt)
