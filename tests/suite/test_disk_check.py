"""``scripts/test.sh`` checks the disk before a whole run starts (``scripts/disk-check.sh``):
short, it says so in one line and exits 3 before it installs, builds or starts anything."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "scripts" / "disk-check.sh"


def check(need: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CHECK)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "VERL_ENV_TEST_DISK_GB": need})


def test_a_short_disk_is_one_line_and_exit_3() -> None:
    proc = check("999999999")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("test.sh: not enough disk for a whole run: ")
    assert "/tmp" in line and "/var/tmp" in line and "the run needs 999999999 GB" in line


def test_enough_disk_says_what_is_free() -> None:
    proc = check("1")
    assert proc.returncode == 0, proc.stderr
    [line] = proc.stdout.splitlines()
    assert line.startswith("test.sh: disk ok: ") and "GB free of 1 GB needed" in line


def test_a_whole_run_checks_before_it_starts_anything() -> None:
    """test.sh runs the check (whole runs only) before its first action, and stops on it."""
    lines = [line.strip() for line in (REPO / "scripts" / "test.sh").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert lines[:4] == ["set -uo pipefail", 'cd "$(dirname "$0")/.." || exit 1',
                         "[ $# -gt 0 ] || scripts/disk-check.sh || exit 3",
                         "scripts/os-packages.sh || exit 1"]
