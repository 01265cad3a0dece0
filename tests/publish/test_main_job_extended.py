"""The main job extended end to end: `build-env --target T --sif PATH --sign-key K --push REG`
builds (cached), verifies, tags, converts the verified image to a SIF that runs its self-test,
signs its attestations (checked offline by `build-env trust verify`), and publishes both to a
real registry, reading the digests back, with the attestations as referrers of both (checked by
`build-env trust verify` from the registry references)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import requests

from builder.sif import format as sif_format
from tests.conftest import FIXTURE, run_build_env
from tests.publish.conftest import RegistryServer

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.network, pytest.mark.slow]


def test_build_sif_and_push_in_one_run(cpu_image: dict, ca_bundle: Path, tmp_path: Path,
                                       cpu_registry: RegistryServer) -> None:
    registry = cpu_registry  # the session's registry for the CPU image, its own repository
    for tool in ("siftool", "mksquashfs", "ch-run"):
        if not __import__("shutil").which(tool):
            pytest.skip(f"{tool} not installed")
    from builder.trust import keys

    key = keys.generate(tmp_path / "keys", pgp=True)
    sif = tmp_path / "cpu.sif"
    proc = run_build_env("--target", "cpu-x86_64", "--matrix", str(FIXTURE),
                         "--ca-bundle", str(ca_bundle), "--workdir", str(tmp_path / "w"),
                         "--sif", str(sif), "--push", f"{registry.host}/verl-env",
                         "--sign-key", str(key.private), "--sign-pgp-key", str(key.pgp_private))
    assert proc.returncode == 0, proc.stderr[-3000:]
    check = run_build_env("trust", "verify", str(sif), "--key", str(key.public), "--pgp",
                          str(key.pgp_public))
    assert check.returncode == 0, check.stdout + check.stderr
    report = json.loads((tmp_path / "w" / "report.json").read_text())
    assert report["image_id"] == cpu_image["image_id"]  # cached: the same verified image
    assert report["stages"]["sif"]["path"] == str(sif) and sif.is_file()
    assert report["stages"]["sif"]["keyid"] == key.keyid
    assert Path(report["stages"]["sif"]["sidecar"]).is_file()
    listing = subprocess.run(["siftool", "list", str(sif)], capture_output=True, text=True,
                             check=True).stdout
    assert "FS (Squashfs/*System/amd64)" in listing and "Def.FILE" in listing
    # the main job's SIF is gzip (apptainer's compression; the session's other SIFs of this
    # image are uncompressed, tests/conftest.py), and its self-test ran from it
    part = sif_format.read_info(sif).primary_partition()
    assert part is not None
    superblock = subprocess.run(["unsquashfs", "-o", str(part.offset), "-s", str(sif)],
                                capture_output=True, text=True, check=True).stdout
    assert "compression-level 6" in superblock and "Data is compressed" in superblock
    record = report["stages"]["publish"]
    accept = ("application/vnd.oci.image.manifest.v1+json, "
              "application/vnd.docker.distribution.manifest.v2+json")
    head = requests.head(f"http://{registry.host}/v2/verl-env/manifests/{record['image_digest']}",
                         headers={"Accept": accept}, timeout=30)
    assert head.status_code == 200
    assert head.headers["Docker-Content-Digest"] == record["image_digest"]
    assert record["sif"]["size"] == sif.stat().st_size
    assert record["sif"]["reference"].startswith(f"oras://{registry.host}/verl-env@sha256:")
    assert json.loads((tmp_path / "w" / "publish.json").read_text())["image_digest"] == \
        record["image_digest"]
    attestations = record["attestations"]
    assert attestations["keyid"] == key.keyid
    assert attestations["image"]["subject"] == record["image_digest"]
    assert attestations["sif"]["subject"] == record["sif"]["digest"]
    for ref in (f"{registry.host}/verl-env@{record['image_digest']}", record["sif"]["reference"]):
        remote = run_build_env("trust", "verify", ref, "--key", str(key.public))
        assert remote.returncode == 0, remote.stdout + remote.stderr
        assert "verdict: pass (target cpu-x86_64" in remote.stdout
        assert "level: build" in remote.stdout  # a cpu image: nothing pending
    assert record["verdict"]["level"] == "build" and record["verdict"]["gpu"]["status"] == "none"
    assert f"SIF file: {record['sif']['blob_digest']}" in remote.stdout
