"""Key pairs for attestations (ECDSA P-256, PKCS#8 PEM) and SIF signatures (OpenPGP RSA-3072).

The OpenPGP side uses PGPy (pure Python, in-process): no ``gpg-agent`` daemon to start and stop,
no keyring directory whose state leaks between runs, one key file in, one signature out. The
tests check its output with the real ``gpg`` (an independent implementation).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from builder.errors import TrustError
from builder.files import atomic_write_text

PRIVATE_NAME, PUBLIC_NAME = "verl-env.key", "verl-env.pub"
PGP_PRIVATE_NAME, PGP_PUBLIC_NAME = "verl-env-sif.key.asc", "verl-env-sif.pub.asc"


@dataclass(frozen=True)
class KeyFiles:
    private: Path
    public: Path
    keyid: str
    pgp_private: Path | None = None
    pgp_public: Path | None = None
    pgp_fingerprint: str | None = None


def keyid(public: ec.EllipticCurvePublicKey) -> str:
    """sha256 (hex) of the public key's SubjectPublicKeyInfo DER: the DSSE ``keyid``."""
    der = public.public_bytes(serialization.Encoding.DER,
                              serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _write_private(path: Path, data: str) -> None:
    """Mode 0600 from the first byte; never overwrites an existing key."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise TrustError(f"{path}: exists; refusing to overwrite a key") from None
    with os.fdopen(fd, "w") as f:
        f.write(data)


def load_private(path: Path) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise TrustError(f"{path}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise TrustError(f"{path}: not an ECDSA P-256 key")
    return key


def load_public(path: Path) -> ec.EllipticCurvePublicKey:
    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise TrustError(f"{path}: not a PEM public key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise TrustError(f"{path}: not an ECDSA P-256 public key")
    return key


def pgpy_module() -> Any:
    """PGPy, or a TrustError saying why it cannot load (0.6 imports ``imghdr``, which Python 3.13
    removed)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pgpy
    except ImportError as exc:
        raise TrustError(f"OpenPGP support (PGPy) cannot be imported: {exc}; SIF signatures "
                         "need PGPy 0.6 on Python < 3.13") from None
    return pgpy


def load_pgp(path: Path, *, private: bool) -> Any:
    pgpy = pgpy_module()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            key, _ = pgpy.PGPKey.from_file(str(path))
        except (OSError, ValueError, pgpy.errors.PGPError) as exc:
            raise TrustError(f"{path}: not an OpenPGP key ({exc})") from None
    if private and key.is_public:
        raise TrustError(f"{path}: an OpenPGP public key; signing needs the private key")
    if private and key.is_protected:
        raise TrustError(f"{path}: the OpenPGP key is passphrase-protected; use an unprotected "
                         "signing key on the build host")
    return key


def pgp_fingerprint(key: Any) -> str:
    return str(key.fingerprint).replace(" ", "").upper()


def generate(directory: Path, *, pgp: bool = False, name: str = "verl-env signing key",
             email: str = "verl-env@localhost") -> KeyFiles:
    """Write ``verl-env.key``/``.pub`` (and with ``pgp`` the OpenPGP pair) into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    targets = [directory / PRIVATE_NAME, directory / PUBLIC_NAME]
    if pgp:
        targets += [directory / PGP_PRIVATE_NAME, directory / PGP_PUBLIC_NAME]
    existing = [str(p) for p in targets if p.exists()]
    if existing:
        raise TrustError(f"{', '.join(existing)}: exists; refusing to overwrite a key")
    key = ec.generate_private_key(ec.SECP256R1())
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    pgp_key = _new_pgp(name, email) if pgp else None  # before writing anything
    _write_private(targets[0], private_pem)
    atomic_write_text(targets[1], public_pem)
    files = KeyFiles(targets[0], targets[1], keyid(key.public_key()))
    if pgp_key is not None:
        _write_private(targets[2], str(pgp_key))
        atomic_write_text(targets[3], str(pgp_key.pubkey))
        files = KeyFiles(targets[0], targets[1], files.keyid, targets[2], targets[3],
                         pgp_fingerprint(pgp_key))
    return files


def _new_pgp(name: str, email: str) -> Any:
    pgpy = pgpy_module()
    # PGPy loads in about 0.5 s (pgpy_module): only the OpenPGP signature pays for it
    from pgpy.constants import (CompressionAlgorithm, HashAlgorithm, KeyFlags, PubKeyAlgorithm,
                                SymmetricKeyAlgorithm)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        key = pgpy.PGPKey.new(PubKeyAlgorithm.RSAEncryptOrSign, 3072)
        key.add_uid(pgpy.PGPUID.new(name, email=email), usage={KeyFlags.Sign, KeyFlags.Certify},
                    hashes=[HashAlgorithm.SHA256], ciphers=[SymmetricKeyAlgorithm.AES256],
                    compression=[CompressionAlgorithm.Uncompressed])
    return key
