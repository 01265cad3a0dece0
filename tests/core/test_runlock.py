"""The run lock on real processes: a second holder waits or is refused, and a SIGKILLed holder
never leaves a lock behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from builder import exclusive as runlock

HOLDER = textwrap.dedent("""
    import sys, time
    from builder import exclusive as runlock
    with runlock.held(sys.argv[1], what="test holder"):
        print("held", flush=True)
        time.sleep(float(sys.argv[2]))
""")


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def _hold(key: str, seconds: float) -> subprocess.Popen[str]:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, key, str(seconds)], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_busy_lock_names_its_holder_and_a_sigkilled_holder_leaves_none() -> None:
    proc = _hold("target:cpu", 60)
    try:
        with pytest.raises(runlock.LockBusy, match=rf"pid {proc.pid}: test holder"):
            with runlock.held("target:cpu", what="second", wait=False):
                pass
        # another key is independent
        with runlock.held("target:other", what="second", wait=False):
            pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    start = time.monotonic()
    with runlock.held("target:cpu", what="after the kill", wait=False):
        pass
    assert time.monotonic() - start < 60  # wait=False never waits: this catches a hang only


def test_a_second_run_waits_for_the_first(capsys: pytest.CaptureFixture[str]) -> None:
    proc = _hold("path:/x.sif", 1.5)
    start = time.monotonic()
    try:
        with runlock.held("path:/x.sif", what="second", timeout_s=30):
            waited = time.monotonic() - start
    finally:
        proc.wait()
    assert waited >= 1.0, "the lock was granted while the first run held it"
    assert f"waiting for pid {proc.pid}: test holder" in capsys.readouterr().err


def test_wait_timeout_is_a_clear_error() -> None:
    proc = _hold("target:slow", 60)
    try:
        with pytest.raises(runlock.LockBusy, match="still holds the lock .* after 1 s"):
            with runlock.held("target:slow", what="second", timeout_s=1):
                pass
    finally:
        proc.kill()
        proc.wait()


def test_path_keys_are_resolved(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    assert runlock.key_for_path(tmp_path / "d" / ".." / "a.sif") == runlock.key_for_path(
        tmp_path / "a.sif")
