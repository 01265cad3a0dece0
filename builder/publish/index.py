"""One index, all platforms: ``build-env publish --target A --target B ...`` publishes the
builds of one stack for several platforms under one name, an OCI image index.

* **Refusals first, nothing sent.** Every platform needs a passing release verdict recorded
  for its image (its content: the verdict is keyed on the image ID), its build report and the
  signing key (each platform's verdict travels as its own referrers); two images for the same
  os/architecture are refused. A platform whose gate failed, or that has no such verdict, is
  never in the index: the whole publish stops before the first byte, with one line naming the
  target and platform (exit 1), and no other platform is pushed either.
* **Each platform by digest.** Its image goes through the engine under its own staging tag
  (``TAG-<os>-<arch>[-<variant>]-staging``), is read back by digest, and its platform is read
  from the image config the registry serves. Its signed verdict, SBOM and provenance are pushed
  as referrers whose subject is that platform's manifest digest.
* **Then the index, then the tag.** One ``application/vnd.oci.image.index.v1+json`` naming every
  platform's manifest (``platform`` os/architecture/variant, ``org.verl-env.target``) is pushed
  by its digest, read back, and only then the release tag moves to it. The record
  (``publish-index.json``) names the index and each platform with its digest and verdict;
  until it is written, ``publish-index.incomplete.json`` says what is in the registry.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder import exclusive as runlock
from builder.engine import ContainerEngine, ImageInfo
from builder.errors import BuildEnvError, PublishError
from builder.gate import verdicts
from builder.publish.attestations import Attestations, attest, prepare_attestations
from builder.publish.record import (Progress, clean_leftovers, now, pins_from_labels,
                                    verdict_summary, write_record)
from builder.publish.transfer import (MANIFEST_ACCEPT, check_access, connect, push_image,
                                      read_back, release_tags, retrying, staging_tag)
from builder.registry.api import OCI_INDEX, Client, IndexEntry, Platform, index_document
from builder.trust import statements as st

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
