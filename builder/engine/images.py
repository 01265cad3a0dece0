"""Images: inspect (as an engine-neutral :class:`~builder.engine.results.ImageInfo`), tag,
find, resolve, push and remove."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import docker
import docker.errors
import requests

from builder.engine.results import ImageInfo
from builder.errors import EngineError, NoSuchImage


class Images:
    """Image operations on the connected daemon (a part of :class:`builder.engine.Engine`)."""

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client

    def image(self, ref: str) -> ImageInfo:
        """What the engine knows about the image ``ref`` names; EngineError when it has none."""
        if not ref.strip():
            raise NoSuchImage(f"no image named: {ref!r} is empty")
        try:
            return ImageInfo.from_inspect(self.client.images.get(ref).attrs)
        except docker.errors.ImageNotFound:
            raise NoSuchImage(f"no such image: {ref}") from None
        except docker.errors.NullResource:
            raise NoSuchImage(f"no image named: {ref!r}") from None
        except docker.errors.APIError as exc:
            if exc.status_code == 400:  # the engine's "invalid reference format"
                raise NoSuchImage(f"{ref!r} is no image reference: "
                                  f"{exc.explanation or exc}") from None
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
