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

from builder.trust import keys, sbom

RELEASE_VERDICT = {"image_id": "sha256:" + "5" * 64, "overall": "pass", "exit_code": 0,
                   "target": "cpu-x86_64", "recorded_at": "2026-11-23T21:00:00+00:00",
                   "report": {"schema": "verl-env/selftest/v1", "overall": "pass",
                              "selftest_version": "0.3.0", "checks": []}}


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
