"""The arm64 fixtures of the emulated group, one per session: QEMU user emulation made
available, the arm64 debootstrap base, and the arm64 fixture target (tests/fixtures/arm64)
built, verified under emulation and tagged by the installed CLI.

Session-scoped and registered once (``pytest_plugins`` in tests/conftest.py): ``tests/multiarch`` and
``tests/pipeline/test_arm64.py`` share one emulated build and one emulated gate. That gate is
the group's long pole and the part most sensitive to a loaded host (Ray's start under
emulation): it runs once, with nothing else of this group beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.engine import BINFMT_DIR, emulation_problem
from tests.conftest import REPO, run_build_env

FIXTURE = str(REPO / "tests/fixtures/arm64/matrix.yaml")
ARM64_BASE = "verl-env-test/debian-arm64:bookworm"
ARM64_TARGET = "cpu-arm64"
TIMINGS: dict[str, float] = {}  # what the fixtures took (seconds), printed by the tests


def enable_emulation(undo: list[list[str]]) -> str | None:
    """Make QEMU aarch64 emulation available to containers; the reason when the kernel refuses.

    A missing OS package is a failure, not a skip: CI installs qemu-user-static binfmt-support.
    What this changes (the mount, the enabled handler) is pushed on ``undo``, newest last.
    """
    if not os.path.exists(os.path.join(BINFMT_DIR, "status")):
        proc = subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", BINFMT_DIR],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            return (f"the kernel refuses binfmt_misc (mount -t binfmt_misc binfmt_misc "
                    f"{BINFMT_DIR}: {proc.stderr.strip() or proc.returncode})")
        undo.append(["umount", BINFMT_DIR])
    if emulation_problem("linux/arm64"):
        tool = shutil.which("update-binfmts")
        assert tool, "update-binfmts missing: apt-get install qemu-user-static binfmt-support"
        proc = subprocess.run([tool, "--enable", "qemu-aarch64"], capture_output=True, text=True)
        problem = emulation_problem("linux/arm64")
        if problem and not os.path.exists(os.path.join(BINFMT_DIR, "register")):
            return f"the kernel refuses binfmt_misc registration: {problem}"
        assert problem is None, f"{problem} (update-binfmts: {proc.stderr.strip()})"
        undo.append([tool, "--disable", "qemu-aarch64"])
    return None


@pytest.fixture(scope="session")
def emulation() -> Iterator[str | None]:
    """None when aarch64 binaries run here under QEMU; else why not (the kernel refuses).
    What it had to change on this machine is changed back at the session's end."""
    undo: list[list[str]] = []
    try:
        yield enable_emulation(undo)
    finally:
        for cmd in reversed(undo):
            subprocess.run(cmd, capture_output=True)


@pytest.fixture(scope="session")
def arm64_base(emulation: str | None, docker_host: str) -> str:
    """``verl-env-test/debian-arm64:bookworm``: debootstrap --arch=arm64 (cached tarball)."""
    if emulation:
        pytest.skip(emulation)
    t0 = time.monotonic()
    proc = subprocess.run([str(REPO / "scripts" / "debian-base.sh"), ARM64_BASE],
                          env={**os.environ, "DOCKER_HOST": docker_host, "DEBIAN_ARCH": "arm64"},
                          capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, f"debian-base.sh (arm64) failed: {proc.stderr[-3000:]}"
    TIMINGS["arm64_base"] = time.monotonic() - t0
    return ARM64_BASE


@pytest.fixture(scope="session")
def arm64_image(arm64_base: str, debian_base: str, ca_bundle: Path,
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The arm64 fixture target built, verified (emulated) and tagged by the installed CLI:
    its build report (``--json``). The x86_64 base (``debian_base``) is its
    ``base.bytecode_image``: the build byte-compiles with that base's python3.11, natively."""
    workdir = tmp_path_factory.mktemp("arm64-build")
    t0 = time.monotonic()
    proc = run_build_env("--target", ARM64_TARGET, "--matrix", FIXTURE, "--ca-bundle",
                         str(ca_bundle), "--workdir", str(workdir), "--json", timeout=5400)
    TIMINGS["pipeline"] = time.monotonic() - t0
    if proc.returncode != 0:
        pytest.fail(f"arm64 build failed (exit {proc.returncode}):\n{proc.stderr[-5000:]}\n"
                    f"{proc.stdout[-3000:]}")
    report: dict[str, Any] = json.loads(proc.stdout)
    return report
