"""``build-env trust keygen``: real keys, readable by other implementations."""

from __future__ import annotations

import re
import stat
import subprocess
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from builder.trust.keys import keyid
from tests.conftest import run_build_env


def test_keygen_writes_p256_pkcs8_and_an_openpgp_key_gpg_accepts(
        tmp_path: Path, gnupg: dict[str, str]) -> None:
    out = tmp_path / "keys"
    proc = run_build_env("trust", "keygen", str(out), "--pgp", "--name", "Site CI",
                         "--email", "ci@example.invalid", timeout=300)
    assert proc.returncode == 0, proc.stderr
    private, public = out / "verl-env.key", out / "verl-env.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "verl-env-sif.key.asc").stat().st_mode) == 0o600
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----")  # PKCS#8, unencrypted
    key = serialization.load_pem_private_key(private.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    pub = serialization.load_pem_public_key(public.read_bytes())
    assert pub.public_numbers() == key.public_key().public_numbers()
    assert f"keyid {keyid(key.public_key())}" in proc.stdout
    fpr = re.search(r"fingerprint ([0-9A-F]{40})", proc.stdout)
    assert fpr, proc.stdout
    # The real gpg reads the public key: RSA 3072, signing capability, same fingerprint.
    subprocess.run(["gpg", "--batch", "-q", "--import", str(out / "verl-env-sif.pub.asc")],
                   env=gnupg, check=True, capture_output=True)
    listing = subprocess.run(["gpg", "--batch", "--with-colons", "--list-keys"], env=gnupg,
                             check=True, capture_output=True, text=True).stdout
    pub_line = next(line for line in listing.splitlines() if line.startswith("pub:"))
    fields = pub_line.split(":")
    assert fields[2] == "3072" and fields[3] == "1" and "s" in fields[11].lower(), pub_line
    assert f"fpr:::::::::{fpr.group(1)}:" in listing
    assert "Site CI <ci@example.invalid>" in listing


def test_keygen_never_overwrites_a_key(tmp_path: Path) -> None:
    out = tmp_path / "keys"
    assert run_build_env("trust", "keygen", str(out), timeout=300).returncode == 0
    before = (out / "verl-env.key").read_bytes()
    proc = run_build_env("trust", "keygen", str(out), timeout=300)
    assert proc.returncode == 1
    assert f"{out / 'verl-env.key'}" in proc.stderr and "refusing to overwrite" in proc.stderr
    assert (out / "verl-env.key").read_bytes() == before
