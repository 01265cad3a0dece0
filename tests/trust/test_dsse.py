"""DSSE envelopes against the spec's encoding and an independent ECDSA implementation (the
``openssl`` command), both ways."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest

from builder.errors import TrustError
from builder.trust import dsse
from builder.trust.keys import KeyFiles, load_private, load_public
from tests.trust.conftest import need


def test_pae_matches_the_dsse_protocol_example() -> None:
    # secure-systems-lab/dsse protocol.md: PAE("http://example.com/HelloWorld", "hello world")
    assert dsse.pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world")


def test_openssl_verifies_our_envelope_and_we_verify_openssl_s(
        keypair: KeyFiles, tmp_path: Path) -> None:
    need("openssl")
    payload = json.dumps({"_type": "https://in-toto.io/Statement/v1", "x": "é"}).encode()
    env = dsse.sign(payload, load_private(keypair.private))
    # The test builds the PAE itself and lets openssl check the DER signature.
    pae = b"DSSEv1 %d %s %d %s" % (len(dsse.INTOTO_PAYLOAD_TYPE), dsse.INTOTO_PAYLOAD_TYPE.encode(),
                                   len(payload), payload)
    (tmp_path / "pae").write_bytes(pae)
    (tmp_path / "sig").write_bytes(base64.b64decode(env["signatures"][0]["sig"]))
    ok = subprocess.run(["openssl", "dgst", "-sha256", "-verify", str(keypair.public),
                         "-signature", str(tmp_path / "sig"), str(tmp_path / "pae")],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and "Verified OK" in ok.stdout, ok.stdout + ok.stderr
    # And the other way: openssl signs, dsse.verify accepts; one changed payload byte does not.
    subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(keypair.private), "-out",
                    str(tmp_path / "sig2"), str(tmp_path / "pae")], check=True)
    theirs = {"payloadType": dsse.INTOTO_PAYLOAD_TYPE,
              "payload": base64.b64encode(payload).decode(),
              "signatures": [{"keyid": env["signatures"][0]["keyid"],
                              "sig": base64.b64encode((tmp_path / "sig2").read_bytes()).decode()}]}
    assert dsse.verify(theirs, [load_public(keypair.public)], "t:1").payload == payload
    theirs["payload"] = base64.b64encode(payload.replace(b"x", b"y")).decode()
    with pytest.raises(TrustError, match="t:1: signature by key .* does not verify"):
        dsse.verify(theirs, [load_public(keypair.public)], "t:1")
