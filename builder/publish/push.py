"""``build-env publish``: push a verified image and its SIF to an OCI registry, by digest.

* :func:`preflight` first (also called by the pipeline before a build with ``--push``): the
  registry answers ``/v2/``, the credentials are accepted, and they may push to the repository
  (a blob upload is started and cancelled), in seconds.
* The image goes through the Docker Engine under the staging tag ``TAG-staging``
  (``images.push`` with the credentials as ``auth_config``; dockerd does the Basic or Bearer
  token flow itself; its stream never raises: every event is scanned for
  ``error``/``errorDetail``). Its manifest digest is then read back
  from the registry API with the v2/OCI ``Accept`` headers (without them a registry may answer
  with a schema1 manifest whose digest differs) and must equal the digest the engine reported.
* The SIF goes as an ORAS artifact with the media types ``apptainer pull oras://`` accepts
  (config ``application/vnd.sylabs.sif.config.v1+json`` = ``{}``, one
  ``application/vnd.sylabs.sif.layer.v1.sif`` layer with a title), spoken directly over the OCI
  distribution API (:mod:`builder.registry.api`: monolithic blob uploads, manifest ``PUT`` by its
  digest). Its manifest is read back, and its layer must have the SIF's own sha256 and size.
* With a signing key (``--sign-key``, the build's ``report.json`` for provenance): the
  verdict, SBOM and provenance statements are signed (DSSE) about the image manifest digest
  (and, for the SIF, about its ORAS manifest digest and the file's sha256) and pushed as OCI 1.1
  referrers (:mod:`builder.trust.referrers`: tagged, the ``sha256-<hex>`` fallback index kept
  where the registry has no referrers API, cosign's ``.att`` tag). Everything that can refuse
  (the key, a release verdict, the report describing this image, the SBOM inventory) is checked
  before anything is pushed.
* Only then the release tags move (``TAG-sif``, then ``TAG``: the manifest bytes served for
  each digest ``PUT`` under the tag), and the publish record (target, pins, both digests, SIF
  size, attestations, time) is written, atomically. An auth failure or a digest mismatch is an
  error and no record is written. From the first byte sent until then,
  ``publish.incomplete.json`` (:class:`Progress`) says which stage the run is in, what is in the
  registry by digest and what is not published; a failed stage is one error naming it. A re-run
  sends nothing the registry already holds.

Credentials: see :mod:`builder.registry.api` (environment, then the Docker config's
``credHelpers``/``credsStore``/``auths``); they are never printed, logged or recorded, and
neither are bearer tokens. Transient registry errors (5xx, connection reset) are retried with
backoff. Loopback registries are spoken to over plain HTTP (Docker's default config trusts
127.0.0.0/8 as insecure); others over HTTPS unless ``--insecure``.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from builder import exclusive as runlock
from builder.gate import verdicts
from builder.cluster.verdict import ClusterVerdict
from builder.cluster.verdict import read as read_cluster_verdict
from builder.engine import ContainerEngine, ImageInfo
from builder.errors import (BuildEnvError, ClusterError, InfraError, PublishError,
                            PublishInfraError)
from builder.engine.credentials import (PASSWORD_ENV, USER_ENV, Credentials, docker_config_path,
                                        resolve_credentials)
from builder.files import sha256_file
from builder.registry.api import (OCI_INDEX, TIMEOUT_S, Client, IndexEntry, Platform, Transient,
                              index_document, parse_reference)
from builder.sif import format as sif_format
from builder.trust import referrers
from builder.trust import statements as st
from builder.trust.cluster_signing import envelope, referrer_kind
from builder.trust.keys import keyid, load_private
from builder.trust.sign import envelopes, statement_inputs

__all__ = ["PASSWORD_ENV", "USER_ENV", "Client", "Credentials", "Member", "PlatformClash",
           "Transient", "connect", "docker_config_path", "preflight", "publish", "publish_index",
           "publish_verified", "refusal"]

RECORD_SCHEMA = "verl-env/publish-record/v1"
MANIFEST_ACCEPT = ("application/vnd.docker.distribution.manifest.v2+json, "
                   "application/vnd.oci.image.manifest.v1+json")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
SIF_CONFIG_MEDIA = "application/vnd.sylabs.sif.config.v1+json"
SIF_LAYER_MEDIA = "application/vnd.sylabs.sif.layer.v1.sif"
PIN_LABEL = "org.verl-env.pin."
RETRY_BASE_S = 1.0
PREFLIGHT_ATTEMPTS = 2
PREFLIGHT_TIMEOUT_S = 10.0
_TRANSIENT = re.compile(r"\b(50[0-4])\b|connection reset|broken pipe|unexpected EOF|\bEOF\b|"
                        r"timeout|temporarily unavailable|connection refused", re.IGNORECASE)
_AUTH = re.compile(r"unauthorized|authentication required|denied|no basic auth", re.IGNORECASE)
T = TypeVar("T")


# --------------------------------------------------------------------------- registry access


def connect(text: str, *, insecure: bool = False, timeout: float = TIMEOUT_S
            ) -> tuple[Client, str]:
    """The registry client with its credentials resolved, and where they came from."""
    host, repo, scheme = parse_reference(text, insecure=insecure)
    creds = resolve_credentials(host)
    return Client(host, repo, scheme, creds, timeout), creds.source if creds else "none"


def retrying(action: Callable[[], T], what: str, attempts: int) -> T:
    """Run ``action``; on :class:`Transient` errors retry with exponential backoff."""
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Transient as exc:
            if attempt == attempts:
                raise PublishInfraError(f"{what}: still failing after {attempts} attempts: "
                                        f"{exc}") from None
            time.sleep(min(RETRY_BASE_S * 2 ** (attempt - 1), 30.0))
    raise AssertionError("unreachable")


def check_access(reg: Client, attempts: int) -> None:
    """``GET /v2/`` with the credentials, then push access to the repository: a clear error
    before anything is uploaded."""
    retrying(reg.check_api, f"{reg.host}: API check", attempts)
    retrying(reg.check_push, f"{reg.host}: push access check", attempts)


def preflight(registry_text: str, *, insecure: bool = False,
              attempts: int = PREFLIGHT_ATTEMPTS) -> None:
    """Before a build with ``--push``: the registry is reachable and the credentials found for
    it are accepted for pushing to its repository. Raises :class:`PublishError` in seconds."""
    reg, _ = connect(registry_text, insecure=insecure, timeout=PREFLIGHT_TIMEOUT_S)
    check_access(reg, attempts)


def manifest_digest(reg: Client, reference: str, attempts: int,
                    accept: str = MANIFEST_ACCEPT) -> tuple[str, dict[str, Any]]:
    """Read a manifest back: its digest (sha256 of the bytes served, checked against the
    ``Docker-Content-Digest`` header) and its JSON."""
    return retrying(lambda: reg.manifest(reference, accept),
                    f"read back {reg.repo}:{reference}", attempts)


def read_back(reg: Client, reference: str, pushed: str, attempts: int, *,
              accept: str = MANIFEST_ACCEPT, where: str, pushed_by: str) -> dict[str, Any]:
    """The manifest ``reference`` names, read back: it must be the one pushed (``pushed``, the
    digest ``pushed_by`` reported), else :class:`PublishError`. Returns its JSON."""
    served_digest, served = manifest_digest(reg, reference, attempts, accept=accept)
    if served_digest != pushed:
        raise PublishError(f"{where}: the registry serves {served_digest}, {pushed_by} {pushed}")
    return served


# --------------------------------------------------------------------------- the image


def push_image(engine: ContainerEngine, image: ImageInfo, reg: Client, tag: str,
               attempts: int) -> str:
    """Tag ``HOST/REPO:TAG`` and push; returns the digest the engine reported. The engine gets
    the credentials as ``auth_config`` and negotiates Basic or Bearer auth itself."""
    ref = f"{reg.host}/{reg.repo}"
    engine.tag(image.id, f"{ref}:{tag}")
    auth = reg.creds.auth_config() if reg.creds else None

    def once() -> str:
        digest = None
        for event in engine.push(ref, tag, auth_config=auth):
            if "error" in event or "errorDetail" in event:
                message = (event.get("errorDetail") or {}).get("message") or event.get("error")
                message = str(message).strip()
                if _AUTH.search(message):
                    raise PublishError(f"push of {ref}:{tag} refused: {message}")
                if _TRANSIENT.search(message):
                    raise Transient(message)
                hint = (" (the registry refuses writes: read-only?)"
                        if re.search(r"\b405\b|unsupported", message, re.IGNORECASE) else "")
                raise PublishError(f"push of {ref}:{tag} failed: {message}{hint}")
            digest = (event.get("aux") or {}).get("Digest") or digest
        if not digest:
            raise PublishError(f"push of {ref}:{tag} ended without a digest")
        return str(digest)

    return retrying(once, f"push {ref}:{tag}", attempts)


# --------------------------------------------------------------------------- the SIF (ORAS)


def sif_manifest(blob: str, size: int, title: str, created: str) -> tuple[bytes, bytes]:
    """The ORAS artifact ``apptainer pull oras://`` accepts: (config bytes, manifest bytes)."""
    config = b"{}"
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": SIF_CONFIG_MEDIA, "size": len(config),
                   "digest": "sha256:" + hashlib.sha256(config).hexdigest()},
        "layers": [{"mediaType": SIF_LAYER_MEDIA, "digest": blob, "size": size,
                    "annotations": {"org.opencontainers.image.title": title}}],
        "annotations": {"org.opencontainers.image.created": created}}
    return config, json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()


def push_sif(sif: Path, reg: Client, tag: str, attempts: int, *, blob: str | None = None,
             move_tag: bool = True) -> tuple[str, dict[str, Any]]:
    """Push the SIF as apptainer's ORAS artifact (config blob, SIF blob, manifest; blobs the
    registry already has are not sent again); returns the manifest digest read back and the
    manifest. The manifest goes up by its digest; ``move_tag`` then points ``tag`` at it (the
    publish moves its tags itself, last: :func:`release_tags`)."""
    target = f"{reg.host}/{reg.repo}:{tag}"
    blob = blob or sha256_file(sif)
    created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    config, manifest = sif_manifest(blob, sif.stat().st_size, sif.name, created)
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    retrying(lambda: reg.put_blob(config, config_digest), f"ORAS push {target} (config)",
             attempts)
    retrying(lambda: reg.put_blob(sif, blob), f"ORAS push {target} (SIF blob)", attempts)
    pushed = retrying(lambda: reg.put_manifest(digest, manifest, OCI_MANIFEST),
                      f"ORAS push {target} (manifest)", attempts)
    served = read_back(reg, pushed, pushed, attempts, accept=OCI_MANIFEST, where=target,
                       pushed_by="the SIF manifest pushed was")
    if move_tag:
        release_tags(reg, [(tag, pushed, OCI_MANIFEST)], attempts)
    return pushed, served


def release_tags(reg: Client, moves: list[tuple[str, str, str]], attempts: int,
                 moved: list[str] | None = None) -> list[str]:
    """Point each ``(tag, digest, accept)`` at the manifest already in the registry under that
    digest (its bytes as served, re-``PUT`` under the tag), in order, each read back by tag.
    Returns the tags moved (also appended to ``moved`` as they move); on an error,
    :class:`PublishError` says which were."""
    moved = [] if moved is None else moved
    for tag, digest, accept in moves:
        try:
            _move_tag(reg, tag, digest, accept, attempts)
        except PublishError as exc:
            done = ", ".join(moved) or "none"
            raise exc.__class__(f"{exc.args[0]} (tags moved before this: {done})") from None
        moved.append(tag)
    return moved


def _move_tag(reg: Client, tag: str, digest: str, accept: str, attempts: int) -> None:
    def fetch() -> tuple[str, bytes, str] | None:
        return reg.fetch_manifest(digest, accept)

    got = retrying(fetch, f"read back {reg.repo}@{digest}", attempts)
    assert got is not None
    _, data, media = got

    def put() -> str:
        return reg.put_manifest(tag, data, media or accept)

    retrying(put, f"move tag {reg.host}/{reg.repo}:{tag}", attempts)
    served, _ = manifest_digest(reg, tag, attempts, accept=accept)
    if served != digest:
        raise PublishError(f"{reg.host}/{reg.repo}:{tag} names {served} after it was moved to "
                           f"{digest}")


def check_sif_manifest(manifest: dict[str, Any], blob_digest: str, size: int) -> None:
    """What ``apptainer pull oras://`` requires: exactly one SIF layer with this digest/size."""
    layers = manifest.get("layers") or []
    if (len(layers) != 1 or layers[0].get("mediaType") != SIF_LAYER_MEDIA
            or layers[0].get("digest") != blob_digest or layers[0].get("size") != size):
        raise PublishError(f"SIF manifest read back does not describe the pushed file "
                           f"({blob_digest}, {size} bytes): layers {layers}")
    if (manifest.get("config") or {}).get("mediaType") != SIF_CONFIG_MEDIA:
        raise PublishError("SIF manifest read back has the wrong config media type")


def check_sif_matches(sif: Path, labels: dict[str, str]) -> None:
    """The SIF was made from this image: its recorded labels carry the image's verl-env
    labels (target, matrix and lock hashes, pins)."""
    if not sif_format.is_sif(sif):
        raise PublishError(f"{sif} is not a SIF file")
    info = sif_format.read_info(sif)
    obj = info.named("inspect-metadata.json")
    if obj is None:
        raise PublishError(f"{sif} has no inspect-metadata.json object")
    sif_labels = json.loads(sif_format.read_object(sif, obj))["data"]["attributes"]["labels"]
    ours = {k: v for k, v in labels.items() if k.startswith("org.verl-env.")}
    differ = sorted(k for k, v in ours.items() if sif_labels.get(k) != v)
    if differ:
        raise PublishError(f"{sif} was not made from this image (labels differ: "
                           f"{', '.join(differ[:5])})")


# --------------------------------------------------------------------------- the whole publish


def pins_from_labels(labels: dict[str, str]) -> dict[str, str]:
    return {k[len(PIN_LABEL):]: v for k, v in sorted(labels.items()) if k.startswith(PIN_LABEL)}


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Atomically: a temp file in the same directory, renamed over the target."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.",
                                     delete=False) as f:
        json.dump(record, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(f.name, path)


def incomplete_path(record_path: Path) -> Path:
    """Where a publish that has not finished says what it did and did not publish
    (``publish.json`` -> ``publish.incomplete.json``)."""
    return record_path.with_name(f"{record_path.stem}.incomplete{record_path.suffix}")


def clean_leftovers(record_path: Path) -> list[Path]:
    """The temp files a killed run left beside the records (``.publish.json.XXXX``): removed.
    Called under the record's run lock, so no live run is writing them."""
    removed = []
    for name in (record_path.name, incomplete_path(record_path).name):
        for stale in record_path.parent.glob(f".{name}.*"):
            try:
                stale.unlink()
                removed.append(stale)
            except OSError:
                pass
    return removed


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Progress:
    """What this publish has pushed so far, kept on disk beside the record
    (:func:`incomplete_path`) from the first byte sent until the record is written: a run that
    fails, or is killed, leaves a file that says which stage it was in, what is in the registry
    by digest and what was not published; no release tag has moved unless it says so."""

    def __init__(self, record_path: Path, base: dict[str, Any], stages: list[str],
                 tags: list[str]) -> None:
        self.path = incomplete_path(record_path)
        self.base = base
        self.stages = stages
        self.tags = tags  # the release tags, HOST/REPO:TAG
        self.stage: str | None = None
        self.done: list[str] = []
        self.published: dict[str, Any] = {}
        self.moved: list[str] = []  # bare tags moved
        self.started = now()

    def enter(self, stage: str) -> None:
        self.stage = stage
        self.save()

    def finish(self, stage: str, **published: Any) -> None:
        self.done.append(stage)
        self.published.update(published)
        self.save()

    def save(self, error: str | None = None) -> None:
        moved = {t for t in self.tags if t.rsplit(":", 1)[1] in self.moved}
        write_record(self.path, {
            **self.base, "status": "incomplete", "pid": os.getpid(),
            "started_at": self.started, "updated_at": now(), "stage": self.stage,
            "error": error, "stages_done": list(self.done),
            "not_published": [s for s in self.stages if s not in self.done],
            "published": dict(self.published),
            "release_tags": {t: "moved" if t in moved else "not moved (names what it named "
                             "before)" for t in self.tags}})

    def failure(self, exc: Exception) -> PublishError:
        """Record ``exc`` and make the one-line error the user sees: the stage, the cause,
        what is (not) released, where the record of it is."""
        reason = str(exc.args[0]) if exc.args else str(exc)
        self.save(error=reason)
        pushed = ", ".join(f"{what} {info['digest']}" for what, info in self.published.items()
                           if isinstance(info, dict) and info.get("digest")) or "nothing"
        moved = [t for t in self.tags if t.rsplit(":", 1)[1] in self.moved]
        released = (f"tags moved: {', '.join(moved)}" if moved
                    else "no release tag was moved")
        kind = PublishInfraError if isinstance(exc, InfraError) else PublishError
        return kind(f"{self.stage} failed: {reason}; {released}; in the registry by "
                    f"digest: {pushed}; what was and was not published: {self.path}")


def staging_tag(tag: str) -> str:
    """The tag the engine pushes the image under (the engine pushes only tags); the release tag
    is moved to the same manifest last, when everything else is in."""
    return f"{tag}-staging"


@dataclass(frozen=True)
class Attestations:
    """What the signed statements say, gathered (and checked) before anything is pushed."""

    private: Any  # the ECDSA private key
    keyid: str
    verdict: verdicts.Verdict
    sbom: dict[str, Any]
    provenance: Any  # builder.trust.statements.ProvenanceInputs

    def envelopes(self, subjects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return envelopes(subjects, self.verdict, self.sbom, self.provenance, self.private)


def prepare_attestations(engine: ContainerEngine, image: ImageInfo, sign_key: Path,
                         report: Path | None, target: str | None, require: str = verdicts.BUILD, *,
                         verdict: verdicts.Verdict | None = None,
                         sbom_doc: dict[str, Any] | None = None) -> Attestations:
    """The key, a release verdict of this image, the report describing it, its SBOM: every
    refusal happens here, before the first byte is pushed. ``verdict``/``sbom_doc``: what the
    caller already holds (the pipeline), else read and inventoried here."""
    private = load_private(sign_key)
    if report is None:
        raise PublishError("--sign-key needs the build's report.json for the provenance "
                           "statement (--report PATH)", target=target)
    if not Path(report).is_file():
        raise PublishError(f"{report}: no build report (needed for the provenance statement; "
                           "--report PATH)", target=target)
    chosen, sbom_doc, provenance = statement_inputs(report, verdict=verdict, sbom_doc=sbom_doc,
                                                    engine=engine, image_id=image.id,
                                                    what=f"image {image.id[7:19]}",
                                                    require=require)
    return Attestations(private, keyid(private.public_key()), chosen, sbom_doc, provenance)


def attest(reg: Client, attestations: Attestations, digest: str,
           subjects: list[dict[str, Any]], attempts: int) -> dict[str, Any]:
    """Sign the statements about ``subjects`` (the first names the manifest ``digest``) and push
    them as referrers of that manifest, as the registry serves it."""
    subject = retrying(lambda: referrers.read_subject(reg, digest),
                       f"read back {reg.repo}@{digest}", attempts)
    signed = attestations.envelopes(subjects)  # once: ECDSA signatures are randomised
    return retrying(lambda: referrers.attach(reg, subject, signed),
                    f"attestations of {reg.repo}@{digest}", attempts)


def publish(engine: ContainerEngine, image: ImageInfo, registry: str, *, tag: str, sif: Path | None,
            target: str | None, record_path: Path, pins: dict[str, str] | None = None,
            sif_tag: str | None = None, insecure: bool = False,
            attempts: int = 4, sign_key: Path | None = None,
            report: Path | None = None, require: str = verdicts.BUILD,
            attach: tuple[Path, ...] = (), verdict: verdicts.Verdict | None = None,
            sbom_doc: dict[str, Any] | None = None) -> dict[str, Any]:
    """Push image (and SIF) by digest, read both back, with ``sign_key`` push the signed
    attestations as referrers, then move the release tags, then write the record. Returns the
    record. ``require``: the verdict level the attestations need (the caller has checked the
    image's verdict). ``attach``: cluster verdicts (``build-env cluster``) about ``sif``, signed
    with ``sign_key`` and pushed as referrers of the image and of the SIF artifact. ``verdict``:
    the image's recorded verdict when the caller holds it (else it is read once); ``sbom_doc``:
    its SBOM, likewise (else inventoried once, when signing).

    One publish at a time writes one record (:mod:`builder.exclusive`, keyed on the record's
    path): a second waits, then publishes over what the first left (nothing is uploaded twice:
    blobs the registry has are skipped)."""
    if verdict is None:
        verdict = verdicts.lookup(image.id)
    try:
        with runlock.held(runlock.key_for_path(record_path),
                          what=f"publish of {image.id[7:19]} to {registry}:{tag}"):
            clean_leftovers(record_path)
            return _publish(engine, image, registry, tag=tag, sif=sif, target=target,
                            record_path=record_path, pins=pins, sif_tag=sif_tag,
                            insecure=insecure, attempts=attempts, sign_key=sign_key,
                            report=report, require=require, attach=attach, verdict=verdict,
                            sbom_doc=sbom_doc)
    except PublishError as exc:
        exc.target = exc.target or target
        raise


def _publish(engine: ContainerEngine, image: ImageInfo, registry: str, *, tag: str,
             sif: Path | None, target: str | None, record_path: Path, pins: dict[str, str] | None,
             sif_tag: str | None, insecure: bool, attempts: int, sign_key: Path | None,
             report: Path | None, require: str, attach: tuple[Path, ...],
             verdict: verdicts.Verdict | None, sbom_doc: dict[str, Any] | None
             ) -> dict[str, Any]:
    clusters = _clusters_to_attach(attach, sif, sign_key)
    reg, cred_source = connect(registry, insecure=insecure)
    labels = image.labels
    if sif is not None:
        check_sif_matches(sif, labels)
    signing = (prepare_attestations(engine, image, sign_key, report, target, require,
                                    verdict=verdict, sbom_doc=sbom_doc)
               if sign_key is not None else None)
    check_access(reg, attempts)
    where = f"{reg.host}/{reg.repo}"
    stag = sif_tag or f"{tag}-sif"
    stages = ["image push"] + (["SIF upload"] if sif is not None else []) + (
        ["attestations"] if signing is not None or clusters else []) + ["release tags"]
    base: dict[str, Any] = {
        "schema": RECORD_SCHEMA, "target": target, "image_id": image.id,
        "pins": pins_from_labels(labels) or dict(pins or {}), "registry": where,
        "credentials": cred_source}
    progress = Progress(record_path, base, stages,
                        [f"{where}:{tag}"] + ([f"{where}:{stag}"] if sif is not None else []))
    try:
        record = _transfer(engine, image, reg, progress, tag=tag, stag=stag, sif=sif,
                           attempts=attempts, signing=signing, clusters=clusters,
                           sign_key=sign_key)
    except BuildEnvError as exc:  # PublishError, EngineError, a refused signature
        raise progress.failure(exc) from None
    record = {**base, "status": "published", **record, "verdict": verdict_summary(verdict),
              "published_at": now()}
    write_record(record_path, record)
    progress.path.unlink(missing_ok=True)
    record["record"] = str(record_path)
    return record


def _transfer(engine: ContainerEngine, image: ImageInfo, reg: Client, progress: Progress, *,
              tag: str, stag: str, sif: Path | None, attempts: int, signing: Attestations | None,
              clusters: list[ClusterVerdict], sign_key: Path | None) -> dict[str, Any]:
    """The stages that send bytes, in order: image (under its staging tag) and SIF by digest,
    the attestations about both digests, and only then the release tags."""
    where = f"{reg.host}/{reg.repo}"
    progress.enter("image push")
    staging = staging_tag(tag)
    digest = push_image(engine, image, reg, staging, attempts)
    read_back(reg, staging, digest, attempts, where=f"{where}:{staging}",
              pushed_by="the engine pushed")
    image_rec = {"tag": f"{where}:{tag}", "digest": digest, "reference": f"{where}@{digest}"}
    progress.finish("image push", image={**image_rec, "staging_tag": f"{where}:{staging}"})
    record: dict[str, Any] = {"image": image_rec, "image_digest": digest, "sif": None}
    moves = [(tag, digest, MANIFEST_ACCEPT)]
    if sif is not None:
        progress.enter("SIF upload")
        blob, size = sha256_file(sif), sif.stat().st_size
        sif_digest, manifest = push_sif(sif, reg, stag, attempts, blob=blob, move_tag=False)
        check_sif_manifest(manifest, blob, size)
        record["sif"] = {"tag": f"{where}:{stag}", "digest": sif_digest,
                         "reference": f"oras://{where}@{sif_digest}",
                         "blob_digest": blob, "size": size, "media_type": SIF_LAYER_MEDIA,
                         "file": sif.name}
        progress.finish("SIF upload", sif=record["sif"])
        moves.insert(0, (stag, sif_digest, OCI_MANIFEST))  # the image's tag moves last
    attestations: dict[str, Any] | None = None
    if signing is not None or clusters:
        progress.enter("attestations")
    if signing is not None:
        attestations = {"keyid": signing.keyid, "image": attest(
            reg, signing, digest, [st.subject(where, digest)], attempts)}
        if sif is not None:
            assert record["sif"] is not None
            attestations["sif"] = attest(
                reg, signing, record["sif"]["digest"],
                [st.subject(f"oras://{where}", record["sif"]["digest"]),
                 st.subject(sif.name, record["sif"]["blob_digest"])], attempts)
    record["attestations"] = attestations
    if clusters:
        assert sign_key is not None and sif is not None
        record["clusters"] = _attach_clusters(reg, clusters, sign_key, digest,
                                              record["sif"], sif.name, attempts)
    if signing is not None or clusters:
        progress.finish("attestations", attestations=attestations,
                        clusters=record.get("clusters"))
    progress.enter("release tags")
    release_tags(reg, moves, attempts, moved=progress.moved)
    progress.finish("release tags")
    return record


def _clusters_to_attach(files: tuple[Path, ...], sif: Path | None,
                        sign_key: Path | None) -> list[ClusterVerdict]:
    """The cluster verdicts of ``--attach``, each about this SIF: checked before any push."""
    if not files:
        return []
    if sign_key is None or sif is None:
        raise PublishError("--attach signs cluster verdicts about the SIF: give --sign-key and "
                           "--sif")
    digest = sha256_file(sif)
    out = []
    for path in files:
        try:
            verdict = read_cluster_verdict(path)
        except ClusterError as exc:
            raise PublishError(str(exc).removeprefix("cluster: ")) from None
        if verdict.subject.get("digest") != digest:
            raise PublishError(f"{path}: the cluster verdict is about "
                               f"{verdict.subject.get('digest')}, not {sif} ({digest})")
        out.append(verdict)
    return out


def _attach_clusters(reg: Client, clusters: list[ClusterVerdict], sign_key: Path, image_digest: str,
                     sif_record: dict[str, Any], sif_name: str, attempts: int
                     ) -> list[dict[str, Any]]:
    """Each cluster verdict signed about the image manifest, the SIF artifact and the SIF file,
    and pushed as a referrer of both manifests (its own kind: several live side by side)."""
    private = load_private(sign_key)
    subjects = [st.subject(f"{reg.host}/{reg.repo}", image_digest),
                st.subject(f"oras://{reg.host}/{reg.repo}", sif_record["digest"]),
                st.subject(sif_name, sif_record["blob_digest"])]
    out = []
    for verdict in clusters:
        env = envelope(subjects, verdict, private)
        kind = referrer_kind(verdict)
        pushed = {what: _attach_cluster(reg, digest, env, kind, attempts)
                  for what, digest in (("image", image_digest), ("sif", sif_record["digest"]))}
        out.append({"cluster": verdict.cluster, "job": verdict.job, "overall": verdict.overall,
                    "level": verdict.level, "recorded_at": verdict.recorded_at, "kind": kind,
                    "referrers": pushed})
    return out


def _attach_cluster(reg: Client, digest: str, env: dict[str, Any], kind: str, attempts: int
                    ) -> dict[str, Any]:
    """One signed cluster verdict pushed as a referrer (of its own ``kind``) of ``digest``."""
    subject = retrying(lambda: referrers.read_subject(reg, digest),
                       f"read back {reg.repo}@{digest}", attempts)
    return retrying(lambda: referrers.attach(reg, subject, [env], kind=kind, cosign=False),
                    f"cluster verdict of {reg.repo}@{digest}", attempts)


def verdict_summary(v: verdicts.Verdict | None) -> dict[str, Any] | None:
    """The verdict's level and GPU evidence, for the publish record."""
    if v is None:
        return None
    return {"overall": v.overall, "scope": v.scope, "level": v.level, "gpu": v.gpu.to_dict(),
            "recorded_at": v.recorded_at}


def publish_verified(engine: ContainerEngine, image: ImageInfo, registry: str, *, target: str,
                     sif: Path | None, pins: dict[str, str], verdict: verdicts.Verdict | None,
                     record_path: Path | None = None, sign_key: Path | None = None,
                     report: Path | None = None, require: str = verdicts.BUILD,
                     sbom_doc: dict[str, Any] | None = None) -> dict[str, Any]:
    """Pipeline entry (``build-env --target T --push REG [--sif PATH] [--sign-key K]``), with
    the engine, the image's verdict and (when signing) its SBOM that the pipeline already
    holds; ``report``: the build's ``report.json`` (provenance of the attestations)."""
    if verdict is not None and verdict.image_id not in (None, image.id):
        raise PublishError(f"the verdict handed over is about {verdict.image_id[:19]}, not "
                           f"{image.id[:19]}", target=target)
    problem = verdicts.release_problem(verdict, require)
    if problem:
        raise PublishError(f"image {image.id[7:19]} has no passing verdict: {problem}",
                           target=target)
    return publish(engine, image, registry, tag=target, sif=sif, target=target,
                   record_path=record_path or Path("build") / target / "publish.json",
                   pins=pins, sign_key=sign_key, report=report, require=require,
                   verdict=verdict, sbom_doc=sbom_doc)


# ------------------------------------------------------------------------ one index, all platforms
#
# ``build-env publish --target A --target B ...``: the builds of one stack for several platforms
# under one name, an OCI image index.
#
# * **Refusals first, nothing sent.** Every platform needs a passing release verdict recorded
#   for its image (its content: the verdict is keyed on the image ID), its build report and the
#   signing key (each platform's verdict travels as its own referrers); two images for the same
#   os/architecture are refused. A platform whose gate failed, or that has no such verdict, is
#   never in the index: the whole publish stops before the first byte, with one line naming the
#   target and platform (exit 1), and no other platform is pushed either.
# * **Each platform by digest.** Its image goes through the engine under its own staging tag
#   (``TAG-<os>-<arch>[-<variant>]-staging``), is read back by digest, and its platform is read
#   from the image config the registry serves. Its signed verdict, SBOM and provenance are pushed
#   as referrers whose subject is that platform's manifest digest.
# * **Then the index, then the tag.** One ``application/vnd.oci.image.index.v1+json`` naming every
#   platform's manifest (``platform`` os/architecture/variant, ``org.verl-env.target``) is pushed
#   by its digest, read back, and only then the release tag moves to it. The record
#   (``publish-index.json``) names the index and each platform with its digest and verdict;
#   until it is written, ``publish-index.incomplete.json`` says what is in the registry.

INDEX_RECORD_SCHEMA = "verl-env/publish-index-record/v1"


class PlatformClash(PublishError):
    """Two of the images given are for the same machine: bad input."""

    exit_code = 2


@dataclass(frozen=True)
class Member:
    """One platform's build of the stack: its target, image, recorded verdict and report."""

    target: str
    image: ImageInfo
    verdict: verdicts.Verdict | None
    report: Path

    @property
    def platform(self) -> Platform:
        return Platform(self.image.os or "linux", self.image.architecture, self.image.variant)

    def tag_suffix(self) -> str:
        return str(self.platform).replace("/", "-")


def refusal(members: list[Member], require: str) -> PublishError | None:
    """Why these images cannot be one index (the first reason), before anything is sent: a
    platform without a passing release verdict (exit 1), or two for one machine (exit 2)."""
    for i, m in enumerate(members):
        for other in members[:i]:
            if m.platform.same_machine(other.platform):
                return PlatformClash(f"{other.target} and {m.target} are both {m.platform}: "
                                     "an index holds one image per platform")
    for m in members:
        if m.verdict is not None and m.verdict.image_id not in (None, m.image.id):
            problem = f"the verdict handed over is about {m.verdict.image_id[:19]}"
        else:
            problem = verdicts.release_problem(m.verdict, require)
        if problem:
            return PublishError(f"{m.platform} image {m.image.id[7:19]} has no passing verdict: "
                                f"{problem}; it is never put in an index, and nothing was "
                                "pushed", target=m.target)
    return None


def publish_index(engine: ContainerEngine, members: list[Member], registry: str, *, tag: str,
                  record_path: Path, sign_key: Path, insecure: bool = False, attempts: int = 4,
                  require: str = verdicts.BUILD) -> dict[str, Any]:
    """Refuse (see :func:`refusal`), then push every platform by digest with its attestations,
    then the index, then move ``tag`` to it; returns the record (also written to
    ``record_path``). One publish per record at a time (:mod:`builder.exclusive`)."""
    if len(members) < 2:
        raise PlatformClash("an image index needs the builds of at least two platforms")
    problem = refusal(members, require)
    if problem is not None:
        raise problem
    with runlock.held(runlock.key_for_path(record_path),
                      what=f"publish of {len(members)} platforms to {registry}:{tag}"):
        clean_leftovers(record_path)
        return _publish_index(engine, members, registry, tag=tag, record_path=record_path,
                              sign_key=sign_key, insecure=insecure, attempts=attempts,
                              require=require)


def _publish_index(engine: ContainerEngine, members: list[Member], registry: str, *,
                   tag: str, record_path: Path, sign_key: Path, insecure: bool, attempts: int,
                   require: str) -> dict[str, Any]:
    reg, cred_source = connect(registry, insecure=insecure)
    signing = [prepare_attestations(engine, m.image, sign_key, m.report, m.target, require,
                                    verdict=m.verdict) for m in members]
    check_access(reg, attempts)
    where = f"{reg.host}/{reg.repo}"
    stages = [f"image {m.platform}" for m in members] + ["index", "release tag"]
    base: dict[str, Any] = {"schema": INDEX_RECORD_SCHEMA, "registry": where,
                            "credentials": cred_source, "targets": [m.target for m in members]}
    progress = Progress(record_path, base, stages, [f"{where}:{tag}"])
    try:
        platforms = [_push_platform(engine, reg, m, s, tag, progress, attempts)
                     for m, s in zip(members, signing)]
        progress.enter("index")
        index = _push_index(reg, platforms, attempts)
        progress.finish("index", index=index)
        progress.enter("release tag")
        release_tags(reg, [(tag, index["digest"], OCI_INDEX)], attempts, moved=progress.moved)
        progress.finish("release tag")
    except BuildEnvError as exc:  # PublishError, EngineError, a refused signature
        raise progress.failure(exc) from None
    record = {**base, "status": "published",
              "index": {**index, "tag": f"{where}:{tag}"},
              "platforms": [p for p, _ in platforms], "published_at": now()}
    write_record(record_path, record)
    progress.path.unlink(missing_ok=True)
    record["record"] = str(record_path)
    return record


def _push_platform(engine: ContainerEngine, reg: Client, m: Member, signing: Attestations,
                   tag: str, progress: Progress, attempts: int
                   ) -> tuple[dict[str, Any], IndexEntry]:
    """One platform: its image by digest (under its staging tag), its platform as the registry
    serves its config, its attestations as referrers of its manifest."""
    where = f"{reg.host}/{reg.repo}"
    stage = f"image {m.platform}"
    progress.enter(stage)
    staging = staging_tag(f"{tag}-{m.tag_suffix()}")
    digest = push_image(engine, m.image, reg, staging, attempts)
    read_back(reg, staging, digest, attempts, where=f"{where}:{staging}",
              pushed_by="the engine pushed")
    entry = _index_entry(reg, digest, m, attempts)
    attested = attest(reg, signing, digest, [st.subject(where, digest)], attempts)
    rec = {"target": m.target, "platform": str(entry.platform), "image_id": m.image.id,
           "digest": digest, "reference": f"{where}@{digest}", "media_type": entry.media_type,
           "staging_tag": f"{where}:{staging}", "pins": pins_from_labels(m.image.labels),
           "verdict": verdict_summary(m.verdict),
           "attestations": {"keyid": signing.keyid, "image": attested}}
    progress.finish(stage, **{stage: rec})
    return rec, entry


def _index_entry(reg: Client, digest: str, m: Member, attempts: int) -> IndexEntry:
    """The index entry of the manifest ``digest``: its bytes as served, and the platform its
    config declares, which must be the image's (the engine pushed what it holds)."""
    got = retrying(lambda: reg.fetch_manifest(digest, MANIFEST_ACCEPT),
                   f"read back {reg.repo}@{digest}", attempts)
    assert got is not None
    _, raw, media = got
    manifest = json.loads(raw)
    config_digest = str((manifest.get("config") or {}).get("digest") or "")
    config = json.loads(retrying(lambda: reg.blob(config_digest),
                                 f"config of {reg.repo}@{digest}", attempts))
    platform = Platform.from_config(config)
    if platform is None or not platform.same_machine(m.platform):
        raise PublishError(f"{reg.repo}@{digest}: its config declares {platform or 'no platform'}"
                           f", the image is {m.platform}", target=m.target)
    return IndexEntry(platform, media or str(manifest.get("mediaType") or ""), digest, len(raw),
                 m.target)


def _push_index(reg: Client, platforms: list[tuple[dict[str, Any], IndexEntry]], attempts: int
                ) -> dict[str, Any]:
    """The index naming every platform's manifest, pushed by its digest and read back."""
    where = f"{reg.host}/{reg.repo}"
    try:
        data = index_document([e for _, e in platforms], now())
    except ValueError as exc:
        raise PlatformClash(str(exc)) from None
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    pushed = retrying(lambda: reg.put_manifest(digest, data, OCI_INDEX),
                      f"push the index to {where}", attempts)
    read_back(reg, pushed, digest, attempts, accept=OCI_INDEX, where=f"{where}@{digest}",
              pushed_by="the index pushed was")
    return {"digest": digest, "reference": f"{where}@{digest}", "media_type": OCI_INDEX,
            "size": len(data)}
