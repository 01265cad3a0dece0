"""Signed attestations in a real registry (Debian ``docker-registry`` 2.8, which has no referrers
API): each DSSE envelope pushed as an OCI 1.1 referrer of the SIF artifact's manifest (and of the
image's, with the real ``cpu_image``), tagged, listed in the ``sha256-<hex>`` fallback index and
in cosign's ``.att`` tag; then ``build-env trust verify REF`` from the registry reference, and
refusals: a referrer signed by another key, a statement about another subject, a verdict that is
not a release one, a subject without attestations, a tampered envelope blob."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import requests

from builder.publish import push as publish
from builder.registry.api import Client
from builder.trust import dsse, keys, referrers
from builder.trust import statements as st
from builder.gate.verdicts import Verdict
from tests.conftest import run_build_env
from tests.publish.conftest import RegistryServer
from tests.trust.conftest import (RELEASE_VERDICT, base_sif, keypair, other_keypair,  # noqa: F401
                                  report, sbom_doc, sif)

pytestmark = [pytest.mark.registry]
REPO = "verl-env/attested"
THREE = {st.VERDICT_TYPE, st.SBOM_TYPE, st.PROVENANCE_TYPE}
INDEX = "application/vnd.oci.image.index.v1+json"
ANY_MANIFEST = ", ".join((referrers.OCI_MANIFEST, INDEX,
                          "application/vnd.docker.distribution.manifest.v2+json"))


def _client(registry: RegistryServer) -> Client:
    return Client(registry.host, REPO, "http")


def _get(registry: RegistryServer, path: str, accept: str = ANY_MANIFEST) -> requests.Response:
    return requests.get(f"http://{registry.host}/v2/{REPO}/{path}", timeout=30,
                        headers={"Accept": accept})


def _attestations(key: keys.KeyFiles, report_path: Path, sbom: dict[str, Any],
                  verdict: dict[str, Any] | None = None) -> publish.Attestations:
    private = keys.load_private(key.private)
    return publish.Attestations(private, key.keyid, Verdict.from_dict(verdict or RELEASE_VERDICT),
                                sbom,
                                st.ProvenanceInputs.from_report(report_path))


def _push_sif(registry: RegistryServer, sif_path: Path, tag: str = "cpu-sif") -> tuple[str, str]:
    """The SIF as its ORAS artifact; (manifest digest, file sha256)."""
    blob = publish.sha256_file(sif_path)
    digest, _ = publish.push_sif(sif_path, _client(registry), tag, 2, blob=blob)
    return digest, blob


def _attest_sif(registry: RegistryServer, att: publish.Attestations, digest: str, blob: str,
                name: str) -> dict[str, Any]:
    reg = _client(registry)
    return publish.attest(reg, att, digest, [st.subject(f"oras://{registry.host}/{REPO}", digest),
                                             st.subject(name, blob)], 2)


def _verify(ref: str, key: Path, *extra: str) -> Any:
    return run_build_env("trust", "verify", ref, "--key", str(key), *extra, timeout=120)


def test_sif_artifact_attested_and_verified_from_registry(
        registry: RegistryServer, sif: Path, keypair: keys.KeyFiles, report: Path,
        sbom_doc: dict[str, Any]) -> None:
    digest, blob = _push_sif(registry, sif)
    record = _attest_sif(registry, _attestations(keypair, report, sbom_doc), digest, blob,
                         sif.name)
    hexpart = digest.split(":", 1)[1]
    # the fact the fallback is for: distribution 2.8 has no referrers API
    assert _get(registry, f"referrers/{digest}", INDEX).status_code == 404
    assert record["referrers_api"] is False
    assert record["fallback_index"] == f"sha256-{hexpart}"
    assert record["subject"] == digest

    served = _get(registry, f"manifests/{digest}")
    index = _get(registry, f"manifests/sha256-{hexpart}", INDEX)
    assert index.status_code == 200
    assert index.headers["Content-Type"].startswith(INDEX)
    entries = index.json()["manifests"]
    assert sorted(e["digest"] for e in entries) == sorted(r["digest"] for r in record["referrers"])
    assert {e["annotations"][referrers.PREDICATE_ANNOTATION] for e in entries} == THREE
    tags = requests.get(f"http://{registry.host}/v2/{REPO}/tags/list", timeout=30).json()["tags"]
    for entry, pushed in zip(entries, record["referrers"]):
        assert entry["artifactType"] == "application/vnd.in-toto+json"
        m = _get(registry, f"manifests/{entry['digest']}")
        assert m.status_code == 200 and len(m.content) == entry["size"]
        assert "sha256:" + hashlib.sha256(m.content).hexdigest() == entry["digest"]
        manifest = m.json()
        assert manifest["artifactType"] == "application/vnd.in-toto+json"
        # subject: the raw bytes the registry serves for the artifact, digest and size
        assert manifest["subject"] == {"mediaType": referrers.OCI_MANIFEST, "digest": digest,
                                       "size": len(served.content)}
        assert manifest["config"] == {"mediaType": "application/vnd.oci.empty.v1+json",
                                      "digest": referrers.EMPTY_DIGEST, "size": 2}
        assert _get(registry, f"blobs/{referrers.EMPTY_DIGEST}").content == b"{}"
        (layer,) = manifest["layers"]
        assert layer["mediaType"] == "application/vnd.dsse.envelope.v1+json"
        envelope = json.loads(_get(registry, f"blobs/{layer['digest']}").content)
        statement = json.loads(base64.b64decode(envelope["payload"]))
        assert layer["annotations"]["in-toto.io/predicate-type"] == statement["predicateType"]
        assert {s["digest"]["sha256"] for s in statement["subject"]} == {
            hexpart, blob.split(":", 1)[1]}
        # tagged, so that a garbage collection with --delete-untagged keeps it
    for pushed in record["referrers"]:
        assert pushed["tag"] in tags
        tagged = _get(registry, f"manifests/{pushed['tag']}")
        assert tagged.headers["Docker-Content-Digest"] == pushed["digest"]
    # cosign's layout: sha256-<hex>.att, the same envelope blobs as layers
    att = _get(registry, f"manifests/{record['cosign_tag']}")
    assert record["cosign_tag"] == f"sha256-{hexpart}.att" and att.status_code == 200
    layers = att.json()["layers"]
    assert {x["annotations"]["predicateType"] for x in layers} == THREE
    assert all(x["annotations"]["dev.cosignproject.cosign/signature"] == "" for x in layers)

    for ref in (f"oras://{registry.host}/{REPO}@{digest}", f"oras://{registry.host}/{REPO}:cpu-sif"):
        proc = _verify(ref, keypair.public)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"OK  {digest}" in proc.stdout
        assert f"fallback tag sha256-{hexpart}" in proc.stdout
        assert "pins: torch=2.6.0+cpu  verl=0.5.0" in proc.stdout
        assert f"SIF file: {blob}" in proc.stdout
    as_json = json.loads(_verify(f"oras://{registry.host}/{REPO}@{digest}", keypair.public,
                                 "--json").stdout)
    assert as_json["keyids"] == [keypair.keyid] * 3 and as_json["overall"] == "pass"


def test_publishing_again_replaces_the_referrers(registry: RegistryServer, sif: Path,
                                                keypair: keys.KeyFiles, report: Path,
                                                sbom_doc: dict[str, Any]) -> None:
    digest, blob = _push_sif(registry, sif)
    att = _attestations(keypair, report, sbom_doc)
    first = _attest_sif(registry, att, digest, blob, sif.name)
    second = _attest_sif(registry, att, digest, blob, sif.name)
    hexpart = digest.split(":", 1)[1]
    entries = _get(registry, f"manifests/sha256-{hexpart}", INDEX).json()["manifests"]
    assert sorted(e["digest"] for e in entries) == sorted(r["digest"] for r in second["referrers"])
    assert not {r["digest"] for r in first["referrers"]} & {e["digest"] for e in entries}
    for pushed in second["referrers"]:
        assert _get(registry, f"manifests/{pushed['tag']}").headers[
            "Docker-Content-Digest"] == pushed["digest"]
    assert _verify(f"oras://{registry.host}/{REPO}@{digest}", keypair.public).returncode == 0


def _inject(registry: RegistryServer, subject_ref: str, envelope: dict[str, Any]) -> str:
    """A referrer pushed beside ours (as anyone with push access could), listed in the index."""
    reg = _client(registry)
    subject = referrers.read_subject(reg, subject_ref)
    blob = referrers.envelope_bytes(envelope)
    reg.put_blob(blob, "sha256:" + hashlib.sha256(blob).hexdigest())
    manifest = referrers.referrer_manifest(blob, referrers.predicate_type_of(envelope), subject,
                                           "2026-11-23T00:00:00Z")
    digest, _ = reg.push_referrer(manifest, referrers.OCI_MANIFEST)
    reg.add_to_fallback_index(subject.digest, {
        "mediaType": referrers.OCI_MANIFEST, "digest": digest, "size": len(manifest),
        "artifactType": referrers.ARTIFACT_TYPE})
    return digest


def test_referrer_signed_by_another_key_is_refused(
        registry: RegistryServer, sif: Path, keypair: keys.KeyFiles,
        other_keypair: keys.KeyFiles, report: Path, sbom_doc: dict[str, Any]) -> None:
    digest, blob = _push_sif(registry, sif)
    _attest_sif(registry, _attestations(keypair, report, sbom_doc), digest, blob, sif.name)
    ref = f"oras://{registry.host}/{REPO}@{digest}"
    assert _verify(ref, keypair.public).returncode == 0
    forged = _attestations(other_keypair, report, sbom_doc).envelopes(
        [st.subject("x", digest), st.subject(sif.name, blob)])[0]
    injected = _inject(registry, digest, forged)
    proc = _verify(ref, keypair.public)
    assert proc.returncode == 1, proc.stdout
    assert f"referrer {injected[:19]}" in proc.stderr
    assert "signed by unknown key(s)" in proc.stderr and other_keypair.keyid[:16] in proc.stderr
    # a site that trusts both keys accepts both statements
    both = run_build_env("trust", "verify", ref, "--key", str(keypair.public), "--key",
                         str(other_keypair.public), timeout=120)
    assert both.returncode == 0, both.stderr


def test_statement_about_another_subject_is_refused(
        registry: RegistryServer, sif: Path, keypair: keys.KeyFiles, report: Path,
        sbom_doc: dict[str, Any]) -> None:
    digest, blob = _push_sif(registry, sif)
    _attest_sif(registry, _attestations(keypair, report, sbom_doc), digest, blob, sif.name)
    other = "sha256:" + "ab" * 32
    moved = _attestations(keypair, report, sbom_doc).envelopes([st.subject("x", other)])[0]
    injected = _inject(registry, digest, moved)
    proc = _verify(f"oras://{registry.host}/{REPO}@{digest}", keypair.public)
    assert proc.returncode == 1
    assert f"referrer {injected[:19]}" in proc.stderr
    assert f"not oras://{registry.host}/{REPO}@{digest}'s manifest" in proc.stderr


def test_failed_verdict_and_missing_pieces_are_refused(
        registry: RegistryServer, sif: Path, keypair: keys.KeyFiles, report: Path,
        sbom_doc: dict[str, Any], tmp_path: Path) -> None:
    digest, blob = _push_sif(registry, sif)
    ref = f"oras://{registry.host}/{REPO}@{digest}"
    # nothing attached yet
    proc = _verify(ref, keypair.public)
    assert proc.returncode == 1
    assert "no attestations: the registry has no referrers API and there is no fallback tag " \
           f"sha256-{digest.split(':', 1)[1]}" in proc.stderr
    # only a verdict, and a failing one, signed by the trusted key
    failing = {**RELEASE_VERDICT, "overall": "fail",
               "report": {**RELEASE_VERDICT["report"], "overall": "fail"}}
    att = _attestations(keypair, report, sbom_doc, failing)
    envelopes = att.envelopes([st.subject("x", digest), st.subject(sif.name, blob)])
    _inject(registry, digest, envelopes[0])
    proc = _verify(ref, keypair.public)
    assert proc.returncode == 1 and "no sbom, provenance attestation" in proc.stderr
    for envelope in envelopes[1:]:
        _inject(registry, digest, envelope)
    proc = _verify(ref, keypair.public)
    assert proc.returncode == 1 and "not a release verdict: overall is 'fail'" in proc.stderr
    # a digest the registry does not have; --pgp with a reference
    missing = _verify(f"{registry.host}/{REPO}@sha256:{'0' * 64}", keypair.public)
    assert missing.returncode == 1 and "HTTP 404" in missing.stderr
    pgp = _verify(ref, keypair.public, "--pgp", str(keypair.pgp_public))
    assert pgp.returncode == 1 and "--pgp applies to a SIF file" in pgp.stderr


def test_tampered_envelope_blob_is_refused(registry: RegistryServer, sif: Path,
                                           keypair: keys.KeyFiles, report: Path,
                                           sbom_doc: dict[str, Any]) -> None:
    """An envelope whose verdict was edited after signing (pushed under a new blob digest, with
    its referrer manifest rewritten to match): the signature no longer verifies."""
    digest, blob = _push_sif(registry, sif)
    att = _attestations(keypair, report, sbom_doc)
    envelopes = att.envelopes([st.subject("x", digest), st.subject(sif.name, blob)])
    for envelope in envelopes[1:]:
        _inject(registry, digest, envelope)
    statement = json.loads(base64.b64decode(envelopes[0]["payload"]))
    statement["predicate"]["verdict"]["target"] = "another-target"
    edited = {**envelopes[0], "payload": base64.b64encode(st.to_bytes(statement)).decode()}
    injected = _inject(registry, digest, edited)
    proc = _verify(f"oras://{registry.host}/{REPO}@{digest}", keypair.public)
    assert proc.returncode == 1
    assert f"referrer {injected[:19]}" in proc.stderr and "does not verify" in proc.stderr
    # and the verifier's envelope check is the same one the offline check uses
    with pytest.raises(Exception, match="does not verify"):
        dsse.verify(edited, [keys.load_public(keypair.public)], "x")


@pytest.mark.docker
@pytest.mark.network
@pytest.mark.slow
def test_publish_signs_the_image_and_trust_verify_reads_the_registry(
        cpu_image: dict, cpu_registry: RegistryServer, keypair: keys.KeyFiles,
        other_keypair: keys.KeyFiles, tmp_path: Path) -> None:
    """`build-env publish --sign-key` with the real verified CPU image: the image's referrers are
    in the registry and `trust verify HOST/REPO@digest` passes with our key, fails with
    another. The registry is the session's for the CPU image (its own repository here)."""
    registry = cpu_registry
    report_path = Path(cpu_image["stages"]["render"]["context"]).parent / "report.json"
    assert json.loads(report_path.read_text())["image_id"] == cpu_image["image_id"]
    record_path = tmp_path / "record.json"
    env = {"HOME": str(tmp_path / "home"), "DOCKER_CONFIG": str(tmp_path / "docker-config")}
    proc = run_build_env("publish", "--image", cpu_image["image_id"], "--registry",
                         f"{registry.host}/{REPO}", "--tag", "cpu", "--record", str(record_path),
                         "--sign-key", str(keypair.private), "--report", str(report_path),
                         env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(record_path.read_text())
    digest = record["image_digest"]
    att = record["attestations"]["image"]
    assert att["subject"] == digest and att["fallback_index"] == f"sha256-{digest[7:]}"
    assert len(att["referrers"]) == 3 and record["attestations"]["keyid"] == keypair.keyid
    served = _get(registry, f"manifests/{digest}")
    for pushed in att["referrers"]:
        manifest = _get(registry, f"manifests/{pushed['tag']}").json()
        assert manifest["subject"]["digest"] == digest
        assert manifest["subject"]["size"] == len(served.content)
        assert manifest["subject"]["mediaType"] == served.headers["Content-Type"]
    for ref in (f"{registry.host}/{REPO}@{digest}", f"{registry.host}/{REPO}:cpu"):
        check = _verify(ref, keypair.public)
        assert check.returncode == 0, check.stdout + check.stderr
        assert "verdict: pass (target cpu-x86_64" in check.stdout
        assert "level: build" in check.stdout
        assert "pins: " in check.stdout and "(none recorded)" not in check.stdout
    wrong = _verify(f"{registry.host}/{REPO}@{digest}", other_keypair.public)
    assert wrong.returncode == 1 and "signed by unknown key(s)" in wrong.stderr
    # the SBOM attested is the image's own inventory: it lists the pinned packages
    sbom_ref = next(r for r in att["referrers"] if r["kind"] == "sbom")
    layer = _get(registry, f"manifests/{sbom_ref['digest']}").json()["layers"][0]
    envelope = json.loads(_get(registry, f"blobs/{layer['digest']}").content)
    bom = json.loads(base64.b64decode(envelope["payload"]))["predicate"]
    assert bom["bomFormat"] == "CycloneDX" and bom["specVersion"] == "1.6"
    assert any(c.get("purl", "").startswith("pkg:deb/") for c in bom["components"])


@pytest.mark.docker
def test_signing_refusals_push_nothing(registry: RegistryServer, layered: Any,
                                       keypair: keys.KeyFiles, report: Path,
                                       tmp_path: Path) -> None:
    """`publish --sign-key` refuses before the first push: no report, a report of another
    image, an image with no release verdict (even with --force, which only skips the publish
    gate). Nothing reaches the registry and no record is written."""
    from tests.sif.images import LAYERED_TAG

    record = tmp_path / "record.json"
    env = {"HOME": str(tmp_path / "home"), "DOCKER_CONFIG": str(tmp_path / "docker-config")}
    base = ["publish", "--image", LAYERED_TAG, "--force", "--registry",
            f"{registry.host}/{REPO}", "--tag", "layers", "--record", str(record),
            "--sign-key", str(keypair.private)]
    own = tmp_path / "own-report.json"
    own.write_text(json.dumps({**json.loads(report.read_text()), "image_id": layered.id}))
    for extra, message in (
            ((), "--sign-key needs the build's report.json"),
            (("--report", str(report)), f"describes image sha256:555555555555, not {layered.id[:19]}"),
            (("--report", str(own)), f"no local verdict for image {layered.id[:19]}")):
        proc = run_build_env(*base, *extra, env=env, timeout=300)
        assert proc.returncode == 1, proc.stderr
        assert message in proc.stderr
        assert not record.exists()
        listing = requests.get(f"http://{registry.host}/v2/{REPO}/tags/list", timeout=30)
        assert listing.status_code == 404  # the repository was never created


def test_cluster_verdicts_attached_listed_and_refused(
        registry: RegistryServer, sif: Path, keypair: keys.KeyFiles,
        other_keypair: keys.KeyFiles, report: Path, sbom_doc: dict[str, Any],
        tmp_path: Path) -> None:
    """`publish --attach`'s step on a real registry: two cluster verdicts about the SIF pushed
    as referrers of its artifact beside the build attestations, each under its own kind (none
    replaces the other, the cosign copy is left alone); `trust verify` and `status` list them
    newest first and say which last passed on a cluster; a verdict about another file is
    refused before any push, one signed by another key refuses the reference."""
    from builder.cluster import verdict as cluster
    from builder.errors import PublishError
    from tests.trust.test_cluster_verdict import _cpu_reports

    digest, blob = _push_sif(registry, sif, "cl-sif")
    _attest_sif(registry, _attestations(keypair, report, sbom_doc), digest, blob, sif.name)
    cosign_before = _get(registry, f"manifests/sha256-{digest[7:]}.att").content
    job = tmp_path / "job-7"
    job.mkdir()
    _cpu_reports(job)
    first = cluster.collect(job, sif, "site-a", now="2026-11-25T10:00:00+00:00")
    second = cluster.collect(job, sif, "site-b", now="2026-11-25T11:00:00+00:00")
    files = []
    for v in (first, second):
        files.append(cluster.write(v, tmp_path / f"{v.cluster}.json"))
    checked = publish._clusters_to_attach(tuple(files), sif, keypair.private)
    sif_record = {"digest": digest, "blob_digest": blob}
    pushed = publish._attach_clusters(_client(registry), checked, keypair.private, digest,
                                      sif_record, sif.name, 2)
    assert [p["cluster"] for p in pushed] == ["site-a", "site-b"]
    assert _get(registry, f"manifests/sha256-{digest[7:]}.att").content == cosign_before
    index = _get(registry, f"manifests/sha256-{digest[7:]}", INDEX).json()["manifests"]
    kinds = sorted(e["annotations"][referrers.KIND_ANNOTATION] for e in index)
    assert kinds[:2] == [pushed[0]["kind"], pushed[1]["kind"]] and len(kinds) == 5

    ref = f"oras://{registry.host}/{REPO}@{digest}"
    proc = _verify(ref, keypair.public)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [x for x in proc.stdout.splitlines() if "cluster verdict" in x]
    assert "site-b" in lines[0] and "site-a" in lines[1]  # newest first
    status = run_build_env("status", ref, "--key", str(keypair.public), "--cluster", "site-a",
                           timeout=120)
    assert status.returncode == 0, status.stderr
    assert f"last passed on site-a: {ref}" in status.stdout

    # about another file: refused before anything is pushed
    other = tmp_path / "other.sif"
    other.write_bytes(sif.read_bytes() + b"\0")
    with pytest.raises(PublishError, match="the cluster verdict is about"):
        publish._clusters_to_attach((files[0],), other, keypair.private)
    # signed by a key the site does not trust: the reference is refused
    publish._attach_clusters(_client(registry), [first], other_keypair.private, digest,
                             sif_record, sif.name, 2)
    proc = _verify(ref, keypair.public)
    assert proc.returncode == 1 and "signed by unknown key(s)" in proc.stderr
