"""Disk given back by the heavy group's big builds, in the group's own engine.

A whole run's groups share one filesystem (scripts/disk-check.sh). The heavy group builds the
two biggest images of the run: the CUDA-shaped fixture (CUDA torch twice, in its source-build
stage and its final stage, beside uv's cache of the same wheels: about 18 GB of images and
build cache) and the shipped SGLang stack (an image of about 10 GB, and its cache). What such a
module built is removed when the module ends, so it is not held while the group's later modules
and the other groups run; the build cache (its layers and uv's cache mount) goes with it.
"""

from __future__ import annotations

import docker


def client() -> docker.DockerClient:
    """The group's engine. Pruning 20-odd GB of build cache outlasts the SDK's default 60 s read
    timeout on a loaded machine."""
    return docker.from_env(timeout=900)


def image_ids(engine: docker.DockerClient) -> set[str]:
    return {image.id for image in engine.images.list(all=True)}


def clear(engine: docker.DockerClient, keep: set[str], what: str) -> None:
    """Remove every image not in ``keep`` (IDs) and the whole build cache; print what it gave back
    (pytest shows it with ``-s`` or on failure)."""
    removed = 0
    for image in engine.images.list():
        if image.id not in keep:
            try:
                engine.images.remove(image.id, force=True)
                removed += 1
            except docker.errors.NotFound:
                pass  # went with an image removed before it
    freed = engine.api.prune_builds(all=True).get("SpaceReclaimed", 0)
    print(f"{what}: {removed} images removed, build cache pruned ({freed / 1e9:.1f} GB)")
