"""The SIF's native signature checked by an implementation written here, not the code under
test: the real ``gpg`` verifies the clear-signed object, and the digests it signs are recomputed
from the file with this test's own byte offsets (sylabs sif v2: pkg/sif/descriptor.go
``GetIntegrityReader``, pkg/integrity/metadata.go), in Go ``json.Marshal`` form."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from builder.trust import statements as st
from builder.trust.keys import KeyFiles
from builder.trust.sign import sign_sif
from builder.gate.verdicts import Verdict
from tests.trust.conftest import RELEASE_VERDICT

SIGNATURE, GROUP_FLAG = 0x4005, 0xF0000000


def _le(raw: bytes, signed: bool = True) -> int:
    return int.from_bytes(raw, "little", signed=signed)


def _descriptors(data: bytes) -> list[dict]:
    """The SIF descriptor table, parsed by explicit offsets (585 bytes each)."""
    count, table_off = _le(data[88:96]), _le(data[96:104])  # header: dtotal, descroff
    out = []
    for i in range(count):
        e = data[table_off + 585 * i: table_off + 585 * (i + 1)]
        if not e[4]:  # Used
            continue
        out.append({"type": _le(e[0:4]), "used": e[4:5], "id": _le(e[5:9], False),
                    "group": _le(e[9:13], False), "link": _le(e[13:17], False),
                    "offset": _le(e[17:25]), "size": _le(e[25:33]), "raw_type": e[0:4],
                    "raw_link": e[13:17], "raw_size": e[25:33], "raw_ctime": e[41:49],
                    "raw_uid": e[57:65], "raw_gid": e[65:73], "name": e[73:201],
                    "extra": e[201:585]})
    return out


def expected_metadata(sif: Path) -> bytes:
    data = sif.read_bytes()
    header = data[0:32] + data[32:42] + data[42:45] + data[48:64]  # launch, magic, version, UUID
    group = sorted((d for d in _descriptors(data) if d["group"] == GROUP_FLAG | 1),
                   key=lambda d: d["id"])
    min_id = group[0]["id"]
    objects = []
    for d in group:
        integrity = (d["raw_type"] + d["used"] + (d["id"] - min_id).to_bytes(4, "little")
                     + d["raw_link"] + d["raw_size"] + d["raw_ctime"] + d["raw_uid"]
                     + d["raw_gid"] + d["name"] + d["extra"])
        body = data[d["offset"]: d["offset"] + d["size"]]
        objects.append('{"relativeId":%d,"descriptorDigest":"sha256:%s","objectDigest":'
                       '"sha256:%s"}' % (d["id"] - min_id, hashlib.sha256(integrity).hexdigest(),
                                         hashlib.sha256(body).hexdigest()))
    return ('{"version":1,"header":{"digest":"sha256:%s"},"objects":[%s]}'
            % (hashlib.sha256(header).hexdigest(), ",".join(objects))).encode()


def test_gpg_and_recomputed_digests_accept_the_signature_and_catch_a_flip(
        sif: Path, keypair: KeyFiles, report: Path, sbom_doc: dict, gnupg: dict[str, str],
        tmp_path: Path) -> None:
    sign_sif(sif, Verdict.from_dict(RELEASE_VERDICT), sbom_doc,
             st.ProvenanceInputs.from_report(report), keypair.private, keypair.pgp_private)
    data = sif.read_bytes()
    descriptors = _descriptors(data)
    sigs = [d for d in descriptors if d["type"] == SIGNATURE]
    assert len(sigs) == 1
    sig = sigs[0]
    assert sig["group"] == GROUP_FLAG and sig["link"] == GROUP_FLAG | 1  # no group; links group 1
    assert _le(sig["extra"][0:4]) == 1  # hash type SHA-256
    assert sig["extra"][4:24].hex().upper() == keypair.pgp_fingerprint
    grouped = [d for d in descriptors if d["group"] == GROUP_FLAG | 1]
    assert {d["name"].rstrip(b"\0") for d in grouped} >= {b"verl-sbom.cdx.json",
                                                          b"verl-verdict.json"}
    assert all(d["group"] != GROUP_FLAG or d["type"] == SIGNATURE for d in descriptors)

    signed_file = tmp_path / "signature.asc"
    signed_file.write_bytes(data[sig["offset"]: sig["offset"] + sig["size"]])
    subprocess.run(["gpg", "--batch", "-q", "--import", str(keypair.pgp_public)], env=gnupg,
                   check=True, capture_output=True)
    status = subprocess.run(["gpg", "--batch", "--status-fd", "1", "--verify", str(signed_file)],
                            env=gnupg, capture_output=True, text=True)
    assert status.returncode == 0, status.stderr
    assert f"[GNUPG:] VALIDSIG {keypair.pgp_fingerprint} " in status.stdout
    plain = subprocess.run(["gpg", "--batch", "-q", "--decrypt", str(signed_file)], env=gnupg,
                           check=True, capture_output=True).stdout
    # gpg ends the printed text with the line break that precedes the armour; the signed text
    # (RFC 4880 §7.1) is the JSON alone, one line, exactly as Go's json.Marshal writes it.
    assert plain.endswith(b"\n") and plain.count(b"\n") == 1
    plain = plain[:-1]
    assert plain == expected_metadata(sif)

    # One flipped byte in the squashfs: gpg still vouches for the signed text, but the text no
    # longer describes the file.
    part = next(d for d in descriptors if d["type"] == 0x4004)
    with open(sif, "r+b") as f:
        f.seek(part["offset"] + 100)
        b = f.read(1)
        f.seek(part["offset"] + 100)
        f.write(bytes([b[0] ^ 0x80]))
    assert plain != expected_metadata(sif)

    # A keyring without the signer's key does not accept it (gpg really checks the key).
    empty = tmp_path / "empty-gnupg"
    empty.mkdir(mode=0o700)
    env = {**gnupg, "GNUPGHOME": str(empty)}
    try:
        other = subprocess.run(["gpg", "--batch", "--status-fd", "1", "--verify",
                                str(signed_file)], env=env, capture_output=True, text=True)
    finally:
        subprocess.run(["gpgconf", "--kill", "all"], env=env, capture_output=True)
    assert other.returncode != 0 and "VALIDSIG" not in other.stdout
    assert f"[GNUPG:] NO_PUBKEY {keypair.pgp_fingerprint[-16:]}" in other.stdout
