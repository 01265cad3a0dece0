"""The registry check: ``build-env trust verify HOST/REPO@sha256:... --key PUB`` (or ``:TAG``,
or ``oras://...`` for a SIF artifact).

The reference's manifest is read (its digest is the sha256 of the bytes served; a digest in the
reference must match it); its referrers come from the referrers API, else from the OCI 1.1
fallback tag ``sha256-<hex>``. Every in-toto referrer must: name this manifest as its
``subject``, hold one DSSE envelope layer whose blob matches its digest, be signed by a trusted
key, carry a Statement whose subject is this manifest and whose predicate type is the one its
annotation declares. One verdict, one SBOM and one provenance statement at least, every verdict
a release verdict. For a SIF artifact the statements must also name the SIF file (the artifact's
layer digest). Every failure is a TrustError naming the reference, the referrer or the key.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.audit.result import summary as audit_summary
from builder.gate import verdicts
from builder.cluster.verdict import ClusterVerdict
from builder.errors import PublishError, TrustError
from builder.engine.credentials import resolve_credentials
from builder.registry.api import Client, Transient, fallback_tag, is_loopback
from builder.trust import sbom
from builder.trust import statements as st
from builder.trust.keys import load_public
from builder.trust.referrers import (ARTIFACT_TYPE, DSSE_MEDIA, OCI_MANIFEST,
                                     PREDICATE_ANNOTATION, read_subject)
from builder.trust.signatures import Attested, attested_lines, provenance_summary

SIF_LAYER_MEDIA = "application/vnd.sylabs.sif.layer.v1.sif"
_REF = re.compile(r"(?P<host>[A-Za-z0-9.-]+(?::[0-9]+)?|\[[0-9a-fA-F:]+\](?::[0-9]+)?)/"
                  r"(?P<repo>[a-z0-9]+(?:[._/-][a-z0-9]+)*)"
                  r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
                  r"(?:@(?P<digest>sha256:[a-f0-9]{64}))?")


@dataclass(frozen=True)
class Reference:
    host: str
    repo: str
    reference: str  # the digest when given, else the tag
    oras: bool

    def __str__(self) -> str:
        sep = "@" if self.reference.startswith("sha256:") else ":"
        return f"{'oras://' if self.oras else ''}{self.host}/{self.repo}{sep}{self.reference}"


def looks_like_reference(text: str) -> bool:
    """``oras://...``, or ``HOST/REPO`` with a tag or digest whose host has a dot, a port or is
    localhost (a path to a file never should be taken for one: callers check the file first)."""
    if text.startswith("oras://"):
        return True
    m = _REF.fullmatch(text)
    if not m or not (m.group("tag") or m.group("digest")):
        return False
    host = m.group("host")
    return "." in host or ":" in host or host == "localhost"


def parse(text: str) -> Reference:
    oras = text.startswith("oras://")
    body = text[len("oras://"):] if oras else text
    if body.startswith("docker://"):
        body = body[len("docker://"):]
    m = _REF.fullmatch(body)
    if not m:
        raise TrustError(f"{text!r}: not a registry reference (HOST[:PORT]/REPO@sha256:<hex> or "
                         "HOST[:PORT]/REPO:TAG, oras://... for a SIF)")
    if not (m.group("tag") or m.group("digest")):
        raise TrustError(f"{text!r}: name the tag or, better, the digest (REPO@sha256:<hex>)")
    return Reference(m.group("host"), m.group("repo"), m.group("digest") or m.group("tag"), oras)


@dataclass
class RefChecked(Attested):
    reference: str
    digest: str
    source: str  # "referrers API" or "fallback tag sha256-..."
    referrers: list[str] = field(default_factory=list)
    sif_blob: str | None = None
    clusters: list[ClusterVerdict] = field(default_factory=list)  # newest first
    audit: dict[str, Any] | None = None  # the newest signed `build-env audit` document

    def to_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "digest": self.digest, "source": self.source,
                "referrers": self.referrers, **self.attested_dict(), "sif_blob": self.sif_blob,
                "clusters": [c.to_dict() for c in self.clusters], "audit": self.audit}


def verify_reference(text: str, keys: list[Path], *, insecure: bool = False,
                     require: str = verdicts.BUILD) -> RefChecked:
    """The registry check (see the module doc); ``require``: the verdict level demanded of
    every verdict."""
    if not keys:
        raise TrustError("no public key given (--key verl-env.pub)")
    public = [load_public(k) for k in keys]
    ref = parse(text)
    scheme = "http" if insecure or is_loopback(ref.host) else "https"
    try:
        reg = Client(ref.host, ref.repo, scheme, resolve_credentials(ref.host))
        return _verify(reg, ref, public, require)
    except (PublishError, Transient) as exc:
        message = str(exc).removeprefix("publish: ")
        raise TrustError(f"{ref}: registry: {message}") from None


def _descriptors(reg: Client, ref: Reference, digest: str) -> tuple[list[dict[str, Any]], str]:
    found = reg.referrers(digest, ARTIFACT_TYPE)
    if found:
        return found, "referrers API"
    index = reg.fallback_index(digest)
    tag = fallback_tag(digest)
    if index is None:
        how = ("the referrers API lists none" if found is not None
               else "the registry has no referrers API")
        raise TrustError(f"{ref}: no attestations: {how} and there is no fallback tag {tag}")
    listed = [d for d in index[1]["manifests"]
              if isinstance(d, dict) and d.get("artifactType") == ARTIFACT_TYPE]
    if not listed:
        raise TrustError(f"{ref}: no attestations: the fallback tag {tag} lists no "
                         f"{ARTIFACT_TYPE} referrer")
    return listed, f"fallback tag {tag}"


def _verify(reg: Client, ref: Reference, public: list[Any], require: str) -> RefChecked:
    subject = read_subject(reg, ref.reference)
    digest = subject.digest
    result = RefChecked(str(ref), digest, "")
    sif_blob = _sif_blob(reg, ref, digest) if ref.oras else None
    result.sif_blob = sif_blob
    descriptors, result.source = _descriptors(reg, ref, digest)
    found: dict[str, list[dict[str, Any]]] = {}
    for d in descriptors:
        rdigest = str(d.get("digest", ""))
        where = f"{ref} referrer {rdigest[:19]}"
        if not re.fullmatch(r"sha256:[a-f0-9]{64}", rdigest):
            raise TrustError(f"{where}: not a sha256 digest in the listing")
        got = reg.fetch_manifest(rdigest, OCI_MANIFEST, missing_ok=True)
        if got is None:
            raise TrustError(f"{where}: listed, but the registry does not have it")
        try:
            manifest = json.loads(got[1])
        except ValueError:
            raise TrustError(f"{where}: manifest is not JSON") from None
        if not isinstance(manifest, dict):
            raise TrustError(f"{where}: manifest is not a JSON object")
        if manifest.get("artifactType") != ARTIFACT_TYPE:
            raise TrustError(f"{where}: artifactType {manifest.get('artifactType')!r}, "
                             f"expected {ARTIFACT_TYPE}")
        named = (manifest.get("subject") or {}).get("digest")
        if named != digest:
            raise TrustError(f"{where}: its subject is {named}, not {ref}'s manifest {digest}")
        layers = [x for x in manifest.get("layers") or [] if isinstance(x, dict)]
        if len(layers) != 1 or layers[0].get("mediaType") != DSSE_MEDIA:
            raise TrustError(f"{where}: expected one {DSSE_MEDIA} layer")
        blob = reg.blob(str(layers[0].get("digest", "")))
        try:
            envelope = json.loads(blob)
        except ValueError:
            raise TrustError(f"{where}: the envelope is not JSON") from None
        opened = st.open_statement(envelope, public, where)
        kind, ptype, stmt = opened.kind, opened.predicate_type, opened.statement
        declared = (layers[0].get("annotations") or {}).get(PREDICATE_ANNOTATION)
        if declared != ptype:
            raise TrustError(f"{where}: annotated as {declared!r}, but the signed statement is "
                             f"a {ptype}")
        names = opened.subjects
        if digest.split(":", 1)[1] not in names:
            raise TrustError(f"{where}: the signed statement is about "
                             f"{', '.join('sha256:' + n[:12] for n in names) or 'nothing'}, "
                             f"not {ref}'s manifest {digest}")
        if sif_blob and sif_blob.split(":", 1)[1] not in names:
            raise TrustError(f"{where}: the signed statement does not name the SIF file "
                             f"{sif_blob} of this artifact")
        if not isinstance(stmt.get("predicate"), dict):
            raise TrustError(f"{where}: the {kind} statement has no predicate object")
        if kind == "cluster":
            result.clusters.append(_cluster(stmt, names, where))
        else:
            found.setdefault(kind, []).append(stmt["predicate"])
        result.referrers.append(rdigest)
        result.keyids.append(opened.keyid)
    missing = [k for k in ("verdict", "sbom", "provenance") if k not in found]
    if missing:
        raise TrustError(f"{ref}: no {', '.join(missing)} attestation ({result.source})")
    for predicate in found["verdict"]:
        verdict = st.read_verdict(predicate, f"{ref}: a verdict attestation")
        problem = verdicts.release_problem(verdict, require)
        if problem:
            raise TrustError(f"{ref}: not a release verdict: {problem}")
        result.verdict = verdict
    result.selftest_version = found["verdict"][-1].get("selftestVersion")
    result.pins = sbom.pins_of(found["sbom"][-1])
    result.components = sbom.counts(found["sbom"][-1])
    result.provenance = provenance_summary(found["provenance"][-1])
    result.clusters.sort(key=lambda c: c.recorded_at, reverse=True)
    result.audit = max(found.get("audit") or [None], key=lambda a: str((a or {}).get(
        "audited_at") or ""))
    return result


def _cluster(stmt: dict[str, Any], names: list[str], where: str) -> ClusterVerdict:
    """A cluster verdict attached to the image: it must name the SIF file the statement also
    names (the image it ran is the one this manifest describes)."""
    try:
        verdict = ClusterVerdict.from_dict(stmt["predicate"].get("clusterVerdict"))
    except ValueError as exc:
        raise TrustError(f"{where}: {exc}") from None
    about = str(verdict.subject.get("digest", "")).split(":", 1)[-1]
    if about not in names:
        raise TrustError(f"{where}: the cluster verdict is about sha256:{about[:12]}, which the "
                         "signed statement does not name")
    return verdict


def _sif_blob(reg: Client, ref: Reference, digest: str) -> str:
    got = reg.fetch_manifest(digest, OCI_MANIFEST)
    assert got is not None
    layers = [x for x in json.loads(got[1]).get("layers") or [] if isinstance(x, dict)]
    sifs = [x for x in layers if x.get("mediaType") == SIF_LAYER_MEDIA]
    if len(sifs) != 1:
        raise TrustError(f"{ref}: not a SIF artifact (expected one {SIF_LAYER_MEDIA} layer)")
    return str(sifs[0].get("digest"))


def summary_lines(c: RefChecked) -> list[str]:
    lines = [f"{c.reference}: OK  {c.digest}",
             f"  attestations: {len(c.referrers)} referrers ({c.source})", *attested_lines(c)]
    if c.sif_blob:
        lines.append(f"  SIF file: {c.sif_blob}")
    for cv in c.clusters:
        lines.append(f"  cluster verdict {cv.recorded_at}: {cv.describe()}")
    if c.audit is not None:
        lines.append(f"  audit {c.audit.get('audited_at')}: {audit_summary(c.audit)}")
    return lines
