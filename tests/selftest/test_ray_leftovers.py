"""A Ray head that failed to start leaves its GCS, dashboard, monitor and log monitor running
(``ray.shutdown`` knows no node to stop); under emulation every later attempt then competed with
them (seen: three attempts' processes side by side in the arm64 gate). The self-test stops every
process that names the attempt's session directory, on real processes here."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from builder.selftest.phases import rayphase

SLEEPER = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN) " \
          "if sys.argv[2] == 'stubborn' else None; time.sleep(120)"


def _start(session: Path, kind: str = "polite") -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, str(session / "logs"), kind])
    time.sleep(0.3)  # the interpreter has set its handler
    return proc


def test_processes_of_the_failed_attempt_are_stopped_and_no_others(tmp_path: Path) -> None:
    first, second = tmp_path / "1", tmp_path / "2"
    polite, stubborn, other = _start(first), _start(first, "stubborn"), _start(second)
    try:
        found = rayphase.stop_processes_under(f"{first}/", grace=1.0)
        assert sorted(found) == sorted([polite.pid, stubborn.pid])
        assert polite.wait(timeout=10) == -15  # SIGTERM was enough
        assert stubborn.wait(timeout=10) == -9  # ignored SIGTERM: SIGKILL after the grace
        assert other.poll() is None  # the next attempt's processes are not touched
    finally:
        for p in (polite, stubborn, other):
            p.kill()
            p.wait()


def test_nothing_named_nothing_stopped(tmp_path: Path) -> None:
    assert rayphase.stop_processes_under(f"{tmp_path}/none/") == []
    assert rayphase.stop_processes_under(f"{tmp_path}/", proc=str(tmp_path / "noproc")) == []


def test_ray_directories_a_killed_self_test_left_are_removed_by_the_next(tmp_path: Path) -> None:
    """SIGKILL skips the self-test's ``finally``: the next run removes what it left, and only
    that (a live run's directory, a fresh one, one not named like ours stay)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    old = time.time() - rayphase.RAY_TMP_STALE_S - 60
    left = tmp_path / f"vst-ray-{dead.pid}-abcd1234"
    (left / "session_x" / "logs").mkdir(parents=True)
    live = tmp_path / f"vst-ray-{os.getpid()}-efgh5678"
    fresh = tmp_path / f"vst-ray-{dead.pid}-ijkl9012"
    other = tmp_path / f"vst-ray-{dead.pid}"
    for d in (live, fresh, other):
        d.mkdir()
    for d in (left, live, other):
        os.utime(d, (old, old))
    made = Path(rayphase.ray_tmp(str(tmp_path)))
    assert made.name.startswith(f"vst-ray-{os.getpid()}-") and made.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [made.name, live.name, fresh.name, other.name])
