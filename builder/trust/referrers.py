"""Attestations in the registry: each DSSE envelope pushed as an OCI 1.1 referrer of the
manifest it is about (the image's, or the SIF's ORAS artifact's).

One referrer per envelope: an image manifest with ``artifactType``
``application/vnd.in-toto+json``, the empty config (``application/vnd.oci.empty.v1+json``, the
``{}`` blob), one ``application/vnd.dsse.envelope.v1+json`` layer (the envelope's bytes) annotated
with its predicate type, and ``subject`` = the descriptor of the subject manifest as the registry
serves it (digest and size of the raw bytes read back, never of re-serialised JSON).

* Each referrer is pushed by digest **and tagged** ``sha256-<subject hex>.verl-<kind>``: a
  garbage collection with ``--delete-untagged`` would drop an untagged one. Publishing again
  moves the tag to the new referrer.
* A registry with the referrers API says so with an ``OCI-Subject`` header on the push; without
  it (Debian's distribution 2.8) the OCI 1.1 fallback index under tag ``sha256-<subject hex>``
  is kept (read-modify-write; an earlier referrer of ours of the same kind is replaced; the
  referrer is pushed first, into the same repository, as distribution requires).
* cosign's layout too: tag ``sha256-<subject hex>.att``, one manifest whose layers are the same
  envelope blobs annotated ``predicateType`` and ``dev.cosignproject.cosign/signature``, which
  ``cosign verify-attestation --key PUB --insecure-ignore-tlog`` reads (cosign is not on the
  test hosts: untested).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from builder.registry.api import OCI_INDEX, Client, fallback_tag
from builder.trust import dsse
from builder.trust import statements as st

ARTIFACT_TYPE = dsse.INTOTO_PAYLOAD_TYPE
DSSE_MEDIA = "application/vnd.dsse.envelope.v1+json"
EMPTY_MEDIA = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
EMPTY_DIGEST = "sha256:" + hashlib.sha256(EMPTY).hexdigest()
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
PREDICATE_ANNOTATION = "in-toto.io/predicate-type"
KIND_ANNOTATION = "org.verl-env.attestation"
CREATED_ANNOTATION = "org.opencontainers.image.created"
COSIGN_SIGNATURE = "dev.cosignproject.cosign/signature"
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json, "
                  "application/vnd.docker.distribution.manifest.v2+json, "
                  "application/vnd.oci.image.index.v1+json, "
                  "application/vnd.docker.distribution.manifest.list.v2+json")


@dataclass(frozen=True)
class Subject:
    """A manifest as the registry serves it: what a referrer's ``subject`` names."""

    digest: str
    size: int
    media_type: str

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


def read_subject(reg: Client, reference: str) -> Subject:
    """The subject descriptor of ``reference`` (a tag or digest), from the raw bytes served."""
    got = reg.fetch_manifest(reference, MANIFEST_TYPES)
    assert got is not None
    digest, raw, media = got
    if not media:
        media = str(json.loads(raw).get("mediaType") or OCI_MANIFEST)
    return Subject(digest, len(raw), media)


def envelope_bytes(envelope: dict[str, Any]) -> bytes:
    return json.dumps(envelope, sort_keys=True, separators=(",", ":")).encode()


def predicate_type_of(envelope: dict[str, Any]) -> str:
    """The predicate type of a DSSE envelope this tool signed (its payload is a Statement)."""
    stmt = json.loads(base64.b64decode(envelope["payload"]))
    return str(stmt["predicateType"])


def referrer_manifest(blob: bytes, predicate_type: str, subject: Subject, created: str,
                      kind: str | None = None) -> bytes:
    """The OCI 1.1 artifact manifest of one envelope (compact JSON: the bytes pushed are the
    bytes digested). ``kind``: the annotation (default: from the predicate type)."""
    kind = kind or st.KINDS.get(predicate_type, "attestation")
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": EMPTY_MEDIA, "digest": EMPTY_DIGEST, "size": len(EMPTY)},
        "layers": [{"mediaType": DSSE_MEDIA, "size": len(blob),
                    "digest": "sha256:" + hashlib.sha256(blob).hexdigest(),
                    "annotations": {PREDICATE_ANNOTATION: predicate_type}}],
        "subject": subject.descriptor(),
        "annotations": {PREDICATE_ANNOTATION: predicate_type, KIND_ANNOTATION: kind,
                        CREATED_ANNOTATION: created}}
    return json.dumps(manifest, separators=(",", ":")).encode()


def kind_tag(subject: str, predicate_type: str, kind: str | None = None) -> str:
    return f"{fallback_tag(subject)}.verl-{kind or st.KINDS.get(predicate_type, 'attestation')}"


def cosign_tag(subject: str) -> str:
    return f"{fallback_tag(subject)}.att"


def cosign_manifest(blobs: list[tuple[bytes, str]]) -> tuple[bytes, bytes]:
    """cosign's attestation image: (config bytes, manifest bytes); one layer per envelope."""
    digests = ["sha256:" + hashlib.sha256(b).hexdigest() for b, _ in blobs]
    config = json.dumps({"architecture": "", "created": "0001-01-01T00:00:00Z",
                         "history": [{"created": "0001-01-01T00:00:00Z"}] * len(blobs),
                         "os": "", "rootfs": {"type": "layers", "diff_ids": digests},
                         "config": {}}, separators=(",", ":")).encode()
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "size": len(config),
                   "digest": "sha256:" + hashlib.sha256(config).hexdigest()},
        "layers": [{"mediaType": DSSE_MEDIA, "size": len(b), "digest": d,
                    "annotations": {COSIGN_SIGNATURE: "", "predicateType": ptype}}
                   for (b, ptype), d in zip(blobs, digests)]}
    return config, json.dumps(manifest, separators=(",", ":")).encode()


def attach(reg: Client, subject: Subject, envelopes: list[dict[str, Any]], *,
           kind: str | None = None, cosign: bool = True) -> dict[str, Any]:
    """Push ``envelopes`` as referrers of ``subject`` (tagged; the fallback index kept when the
    registry has no referrers API) and, with ``cosign``, the cosign ``.att`` copy. Idempotent:
    blobs the registry holds are not sent again, manifests go by digest, the index is
    deduplicated. ``kind`` names the referrer (its tag and the index entry it replaces; default:
    from the predicate type): a cluster verdict's is its own, so that several live side by side.
    Returns what was pushed, for the publish record."""
    created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    reg.put_blob(EMPTY, EMPTY_DIGEST)
    pushed: list[dict[str, Any]] = []
    blobs: list[tuple[bytes, str]] = []
    api = False
    index_tag = None
    for envelope in envelopes:
        blob, ptype = envelope_bytes(envelope), predicate_type_of(envelope)
        reg.put_blob(blob, "sha256:" + hashlib.sha256(blob).hexdigest())
        blobs.append((blob, ptype))
        this = kind or st.KINDS.get(ptype, "attestation")
        manifest = referrer_manifest(blob, ptype, subject, created, this)
        digest, has_api = reg.push_referrer(manifest, OCI_MANIFEST)
        tag = kind_tag(subject.digest, ptype, this)
        reg.put_manifest(tag, manifest, OCI_MANIFEST)
        api = api or has_api
        if not has_api:
            descriptor = {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(manifest),
                          "artifactType": ARTIFACT_TYPE,
                          "annotations": {PREDICATE_ANNOTATION: ptype, KIND_ANNOTATION: this,
                                          CREATED_ANNOTATION: created}}

            def same_kind(entry: dict[str, Any], kind: str = this) -> bool:
                return (entry.get("artifactType") == ARTIFACT_TYPE
                        and (entry.get("annotations") or {}).get(KIND_ANNOTATION) == kind)

            index_tag = reg.add_to_fallback_index(subject.digest, descriptor, same_kind)
        pushed.append({"kind": this, "predicate_type": ptype, "digest": digest, "tag": tag})
    att = None
    if cosign:
        config, manifest = cosign_manifest(blobs)
        reg.put_blob(config, "sha256:" + hashlib.sha256(config).hexdigest())
        att = cosign_tag(subject.digest)
        reg.put_manifest(att, manifest, OCI_MANIFEST)
    return {"subject": subject.digest, "referrers": pushed, "referrers_api": api,
            "fallback_index": index_tag, "cosign_tag": att}


__all__ = ["ARTIFACT_TYPE", "DSSE_MEDIA", "EMPTY_DIGEST", "EMPTY_MEDIA", "KIND_ANNOTATION",
           "OCI_INDEX", "PREDICATE_ANNOTATION", "Subject", "attach", "cosign_tag", "kind_tag",
           "read_subject", "referrer_manifest"]
