"""A local rank forked from the phase process instead of started as a new interpreter.

A CPU rank started with ``python -m ...launch.rank`` imports torch again (1.5-1.8 s of CPU
per rank in the CPU fixture, more than the all-reduce itself); a rank forked after the phase
imported torch starts at once. Each rank is still its own process with its own gloo context,
its log and its result file, judged exactly as a spawned one. Only for CPU ranks: a process
that touched CUDA or HIP cannot be forked safely, so GPU ranks are always spawned.

:class:`ForkedRank` answers what ``spawn_local`` asks of a ``subprocess.Popen``: ``poll``,
``wait(timeout)``, ``kill`` and ``returncode``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence

POLL_S = 0.02


def exit_code(status: int) -> int:
    """A wait status as ``Popen.returncode`` gives it: the exit code, or -signal."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


class ForkedRank:
    """``main(argv)`` run in a forked child, its stdout and stderr in ``log_path``."""

    def __init__(self, main: Callable[[list[str]], int], argv: Sequence[str], log_path: str,
                 env: Mapping[str, str]) -> None:
        self.args = list(argv)
        self.returncode: int | None = None
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self.pid = os.fork()
            if self.pid == 0:
                _child(main, self.args, fd, env)  # never returns
        finally:
            os.close(fd)

    def poll(self) -> int | None:
        """The exit code when the child ended (reaped once), None while it runs."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = exit_code(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        if timeout is None:
            if self.returncode is None:
                self.returncode = exit_code(os.waitpid(self.pid, 0)[1])
            return self.returncode
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(POLL_S)
        return self.returncode  # type: ignore[return-value]  # poll() set it

    def kill(self) -> None:
        """SIGKILL to the child, unless it was already reaped."""
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _child(main: Callable[[list[str]], int], argv: list[str], fd: int,
           env: Mapping[str, str]) -> None:
    """In the forked child: output to the log, the rank's environment, ``main``, exit."""
    code = 1
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        # the parent's sys.stdout may be another object than fd 1 (a worker's records, a test's
        # capture): the rank's prints go to its log as a spawned rank's would
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives to _exit
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        os.environ.clear()
        os.environ.update(env)
        code = main(argv)
    except SystemExit as e:
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - the rank's log carries it, as a spawned rank's would
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
