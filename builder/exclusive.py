"""One run at a time on one thing: an advisory ``flock`` the kernel drops when the holder dies.

Two ``build-env`` runs that would write the same thing (the build of one target, one lock file,
one SIF path) take the same run lock; the second waits for the first (saying so on stderr) and
then sees what the first left. Because the lock is a ``flock`` on an open file, a holder killed
with SIGKILL releases it at once: a stale lock never blocks a re-run.

Lock files live under ``$XDG_STATE_HOME/verl-env/locks/`` (default ``~/.local/state``), never
beside a user's output, and hold the holder's pid and what it does (for the waiting message).
Pure stdlib; no daemon is involved.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import BuildEnvError
from .files import state_home

#: How often a waiting run re-reads who holds the lock (for its message), in seconds.
POLL_S = 0.5


class LockBusy(BuildEnvError):
    """The lock is held by another run and the caller asked not to wait (or the wait ran out)."""

    stage = "run lock"


def locks_dir() -> Path:
    return state_home() / "locks"


def _file_for(key: str) -> Path:
    """A readable, bounded file name for ``key`` that no two keys share."""
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", key)[:60]
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
    return locks_dir() / f"{readable}.{digest}.lock"


def key_for_path(path: Path | str) -> str:
    """The lock key of a file the run writes (its resolved absolute path)."""
    return "path:" + str(Path(path).resolve())


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return text


@contextmanager
def held(key: str, *, what: str, wait: bool = True, timeout_s: float | None = None,
         announce: bool = True) -> Iterator[None]:
    """Hold the run lock ``key`` for the ``with`` block.

    ``what`` says what this run does while holding it (``build of cpu-x86_64``); another run that
    finds the lock taken prints one line naming the holder and waits (``wait``), or raises
    :class:`LockBusy` at once (``wait=False``) or after ``timeout_s`` seconds.
    """
    path = _file_for(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise
            holder = _holder(fd) or "another build-env run"
            if not wait:
                raise LockBusy(f"{holder} holds the lock for {key}; not waiting") from None
            if announce:
                print(f"build-env: waiting for {holder} ({key})", file=sys.stderr, flush=True)
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as again:
                    if again.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                        raise
                if deadline is not None and time.monotonic() >= deadline:
                    raise LockBusy(f"{holder} still holds the lock for {key} after "
                                   f"{timeout_s:g} s") from None
                time.sleep(POLL_S)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}: {what}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
