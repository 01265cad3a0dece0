""":class:`Engine`, the Docker implementation of
:class:`~builder.engine.protocol.ContainerEngine`: the one object the rest of ``builder`` holds,
composed of its parts on one :class:`~builder.engine.client.Daemon`: :class:`Builds`
(:mod:`.buildkit`), :class:`Images` (:mod:`.images`), :class:`Containers` (:mod:`.containers`)
and :class:`Platforms` (:mod:`.platforms`). Each method hands the call to its part.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import docker

from builder.engine.buildkit import Builds
from builder.engine.containers import Containers
from builder.engine.client import Daemon
from builder.engine.filetree import FileEntry, read_tree
from builder.engine.images import Images
from builder.engine.platforms import Platforms
from builder.engine.protocol import ContainerEngine
from builder.engine.results import BuildProgress, BuildResult, HostFacts, ImageInfo, RunResult


class Engine(ContainerEngine):
    """A connected Docker Engine. ``Engine.connect()`` honours DOCKER_HOST like the docker CLI.
    Connect once per run and hand the engine down (the pipeline does). ``client``: the SDK
    client, for tools and tests that look behind the interface."""

    def __init__(self, client: docker.DockerClient, host: str | None = None) -> None:
        self.daemon = Daemon(client, host)
        self.platforms = Platforms(self.daemon)
        self.builds = Builds(self.daemon, self.platforms)
        self.images = Images(client)
        self.containers = Containers(self.daemon)

    @classmethod
    def connect(cls) -> Engine:
        """The engine the docker CLI would use: ``DOCKER_HOST``, else the current docker context
        (``DOCKER_CONTEXT``, else the config's ``currentContext``; ``ssh://`` included), else the
        local socket. A login node can so drive a remote build node end to end."""
        daemon = Daemon.connect()
        return cls(daemon.client, daemon.host)

    @property
    def client(self) -> docker.DockerClient:
        return self.daemon.client

    # the daemon (EngineHealth)
    @property
    def where(self) -> str:
        return self.daemon.where

    def alive(self, timeout: float = 5) -> bool:
        return self.daemon.alive(timeout)

    def is_local(self) -> bool:
        return self.daemon.is_local()

    def data_root(self) -> str:
        return self.daemon.data_root()

    def idle_build_cache(self) -> int:
        return self.daemon.idle_build_cache()

    def host_facts(self) -> HostFacts:
        """What ``build-env doctor`` checks on a build host (:class:`HostFacts`)."""
        return self.daemon.host_facts()

    # builds
    def build(self, context: Path, *, target: str, network: str | None = "host",
              platform: str | None = None, secrets: dict[str, Path] | None = None,
              on_event: Callable[[BuildProgress, str], None] | None = None,
              no_cache: bool = False) -> BuildResult:
        return self.builds.build(context, target=target, network=network, platform=platform,
                                 secrets=secrets, on_event=on_event, no_cache=no_cache)

    def prune_build_cache(self) -> int:
        return self.builds.prune_build_cache()

    # images
    def image(self, ref: str) -> ImageInfo:
        return self.images.image(ref)

    def find(self, ref: str) -> str | None:
        return self.images.find(ref)

    def identity(self, ref: str) -> str:
        return self.images.identity(ref)

    def tag_once(self, image_id: str, ref: str) -> None:
        self.images.tag_once(image_id, ref)

    def tag(self, image_id: str, ref: str) -> None:
        self.images.tag(image_id, ref)

    def push(self, repository: str, tag: str, *, auth_config: dict[str, str] | None = None
             ) -> Iterator[dict[str, Any]]:
        return self.images.push(repository, tag, auth_config=auth_config)

    def remove_candidate(self, image_id: str) -> None:
        self.images.remove_candidate(image_id)

    # containers
    def run(self, image: str, command: Sequence[str], *, entrypoint: Sequence[str],
            timeout: float, network: str = "none", files: Mapping[str, bytes] | None = None,
            dirs: Sequence[str] = (), collect: Sequence[str] = (),
            environment: dict[str, str] | None = None, gpus: str | None = None,
            shm_size: str = "2g", role: str = "verify") -> RunResult:
        return self.containers.run(image, command, entrypoint=entrypoint, timeout=timeout,
                                   network=network, files=files, dirs=dirs, collect=collect,
                                   environment=environment, gpus=gpus, shm_size=shm_size,
                                   role=role)

    def host_devices(self, image: str, globs: Sequence[str], *, dev_root: str = "/dev",
                     timeout: float = 120) -> list[str]:
        return self.containers.host_devices(image, globs, dev_root=dev_root, timeout=timeout)

    def export(self, image: str, *, chunk_size: int = 4 << 20
               ) -> AbstractContextManager[Iterator[bytes]]:
        return self.containers.export(image, chunk_size=chunk_size)

    def file_tree(self, image: str) -> list[FileEntry]:
        with self.containers.export(image) as chunks:
            return read_tree(chunks)

    def remove_orphans(self, role: str | None = None) -> list[str]:
        return self.containers.remove_orphans(role)

    # the engine's host
    def daemon_arch(self) -> str:
        return self.platforms.daemon_arch()

    def require_emulation(self, platform: str, *, target: str | None = None) -> None:
        self.platforms.require_emulation(platform, target=target)
