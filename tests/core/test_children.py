"""builder.children.run: an interrupted or timed-out child is killed and reaped before the
exception goes on, however long it takes to die (CI run of stop 54: uv, killed by the SIGTERM
of ``build-env lock`` but still in disk sleep, outlived the command)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from builder import children


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


def test_output_and_exit_code_as_subprocess_run() -> None:
    proc = children.run([sys.executable, "-c", "import sys; print('out'); "
                         "print('err', file=sys.stderr); sys.exit(3)"])
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "out\n", "err\n")
    raw = children.run([sys.executable, "-c",
                        "import sys; sys.stdout.buffer.write(b'\\xff\\x00')"], text=False)
    assert (raw.returncode, raw.stdout, raw.stderr) == (0, b"\xff\x00", b"")


def test_a_timeout_kills_and_reaps_the_child(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        children.run([sys.executable, "-c", f"import os, time; open({str(pidfile)!r}, 'w')"
                      ".write(str(os.getpid())); time.sleep(60)"], timeout=2)
    assert _gone(int(pidfile.read_text()))


def test_an_interruption_kills_and_reaps_the_child(tmp_path: Path) -> None:
    """KeyboardInterrupt (what SIGTERM becomes in build-env) in the middle of the wait."""
    pidfile = tmp_path / "pid"

    def interrupt() -> None:
        while not pidfile.exists() or not pidfile.read_text():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        children.run([sys.executable, "-c", f"import os, time; open({str(pidfile)!r}, 'w')"
                      ".write(str(os.getpid())); time.sleep(60)"])
    assert _gone(int(pidfile.read_text()))


class _SlowToDie:
    """A child that dies a second after SIGKILL, as one in uninterruptible disk I/O does."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.args, self.returncode, self.killed_at = args[0], None, 0.0

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        if not self.killed_at:
            raise KeyboardInterrupt
        left = self.killed_at + 1.0 - time.monotonic()
        if timeout is not None and left > timeout:
            raise subprocess.TimeoutExpired(self.args, timeout)
        time.sleep(max(left, 0))
        self.returncode = -9
        return "", ""

    def kill(self) -> None:
        self.killed_at = time.monotonic()


def test_a_child_slow_to_die_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    fake: list[_SlowToDie] = []
    monkeypatch.setattr(children.subprocess, "Popen",
                        lambda *a, **k: fake.append(_SlowToDie(*a, **k)) or fake[-1])
    with pytest.raises(KeyboardInterrupt):
        children.run(["uv"])
    assert fake[0].returncode == -9, "the command went on before its child had died"
