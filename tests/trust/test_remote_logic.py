"""Pure logic of the registry check and the referrer layout: reference parsing, tags, the
manifest bytes, and the choice between the referrers API and the fallback index (with a stub
client: the real registry paths are in tests/publish/test_attestations.py)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from builder.errors import PublishError, TrustError
from builder.registry.api import fallback_tag
from builder.trust import referrers, remote

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize("text,host,repo,ref,oras", [
    (f"registry.site:5000/verl/cuda@{DIGEST}", "registry.site:5000", "verl/cuda", DIGEST, False),
    ("localhost:5000/verl:cpu", "localhost:5000", "verl", "cpu", False),
    (f"oras://127.0.0.1:5000/a/b:cpu-sif@{DIGEST}", "127.0.0.1:5000", "a/b", DIGEST, True),
])
def test_parse(text: str, host: str, repo: str, ref: str, oras: bool) -> None:
    parsed = remote.parse(text)
    assert (parsed.host, parsed.repo, parsed.reference, parsed.oras) == (host, repo, ref, oras)
    assert remote.looks_like_reference(text)


@pytest.mark.parametrize("text", ["out/cuda.sif", "cuda.sif", "build/cpu-x86_64/x.sif",
                                  "registry.site/verl/cuda"])
def test_paths_are_not_references(text: str) -> None:
    assert not remote.looks_like_reference(text)


def test_parse_refuses_what_it_cannot_check() -> None:
    with pytest.raises(TrustError, match="name the tag or, better, the digest"):
        remote.parse("registry.site/verl/cuda")
    with pytest.raises(TrustError, match="not a registry reference"):
        remote.parse("registry.site/Verl/UPPER:x")


def test_tags() -> None:
    assert fallback_tag(DIGEST) == "sha256-" + "ab" * 32
    assert referrers.cosign_tag(DIGEST) == "sha256-" + "ab" * 32 + ".att"
    assert referrers.kind_tag(DIGEST, "https://cyclonedx.org/bom").endswith(".verl-sbom")
    assert len(referrers.kind_tag(DIGEST, "https://verl-env.dev/verification/v1")) <= 128
    with pytest.raises(PublishError, match="not a digest"):
        fallback_tag("latest")


def test_referrer_manifest_layout() -> None:
    blob = b'{"payloadType":"application/vnd.in-toto+json"}'
    subject = referrers.Subject(DIGEST, 1234, "application/vnd.docker.distribution.manifest.v2+json")
    raw = referrers.referrer_manifest(blob, "https://slsa.dev/provenance/v1", subject, "T")
    m = json.loads(raw)
    assert m["artifactType"] == "application/vnd.in-toto+json"
    assert m["subject"] == {"mediaType": subject.media_type, "digest": DIGEST, "size": 1234}
    assert m["config"]["digest"] == "sha256:" + hashlib.sha256(b"{}").hexdigest()
    (layer,) = m["layers"]
    assert layer == {"mediaType": "application/vnd.dsse.envelope.v1+json", "size": len(blob),
                     "digest": "sha256:" + hashlib.sha256(blob).hexdigest(),
                     "annotations": {"in-toto.io/predicate-type": "https://slsa.dev/provenance/v1"}}
    assert m["annotations"]["org.verl-env.attestation"] == "provenance"


class StubClient:
    def __init__(self, api: list[dict[str, Any]] | None, index: dict[str, Any] | None) -> None:
        self.api, self.index = api, index

    def referrers(self, digest: str, artifact_type: str | None = None) -> Any:
        return self.api

    def fallback_index(self, digest: str) -> Any:
        return None if self.index is None else ("sha256:" + "0" * 64, self.index)


INTOTO = {"artifactType": "application/vnd.in-toto+json", "digest": DIGEST}
OTHER = {"artifactType": "application/vnd.dev.cosign.artifact.sig.v1+json", "digest": DIGEST}


def test_referrers_api_first_then_fallback() -> None:
    ref = remote.parse(f"r.site/x@{DIGEST}")
    found, source = remote._descriptors(StubClient([INTOTO], {"manifests": []}), ref, DIGEST)
    assert found == [INTOTO] and source == "referrers API"
    found, source = remote._descriptors(StubClient(None, {"manifests": [OTHER, INTOTO]}), ref,
                                        DIGEST)
    assert found == [INTOTO] and source == f"fallback tag {fallback_tag(DIGEST)}"
    # an API that lists nothing: the fallback index is still read
    found, _ = remote._descriptors(StubClient([], {"manifests": [INTOTO]}), ref, DIGEST)
    assert found == [INTOTO]
    with pytest.raises(TrustError, match="has no referrers API and there is no fallback tag"):
        remote._descriptors(StubClient(None, None), ref, DIGEST)
    with pytest.raises(TrustError, match="lists no application/vnd.in-toto"):
        remote._descriptors(StubClient(None, {"manifests": [OTHER]}), ref, DIGEST)
