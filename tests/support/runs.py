"""Running the installed ``build-env`` in the background, as two users at once would: start a
run, wait for a condition, watch a path from a thread, and end whatever is still running."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import OUTSIDE, installed_build_env


def start(args: list[str], log: Path, *, cwd: Path = OUTSIDE,
          session: bool = False) -> subprocess.Popen[str]:
    """The installed build-env in the background, stdout and stderr into ``log`` (``session``:
    in a process group of its own)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with open(log, "w") as f:
        return subprocess.Popen([str(installed_build_env()), *args], cwd=cwd, env=env,
                                stdout=f, stderr=subprocess.STDOUT, text=True,
                                start_new_session=session)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120) -> Any:
    """``check()``'s first truthy value, polled every 20 ms; an AssertionError naming ``what``
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@contextmanager
def polling(check: Callable[[], None], interval: float = 0.005) -> Iterator[None]:
    """Call ``check()`` from a thread every ``interval`` seconds for the ``with`` block."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            check()
            time.sleep(interval)

    poller = threading.Thread(target=loop)
    poller.start()
    try:
        yield
    finally:
        stop.set()
        poller.join()


def end(*procs: subprocess.Popen[str] | None) -> None:
    """Kill the runs still going (resumed first, in case a test stopped one with SIGSTOP)."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()
