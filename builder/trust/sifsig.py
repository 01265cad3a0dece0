"""The native Apptainer SIF signature (sylabs ``sif`` v2 ``pkg/integrity``), made and checked here.

A signature is a type-5 data object outside every group, linked to its group
(``LinkedID = 0xf0000000|group``), whose descriptor extra holds the hash type and the signer's
20-byte OpenPGP fingerprint, and whose data is an OpenPGP clear-signed JSON (Go ``json.Marshal``
form: no spaces, struct key order)::

    {"version":1,"header":{"digest":"sha256:<hex>"},
     "objects":[{"relativeId":0,"descriptorDigest":"sha256:<hex>","objectDigest":"sha256:<hex>"}]}

covering the header (launch script, magic, version, UUID) and every object of the group: its
descriptor's integrity fields and its data. ``apptainer verify`` accepts it. The object is added
with ``siftool add`` (the reference implementation); PGPy clear-signs.
"""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any

from builder.errors import TrustError
from builder.sif import format as sif_format
from builder.sif.format import RawDescriptor, RawSif, SifFormatError
from builder.trust.keys import load_pgp, pgp_fingerprint

SIGNATURE_EXTRA = struct.Struct("<i20s")


def read_sif(path: Path) -> RawSif:
    """The SIF's header and descriptors as stored (:func:`builder.sif.format.read_raw`); a
    TrustError naming the file when it is no SIF or cannot be read."""
    try:
        return sif_format.read_raw(path)
    except SifFormatError:
        raise TrustError(f"{path}: not a SIF file (no SIF magic)") from None
    except OSError as exc:
        raise TrustError(f"{path}: cannot read ({exc.strerror})") from None


def read_sif_object(path: Path, d: RawDescriptor, limit: int = 64 << 20) -> bytes:
    """The bytes of a small object of the SIF (TrustError when it is too large)."""
    if d.size > limit:
        raise TrustError(f"{path}: object {d.ident} is {d.size} bytes; too large to read")
    return sif_format.read_object(path, d, limit)


def _object_digest(path: Path, d: RawDescriptor) -> str:
    try:
        return sif_format.object_digest(path, d)
    except SifFormatError as exc:
        raise TrustError(str(exc)) from None


def metadata(path: Path, group: int = 1) -> dict[str, Any]:
    sif = read_sif(path)
    members = sif.group(group)
    if not members:
        raise TrustError(f"{path}: object group {group} is empty; nothing to sign")
    min_id = members[0].ident
    return {"version": 1,
            "header": {"digest": "sha256:" + hashlib.sha256(sif.header_integrity).hexdigest()},
            "objects": [{"relativeId": d.ident - min_id,
                         "descriptorDigest": "sha256:" + hashlib.sha256(
                             d.integrity_bytes(min_id)).hexdigest(),
                         "objectDigest": "sha256:" + _object_digest(path, d)}
                        for d in members]}


def encode(md: dict[str, Any]) -> str:
    """Go ``json.Marshal`` of the metadata (the dict is built in struct field order)."""
    return json.dumps(md, separators=(",", ":"))


def sign_group(path: Path, pgp_key_path: Path, group: int = 1) -> str:
    """Clear-sign group ``group`` of ``path`` and add the signature object; returns the
    signer's fingerprint."""
    key = load_pgp(pgp_key_path, private=True)
    # PGPy loads in about 0.5 s: only the OpenPGP signature pays for it (keys.pgpy_module)
    from pgpy import PGPMessage
    from pgpy.constants import HashAlgorithm

    fpr = pgp_fingerprint(key)
    if read_sif(path).signatures_of(group):
        raise TrustError(f"{path}: object group {group} is already signed")
    text = encode(metadata(path, group))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        msg = PGPMessage.new(text, cleartext=True)
        msg |= key.sign(msg, hash=HashAlgorithm.SHA256)
    with tempfile.TemporaryDirectory(prefix="verl-env-sifsig-") as tmp:
        sig = Path(tmp) / "signature"
        sig.write_text(str(msg))
        siftool_add(path, sig, "--datatype", "5", "--signentity", fpr, "--signhash",
                    str(sif_format.HASH_SHA256), "--link", str(sif_format.GROUP_MASK | group))
    return fpr


def siftool_add(path: Path, obj: Path, *flags: str) -> None:
    try:
        proc = subprocess.run(["siftool", "add", str(path), str(obj), *flags],
                              capture_output=True, text=True, timeout=600)
    except FileNotFoundError:
        raise TrustError("siftool is not installed (apt-get install siftool)") from None
    if proc.returncode != 0:
        raise TrustError(f"{path}: siftool add {' '.join(flags)} failed: "
                         f"{(proc.stderr or proc.stdout).strip()[-500:]}")


def verify_group(path: Path, pgp_public_path: Path, group: int = 1) -> str:
    """Check group ``group``'s signature with the public key; returns the fingerprint.
    TrustError names what does not match (no signature, other signer, changed object)."""
    public = load_pgp(pgp_public_path, private=False)
    # PGPy loads in about 0.5 s: only the OpenPGP check pays for it (keys.pgpy_module)
    from pgpy import PGPMessage

    fpr = pgp_fingerprint(public)
    sif = read_sif(path)
    ungrouped = [d for d in sif.descriptors
                 if d.group == 0 and d.datatype != sif_format.DATA_SIGNATURE]
    if ungrouped:
        raise TrustError(f"{path}: object {ungrouped[0].ident} ({ungrouped[0].name}) is in no "
                         "object group; apptainer verify refuses such a SIF")
    sigs = sif.signatures_of(group)
    if not sigs:
        raise TrustError(f"{path}: no PGP signature for object group {group}")
    problems = []
    for d in sigs:
        _hash, entity = SIGNATURE_EXTRA.unpack_from(d.extra)
        if entity.hex().upper() != fpr:
            problems.append(f"signature object {d.ident} is by {entity.hex().upper()}, not {fpr}")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                msg = PGPMessage.from_blob(read_sif_object(path, d).decode())
                good = fpr[-16:] in {s.upper() for s in msg.signers} and bool(public.verify(msg))
            except Exception as exc:  # PGPy raises many types for a malformed message
                problems.append(f"signature object {d.ident} is not a valid clear-signed "
                                f"message ({exc.__class__.__name__}: {exc})")
                continue
        if not good:
            problems.append(f"signature object {d.ident} does not verify with {fpr}")
            continue
        try:
            signed = json.loads(str(msg.message))
        except json.JSONDecodeError:
            problems.append(f"signature object {d.ident} signs no JSON metadata")
            continue
        mismatch = compare(path, signed, group)
        if mismatch:
            raise TrustError(f"{path}: {mismatch} (signed by {fpr})")
        return fpr
    raise TrustError(f"{path}: {'; '.join(problems)}")


def compare(path: Path, signed: dict[str, Any], group: int) -> str | None:
    """Why the file no longer matches the signed metadata (None: it matches)."""
    now = metadata(path, group)
    if signed.get("header") != now["header"]:
        return "the SIF header (launch script, UUID) changed since it was signed"
    before: dict[int, dict[str, Any]] = {
        o["relativeId"]: o for o in signed.get("objects", [])
        if isinstance(o, dict) and isinstance(o.get("relativeId"), int)}
    members = read_sif(path).group(group)
    for o, d in zip(now["objects"], members):
        label = f"object {d.ident} ({d.name or hex(d.datatype)})"
        old = before.pop(o["relativeId"], None)
        if old is None:
            return f"{label} is in group {group} but not signed"
        if old.get("descriptorDigest") != o["descriptorDigest"]:
            return f"descriptor of {label} changed since it was signed"
        if old.get("objectDigest") != o["objectDigest"]:
            return f"data of {label} changed since it was signed"
    if before:
        return f"signed object(s) {sorted(before)} (relative ids) are gone"
    return None
