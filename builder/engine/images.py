"""Images: what the engine knows about one (:class:`ImageInfo`, engine-neutral), and tag, find,
resolve, push and remove.

Everything above :mod:`builder.engine` (verify, sif, publish, trust, vendor) gets an
:class:`ImageInfo`, never an SDK object: plain data in the OCI image config's terms.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import docker
import docker.errors
import requests

from builder.errors import EngineError


@dataclass(frozen=True)
class ImageInfo:
    """One image as the engine holds it, engine-neutral.

    ``config``: the OCI image config's ``config`` object (``Env``, ``Entrypoint``, ``Cmd``,
    ``WorkingDir``, ``User``, ``Labels``, ...), as plain JSON data; ``labels`` is its
    ``Labels``. ``size``: bytes the image takes in the engine. ``repo_digests``:
    ``name@sha256:...`` for each registry it came from or went to."""

    id: str
    tags: tuple[str, ...] = ()
    repo_digests: tuple[str, ...] = ()
    architecture: str = ""
    os: str = "linux"
    variant: str = ""
    size: int = 0
    created: str = ""
    config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.config.get("Labels") or {})

    @classmethod
    def from_inspect(cls, attrs: Mapping[str, Any]) -> ImageInfo:
        """From the engine's image inspect document."""
        return cls(id=str(attrs.get("Id") or ""),
                   tags=tuple(str(t) for t in attrs.get("RepoTags") or ()),
                   repo_digests=tuple(str(d) for d in attrs.get("RepoDigests") or ()),
                   architecture=str(attrs.get("Architecture") or ""),
                   os=str(attrs.get("Os") or "linux"),
                   variant=str(attrs.get("Variant") or ""),
                   size=int(attrs.get("Size") or 0),
                   created=str(attrs.get("Created") or ""),
                   config=dict(attrs.get("Config") or {}))


class ImagesMixin:
    """Image operations on the connected daemon (part of :class:`builder.engine.Engine`)."""

    client: docker.DockerClient

    def image(self, ref: str) -> ImageInfo:
        """What the engine knows about the image ``ref`` names; EngineError when it has none."""
        try:
            return ImageInfo.from_inspect(self.client.images.get(ref).attrs)
        except docker.errors.ImageNotFound:
            raise EngineError(f"no such image: {ref}") from None
        except docker.errors.APIError as exc:
            raise EngineError(f"cannot inspect {ref}: {exc.explanation or exc}") from None

    def find(self, ref: str) -> str | None:
        """The image ID that ``ref`` names, or None when the engine has no such image."""
        try:
            return str(self.client.images.get(ref).id)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            raise EngineError(f"cannot inspect {ref}: {exc.explanation or exc}") from None

    def identity(self, ref: str) -> str:
        """What a base reference resolves to: its repo digest (``name@sha256:...``) when it
        came from a registry, else its image ID (a local base). Pulled when absent."""
        if "@sha256:" in ref:
            return ref
        try:
            image = self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            try:
                image = self.client.images.pull(ref)
            except (docker.errors.APIError, docker.errors.ImageNotFound) as exc:
                raise EngineError(f"base image {ref} is not in the engine and cannot be pulled "
                                  f"({getattr(exc, 'explanation', None) or exc})") from None
        digests = image.attrs.get("RepoDigests") or []
        return str(digests[0]) if digests else str(image.id)

    def tag_once(self, image_id: str, ref: str) -> None:
        """Apply an immutable name: a no-op when ``ref`` already names ``image_id``, an error
        when it names another image (a content tag never moves)."""
        current = self.find(ref)
        if current == image_id:
            return
        if current is not None:
            raise EngineError(f"{ref} already names image {current[:19]}, not {image_id[:19]}: "
                              "a content tag never moves (remove it by hand if it is stale)")
        self.tag(image_id, ref)

    def tag(self, image_id: str, ref: str) -> None:
        repo, _, tag = ref.rpartition(":") if ":" in ref.split("/")[-1] else (ref, "", "latest")
        if not self.client.api.tag(image_id, repo, tag, force=True):
            raise EngineError(f"could not tag {image_id[:19]} as {ref}")

    def push(self, repository: str, tag: str, *, auth_config: dict[str, str] | None = None
             ) -> Iterator[dict[str, Any]]:
        """The engine's push of ``repository:tag``, as its stream of decoded events (the caller
        scans every event: a push stream never raises for a refused layer). The engine does the
        registry's auth flow (Basic or Bearer) itself with ``auth_config``."""
        try:
            yield from self.client.images.push(repository, tag=tag, stream=True, decode=True,
                                               auth_config=auth_config)
        except (docker.errors.APIError, requests.RequestException) as exc:
            raise EngineError(f"push of {repository}:{tag} broke off: "
                              f"{getattr(exc, 'explanation', None) or exc}") from None

    def remove_candidate(self, image_id: str) -> None:
        """Remove an image only while no tag names it (a candidate nobody released), keeping its
        parent layers (the build cache). A cached rebuild of a released image is left alone.
        An engine that no longer answers keeps it (untagged; the next build reuses its layers)."""
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError,
                                 requests.RequestException):
            if not self.client.images.get(image_id).tags:
                self.client.api.remove_image(image_id, noprune=True)
