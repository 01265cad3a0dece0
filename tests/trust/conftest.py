"""Fixtures for the trust tests: key pairs (made once), a small real SIF built with the reference
``siftool`` from a real squashfs, a release verdict, a build report and a CycloneDX SBOM."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.matrix.families import FAMILIES
from builder.trust import keys, sbom
from builder.gate.verdicts import Verdict

def _gate(family: str, scope: str = "release", reason: str | None = None,
          expected: int = 0) -> dict:
    """The ``gate`` section verify adds to a report (builder.gate.image.verify_image)."""
    phases = list(FAMILIES[family].release_phases)
    return {"schema": "verl-env/gate/v1", "family": family, "phases": phases,
            "required_phases": phases, "scope": scope, "partial_reason": reason,
            "gpus": {"expected": expected,
                     "reason": f"the engine's host shows {expected} GPU(s)" if expected
                     else f"target family {family} has no GPUs" if family == "cpu"
                     else "the engine's host shows 0 nvidia GPU(s) under /dev"}}


def verdict_record(family: str = "cpu", scope: str = "release", reason: str | None = None,
                   target: str = "cpu-x86_64") -> dict:
    """A passing verdict record as the gate writes it (builder.gate.verdicts.Verdict.to_dict)."""
    record = {"image_id": "sha256:" + "5" * 64, "overall": "pass", "exit_code": 0,
              "target": target, "recorded_at": "2026-11-23T21:00:00+00:00",
              "report": {"schema": "verl-env/selftest/v1", "overall": "pass",
                         "selftest_version": "0.3.0", "checks": [],
                         "gate": _gate(family, scope, reason)}}
    return Verdict.from_dict(Verdict.from_dict(record).recorded(
        record["image_id"], target=target, at=record["recorded_at"]).to_dict()).to_dict()


# a cpu image's full, passing run; a narrowed run that passed; a cuda image gated on a GPU-less
# host (a build verdict, its GPU phases pending)
RELEASE_VERDICT = verdict_record()
PARTIAL_VERDICT = verdict_record(scope="partial", reason="phases gpu, collective not run")
CUDA_BUILD_VERDICT = verdict_record("cuda", target="cuda-x86_64")


def need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"missing {', '.join(missing)} (scripts/os-packages.sh installs them)")


@pytest.fixture(scope="session")
def keypair(tmp_path_factory: pytest.TempPathFactory) -> keys.KeyFiles:
    return keys.generate(tmp_path_factory.mktemp("keys"), pgp=True)


@pytest.fixture(scope="session")
def other_keypair(tmp_path_factory: pytest.TempPathFactory) -> keys.KeyFiles:
    return keys.generate(tmp_path_factory.mktemp("other-keys"), pgp=True)


@pytest.fixture(scope="session")
def base_sif(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SIF as apptainer lays it out: a definition file and a squashfs partition in group 1."""
    need("mksquashfs", "siftool")
    d = tmp_path_factory.mktemp("base-sif")
    root = d / "root"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "hello").write_bytes(os.urandom(20000))  # several squashfs blocks
    (root / "etc").mkdir()
    (root / "etc" / "motd").write_text("verl-env trust test\n")
    subprocess.run(["mksquashfs", str(root), str(d / "fs.sqfs"), "-quiet", "-noappend",
                    "-no-progress"], check=True)
    (d / "def").write_text("Bootstrap: docker-daemon\nFrom: verl-env-test\n")
    sif = d / "image.sif"
    subprocess.run(["siftool", "new", str(sif)], check=True, capture_output=True)
    subprocess.run(["siftool", "add", str(sif), str(d / "def"), "--datatype", "1",
                    "--groupid", "1"], check=True, capture_output=True)
    subprocess.run(["siftool", "add", str(sif), str(d / "fs.sqfs"), "--datatype", "4",
                    "--parttype", "2", "--partfs", "1", "--partarch", "2", "--groupid", "1"],
                   check=True, capture_output=True)
    return sif


@pytest.fixture
def sif(base_sif: Path, tmp_path: Path) -> Path:
    """A fresh copy of the unsigned SIF for each test."""
    out = tmp_path / "image.sif"
    shutil.copyfile(base_sif, out)
    return out


@pytest.fixture
def report(tmp_path: Path) -> Path:
    """A pipeline build report and the rendered Dockerfile it points at."""
    ctx = tmp_path / "context"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM verl-env-test/debian:bookworm\nRUN true\n")
    path = tmp_path / "report.json"
    path.write_text(json.dumps({
        "schema": "verl-env/build-report/v1", "target": "cpu-x86_64", "override": False,
        "matrix_hash": "sha256:" + "1" * 64, "lock_hash": "sha256:" + "2" * 64,
        "content_hash": "sha256:" + "3" * 64, "bases": ["sha256:" + "4" * 64],
        "image_id": RELEASE_VERDICT["image_id"], "pins": {"torch": "2.6.0+cpu", "verl": "0.5.0"},
        "stages": {"render": {"context": str(ctx)}}}))
    return path


@pytest.fixture
def verdict_file(tmp_path: Path) -> Path:
    path = tmp_path / "verdict.json"
    path.write_text(json.dumps(RELEASE_VERDICT))
    return path


@pytest.fixture
def sbom_doc() -> dict:
    inv = sbom.Inventory("/opt/venv/bin/python", "3.11.2",
                         ({"name": "torch", "version": "2.6.0+cpu", "license": "BSD-3-Clause"},
                          {"name": "verl", "version": "0.5.0", "license": "Apache-2.0"}),
                         ({"name": "libc6", "version": "2.36-9+deb12u10", "arch": "amd64"},),
                         "debian", "12")
    return sbom.build(inv, name="cpu-x86_64", version=RELEASE_VERDICT["image_id"],
                      pins={"torch": "2.6.0+cpu", "verl": "0.5.0"})


@pytest.fixture
def sbom_file(tmp_path: Path, sbom_doc: dict) -> Path:
    path = tmp_path / "sbom.cdx.json"
    path.write_text(json.dumps(sbom_doc))
    return path


@pytest.fixture
def gnupg(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A private GNUPGHOME for the real gpg; its agent (if one started) is stopped at teardown."""
    need("gpg", "gpgconf")
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    try:
        yield env
    finally:
        subprocess.run(["gpgconf", "--kill", "all"], env=env, check=False, capture_output=True)
