"""Cross-architecture builds on a real Docker Engine: an arm64 (aarch64) CPU target built on
this x86_64 host under QEMU user emulation, with a torch C++ extension compiled from source
(tests/fixtures/arm64/ext) in the source-build stage, then verified under emulation and tagged.

Emulation is made available here when it can be (root: mount binfmt_misc, enable the
qemu-aarch64 handler of qemu-user-static/binfmt-support); the arm64 tests skip, visibly and with
the reason, only where the kernel refuses binfmt_misc. There, the same extension is built
natively from the x86_64 variant of the fixture instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from builder.engine import BINFMT_DIR, emulation_problem
from tests.conftest import REPO, run_build_env

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow, pytest.mark.emulated]
FIXTURE = str(REPO / "tests/fixtures/arm64/matrix.yaml")
ARM64_BASE = "verl-env-test/debian-arm64:bookworm"
EXT = "verl-env-ext"
TIMINGS: dict[str, float] = {}


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


@pytest.fixture(scope="module")
def emulation() -> Iterator[str | None]:
    """None when aarch64 binaries run here under QEMU; else why not (the kernel refuses).
    What it had to change on this machine is changed back afterwards."""
    undo: list[list[str]] = []
    try:
        yield enable_emulation(undo)
    finally:
        for cmd in reversed(undo):
            subprocess.run(cmd, capture_output=True)


@pytest.fixture(scope="module")
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


@pytest.fixture(scope="module")
def arm64_image(arm64_base: str, ca_bundle: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> dict:
    """The arm64 fixture target built, verified (emulated) and tagged by the installed CLI."""
    workdir = tmp_path_factory.mktemp("arm64-build")
    t0 = time.monotonic()
    proc = run_build_env("--target", "cpu-arm64", "--matrix", FIXTURE, "--ca-bundle",
                         str(ca_bundle), "--workdir", str(workdir), "--json", timeout=5400)
    TIMINGS["pipeline"] = time.monotonic() - t0
    if proc.returncode != 0:
        pytest.fail(f"arm64 build failed (exit {proc.returncode}):\n{proc.stderr[-5000:]}\n"
                    f"{proc.stdout[-3000:]}")
    return json.loads(proc.stdout)


def _checks(report: dict) -> dict[str, dict]:
    return {c["id"]: c for c in report["verification"]["checks"]}


def test_arm64_fixture_is_built_verified_under_emulation_and_tagged(
        arm64_image: dict, docker_host: str) -> None:
    report = arm64_image
    assert report["result"] == "pass", report.get("error")
    assert report["tags"][-1] == "verl-env:cpu-arm64"
    image = docker.from_env().images.get("verl-env:cpu-arm64")
    assert image.id == report["image_id"]
    assert image.attrs["Architecture"] == "arm64"
    assert image.labels["org.verl-env.arch"] == "aarch64"
    assert image.labels["org.verl-env.pin.verl-env-ext"] == "0.1.0 (source)"
    verification = report["verification"]
    arch = verification["gate"]["arch"]
    assert arch["image"] == "arm64" and arch["target"] == "arm64" and arch["emulated"] is True
    assert verification["platform"]["arch"] == "aarch64"
    assert verification["platform"]["machine"] == "aarch64"
    assert verification["platform"]["emulated"] is True
    checks = _checks(report)
    for cid in ("imports.torch", "imports.ray", "versions.pin.torch", "cpu.gloo_allreduce",
                f"cpu.source_build.{EXT}", "ray.local_start"):
        assert checks[cid]["status"] == "pass", checks[cid]
    assert "returned True" in checks[f"cpu.source_build.{EXT}"]["reason"]
    # the compiler stayed in the source-build stage: the final image has no g++
    history = " ".join(h.get("CreatedBy", "") for h in image.history())
    assert "build-essential" not in history
    stages = report["stages"]
    print(f"\narm64 timings: base {TIMINGS.get('arm64_base', 0):.0f} s, pipeline "
          f"{TIMINGS.get('pipeline', 0):.0f} s, build {stages['build'].get('seconds')} s, "
          f"verify {stages['verify'].get('seconds')} s")


def test_wrong_architecture_image_is_refused_by_the_gate(debian_base: str) -> None:
    """An x86_64 image held to the arm64 target is refused without running anything."""
    t0 = time.monotonic()
    proc = run_build_env("verify", debian_base, "--target", "cpu-arm64", "--matrix", FIXTURE,
                         "--json", timeout=300)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["overall"] == "fail"
    assert report["gate"]["arch"]["image"] == "amd64"
    assert report["gate"]["arch"]["target"] == "arm64"
    assert debian_base in report["error"] and "sha256:" in report["error"]
    assert [c["id"] for c in report["checks"]] == ["gate.arch"]
    assert time.monotonic() - t0 < 290  # catches a hang; 'nothing ran' is the checks above


def test_source_build_on_x86_64_where_emulation_is_refused(
        emulation: str | None, debian_base: str, ca_bundle: Path, tmp_path: Path) -> None:
    """The fallback: the same extension built from source natively (x86_64)."""
    if emulation is None:
        pytest.skip("emulation works here: the arm64 build proves the source build")
    proc = run_build_env("--target", "cpu-arm64-fallback-x86_64", "--matrix", FIXTURE,
                         "--ca-bundle", str(ca_bundle), "--workdir", str(tmp_path), "--json",
                         timeout=3600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    report = json.loads(proc.stdout)
    assert report["result"] == "pass"
    assert _checks(report)[f"cpu.source_build.{EXT}"]["status"] == "pass"
