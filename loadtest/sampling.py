"""Call a sampling function every few seconds in a background thread while a block runs (the
capacity search's memory watch during overload, the soak's server memory)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def sampling(every_s: float, sample: Callable[[], None], name: str = "sampler") -> Iterator[None]:
    """`sample()` on entry, every `every_s` seconds in a daemon thread, and once more on exit, so
    even a block shorter than `every_s` gets a first and a last sample."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            sample()

    sample()
    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        sample()
