"""The SIF's native signature checked by the reference implementation: sylabs ``sif`` v2
``pkg/integrity`` (the verifier ``apptainer verify`` runs), compiled offline from Debian's
``golang-github-sylabs-sif-dev`` into a small program (``sifverify/main.go``, cached)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from builder.sif import format as sif_format
from builder.trust import statements as st
from builder.trust.keys import KeyFiles
from builder.trust.sign import sign_sif
from builder.gate.verdicts import Verdict
from tests.trust.conftest import RELEASE_VERDICT

SOURCE = Path(__file__).parent / "sifverify" / "main.go"
GOCODE = Path("/usr/share/gocode/src")


@pytest.fixture(scope="session")
def sifverify() -> Path:
    if shutil.which("go") is None or not (GOCODE / "github.com/sylabs/sif/pkg/integrity").is_dir():
        pytest.skip("no Go toolchain or sylabs sif sources (apt-get install golang-go "
                    "golang-github-sylabs-sif-dev)")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "verl-env"
    binary = cache / f"sifverify-{hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]}"
    if binary.exists():
        return binary
    gopath = cache / "sifverify-gopath"
    pkg = gopath / "src" / "sifverify"
    pkg.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SOURCE, pkg / "main.go")
    v2 = gopath / "src/github.com/sylabs/sif/v2"  # the module's /v2 import path, GOPATH mode
    v2.parent.mkdir(parents=True, exist_ok=True)
    if not v2.is_symlink():
        v2.symlink_to(GOCODE / "github.com/sylabs/sif")
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": f"{gopath}:{GOCODE.parent}",
           "GOCACHE": str(cache / "go-build"), "GOFLAGS": ""}
    proc = subprocess.run(["go", "build", "-o", str(binary), "."], cwd=pkg, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return binary


def _check(binary: Path, sif: Path, key: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary), str(sif), str(key)], capture_output=True, text=True,
                          timeout=120)


def test_the_reference_verifier_accepts_our_signature_and_refuses_tampering(
        sifverify: Path, sif: Path, keypair: KeyFiles, other_keypair: KeyFiles, report: Path,
        sbom_doc: dict) -> None:
    unsigned = _check(sifverify, sif, keypair.pgp_public)
    assert unsigned.returncode == 1 and "signature not found for object group 1" in unsigned.stdout
    sign_sif(sif, Verdict.from_dict(RELEASE_VERDICT), sbom_doc,
             st.ProvenanceInputs.from_report(report), keypair.private, keypair.pgp_private)
    ok = _check(sifverify, sif, keypair.pgp_public)
    assert ok.returncode == 0 and ok.stdout.strip() == "OK", ok.stdout + ok.stderr
    other = _check(sifverify, sif, other_keypair.pgp_public)
    assert other.returncode == 1, other.stdout
    verdict = next(d for d in sif_format.read_raw(sif).group(1) if d.name == "verl-verdict.json")
    with open(sif, "r+b") as f:
        f.seek(verdict.offset + 2)
        b = f.read(1)
        f.seek(verdict.offset + 2)
        f.write(bytes([b[0] ^ 0x01]))
    flipped = _check(sifverify, sif, keypair.pgp_public)
    assert flipped.returncode == 1
    assert f"data object integrity compromised: {verdict.ident}" in flipped.stdout
