"""Signals: SIGTERM raised as KeyboardInterrupt, so the cleanup code of a build, a container or
a conversion runs for both (engine-neutral; re-exported by :mod:`builder.engine`). Which signal
ended the run is remembered (:func:`received`), so the command line exits 143 for SIGTERM and
130 for Ctrl-C even where the cleanup code only saw a KeyboardInterrupt."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

_RECEIVED: list[int] = []  # the signals turned into KeyboardInterrupt in this process


def terminated(signum: int, frame: Any) -> None:
    """A SIGTERM handler: remember it, then raise KeyboardInterrupt for the cleanup code."""
    _RECEIVED.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


def received() -> int | None:
    """The last signal turned into KeyboardInterrupt here (None: none; Ctrl-C is SIGINT's own
    KeyboardInterrupt and is not recorded)."""
    return _RECEIVED[-1] if _RECEIVED else None


def exit_code() -> int:
    """128 + the signal that interrupted the run: 143 for SIGTERM, 130 for Ctrl-C."""
    return 128 + (received() or signal.SIGINT)


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt for the duration, so cleanup code runs for both."""
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
