"""DSSE envelopes signed and checked with a local ECDSA P-256 key (``cryptography`` only).

The signature covers the pre-authentication encoding ``DSSEv1 <len> <type> <len> <body>``
(DSSE v1 protocol); ECDSA-SHA256, DER signature, standard base64. ``keyid`` is the sha256 of the
public key's DER (see :func:`builder.trust.keys.keyid`), so an envelope names the key it needs.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from builder.errors import TrustError
from builder.trust.keys import keyid

INTOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"


def pae(payload_type: str, body: bytes) -> bytes:
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def sign(payload: bytes, key: ec.EllipticCurvePrivateKey,
         payload_type: str = INTOTO_PAYLOAD_TYPE) -> dict[str, Any]:
    sig = key.sign(pae(payload_type, payload), ec.ECDSA(hashes.SHA256()))
    return {"payloadType": payload_type, "payload": base64.b64encode(payload).decode(),
            "signatures": [{"keyid": keyid(key.public_key()),
                            "sig": base64.b64encode(sig).decode()}]}


@dataclass(frozen=True)
class Verified:
    payload_type: str
    payload: bytes
    keyid: str


def verify(envelope: Any, keys: list[ec.EllipticCurvePublicKey], where: str) -> Verified:
    """The payload when one signature verifies with one of ``keys``; else TrustError naming
    ``where`` (file:line) and why (malformed, unknown key, bad signature)."""
    if not isinstance(envelope, dict):
        raise TrustError(f"{where}: not a DSSE envelope (a JSON object)")
    try:
        payload_type = envelope["payloadType"]
        payload = base64.b64decode(envelope["payload"], validate=True)
        signatures = envelope["signatures"]
    except (KeyError, TypeError, binascii.Error) as exc:
        raise TrustError(f"{where}: malformed DSSE envelope ({exc.__class__.__name__}: {exc})"
                         ) from None
    if not isinstance(payload_type, str) or not isinstance(signatures, list) or not signatures:
        raise TrustError(f"{where}: DSSE envelope has no payloadType or no signatures")
    by_id = {keyid(k): k for k in keys}
    seen = []
    for s in signatures:
        kid = s.get("keyid", "") if isinstance(s, dict) else ""
        seen.append(kid or "(none)")
        key = by_id.get(kid)
        if key is None:
            continue
        try:
            key.verify(base64.b64decode(s.get("sig", ""), validate=True), pae(payload_type, payload),
                       ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, binascii.Error, ValueError):
            raise TrustError(f"{where}: signature by key {kid[:16]} does not verify (the "
                             "envelope was altered, or signed by another key under this id)"
                             ) from None
        return Verified(payload_type, payload, kid)
    raise TrustError(f"{where}: signed by unknown key(s) {', '.join(k[:16] for k in seen)}; "
                     f"trusted: {', '.join(k[:16] for k in by_id) or 'none'}")


def statement_of(verified: Verified, where: str) -> dict[str, Any]:
    if verified.payload_type != INTOTO_PAYLOAD_TYPE:
        raise TrustError(f"{where}: payloadType {verified.payload_type!r}, expected "
                         f"{INTOTO_PAYLOAD_TYPE}")
    try:
        statement = json.loads(verified.payload)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TrustError(f"{where}: payload is not JSON ({exc})") from None
    if not isinstance(statement, dict):
        raise TrustError(f"{where}: payload is not an in-toto Statement")
    return statement
