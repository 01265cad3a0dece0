"""The SIF as an ORAS artifact (the media types ``apptainer pull oras://`` accepts), spoken
directly over the OCI distribution API, read back and checked against the file; and the check
that a SIF was made from the image it is published with."""

from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path
from typing import Any

from builder.errors import PublishError
from builder.files import sha256_file
from builder.publish.transfer import OCI_MANIFEST, read_back, release_tags, retrying
from builder.registry.api import Client
from builder.sif import format as sif_format

SIF_CONFIG_MEDIA = "application/vnd.sylabs.sif.config.v1+json"
SIF_LAYER_MEDIA = "application/vnd.sylabs.sif.layer.v1.sif"


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
