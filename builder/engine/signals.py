"""Signals: SIGTERM raised as KeyboardInterrupt, so the cleanup code of a build, a container or
a conversion runs for both (engine-neutral; re-exported by :mod:`builder.engine`)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt for the duration, so cleanup code runs for both."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
