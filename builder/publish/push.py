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

from pathlib import Path
from typing import Any

from builder import exclusive as runlock
from builder.cluster.verdict import ClusterVerdict
from builder.engine import ContainerEngine, ImageInfo
from builder.engine.credentials import PASSWORD_ENV, USER_ENV, Credentials, docker_config_path
from builder.errors import BuildEnvError, PublishError
from builder.files import sha256_file
from builder.gate import verdicts
from builder.publish.attestations import Attestations, attest, prepare_attestations
from builder.publish.clusters import _attach_clusters, _clusters_to_attach
from builder.publish.record import (RECORD_SCHEMA, Progress, clean_leftovers, incomplete_path,
                                    now, pins_from_labels, verdict_summary, write_record)
from builder.publish.sif_upload import (SIF_LAYER_MEDIA, check_sif_manifest, check_sif_matches,
                                        push_sif)
from builder.publish.transfer import (MANIFEST_ACCEPT, OCI_MANIFEST, check_access, connect,
                                      manifest_digest, preflight, push_image, read_back,
                                      release_tags, retrying, staging_tag)
from builder.registry.api import Client, Transient
from builder.trust import statements as st

__all__ = ["PASSWORD_ENV", "USER_ENV", "Client", "Credentials", "Transient", "connect",
           "docker_config_path", "incomplete_path", "manifest_digest", "preflight", "publish",
           "publish_verified", "retrying", "sha256_file"]


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
