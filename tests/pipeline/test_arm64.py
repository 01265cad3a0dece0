"""Cross-architecture builds on a real Docker Engine: an arm64 (aarch64) CPU target built on
this x86_64 host under QEMU user emulation, with a torch C++ extension compiled from source
(tests/fixtures/arm64/ext) in the source-build stage, then verified under emulation and tagged.

Emulation is made available when it can be (root: mount binfmt_misc, enable the qemu-aarch64
handler of qemu-user-static/binfmt-support; tests/support/arm64.py, whose session fixtures build
the arm64 target once for this module and tests/multiarch); the arm64 tests skip, visibly and
with the reason, only where the kernel refuses binfmt_misc. There, the same extension is built
natively from the x86_64 variant of the fixture instead.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import docker
import pytest

from tests.conftest import run_build_env
from tests.support.arm64 import FIXTURE, TIMINGS

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow, pytest.mark.emulated]
EXT = "verl-env-ext"


# Run in the arm64 image by its own interpreter: every .py under the venv's site-packages and
# /opt/verl-env whose .pyc is missing or not of its source (that compiles at all), and, for a
# sample, whether this interpreter's byte code for the file equals the .pyc's bytes.
BYTECODE_CHECK = r"""
import importlib.util, json, os, platform, sys
from importlib._bootstrap_external import _code_to_hash_pyc
roots = [os.path.join(sys.prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}",
                      "site-packages"), "/opt/verl-env"]
sample = ("torch/__init__.py", "ray/__init__.py", "pip/__init__.py",
          "verl_env_selftest/__init__.py", "torch/nn/modules/module.py")
modules, stale, differ, sampled = 0, [], [], 0
for root in roots:
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(d, name)
            modules += 1
            data = open(path, "rb").read()
            try:
                pyc = open(importlib.util.cache_from_source(path), "rb").read()
            except OSError:
                pyc = b""
            if pyc[:16] != (importlib.util.MAGIC_NUMBER + (3).to_bytes(4, "little")
                            + importlib.util.source_hash(data)):
                try:
                    compile(data, path, "exec")
                except (SyntaxError, ValueError):
                    continue
                stale.append(path)
            elif path.endswith(sample):
                sampled += 1
                code = compile(data, path, "exec", dont_inherit=True)
                if bytes(_code_to_hash_pyc(code, importlib.util.source_hash(data))) != pyc:
                    differ.append(path)
print(json.dumps({"machine": platform.machine(), "modules": modules, "stale": stale,
                  "differ": differ, "sampled": sampled,
                  "bytecode_stage": [p for p in ("/opt/verl-env-bytecode", "/usr/bin/python3.11")
                                     if os.path.lexists("/tmp/verl-env-native" + p)],
                  "mount_points": {p: sorted(os.listdir(p)) for p in ("/tmp/verl-env-native",
                                   "/tmp/verl-env/built/verl-env-ext") if os.path.isdir(p)}}))
"""


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
    # byte-compiled by the host's python3.11 (base.bytecode_image), natively: every module of
    # the venv and the self-test has current byte code, and the image's own (emulated)
    # interpreter writes the very same bytes for a sample of them
    out = docker.from_env().containers.run(
        "verl-env:cpu-arm64", ["/opt/venv/bin/python", "-c", BYTECODE_CHECK], remove=True,
        network_disabled=True).decode()
    result = json.loads(out)
    assert result["machine"] == "aarch64" and result["modules"] > 2000, result
    assert result["stale"] == [], result["stale"][:20]
    assert result["differ"] == [] and result["sampled"] >= 4, result
    # the stage is only ever mounted: nothing of it is in a layer; BuildKit leaves the mount
    # point, an empty directory, as it does for every bind mount (the source build's wheels')
    assert result["bytecode_stage"] == [], result
    assert all(v == [] for v in result["mount_points"].values()), result["mount_points"]
    print(f"mount points left in the image: {sorted(result['mount_points'])}")
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
