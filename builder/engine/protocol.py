"""The engine as an interface (repo2docker's ``ContainerEngine``): exactly what the rest of
``builder`` asks of a container engine, as :class:`typing.Protocol` classes.

:class:`EngineHealth` is what :mod:`builder.engine.faults` asks when an engine call failed (where
the engine is, whether it still answers, its data root); :class:`ContainerEngine` adds the builds,
images, containers and platforms the pipeline, the gate, the SIF conversion, the publish, the
signature and the vendor probe use. :class:`builder.engine.Engine` is the Docker implementation;
the test suite's fakes declare the protocol and are checked against it
(tests/pipeline/test_engine_protocol.py); a member a fake does not define raises
NotImplementedError when called. Everything crosses in engine-neutral data
(:mod:`builder.engine.results`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from builder.engine.filetree import FileEntry
from builder.engine.results import BuildProgress, BuildResult, ImageInfo, RunResult


class EngineHealth(Protocol):
    """An engine as its faults are told: where it is, whether it answers, where it stores."""

    @property
    def where(self) -> str:
        """``the Docker Engine at unix:///var/run/docker.sock`` (for messages)."""
        raise NotImplementedError

    def alive(self, timeout: float = 5) -> bool:
        """Whether the engine answers within ``timeout`` seconds (never raises)."""
        raise NotImplementedError

    def is_local(self) -> bool:
        """Whether the engine runs on this machine, so that this machine's kernel runs its
        containers and its data root is a local path."""
        raise NotImplementedError

    def data_root(self) -> str:
        """The directory the engine stores images, containers and the build cache in (on the
        engine's host); "" when it does not say."""
        raise NotImplementedError

    def idle_build_cache(self) -> int:
        """Bytes of build cache no build uses now (what pruning the cache would free)."""
        raise NotImplementedError


class ContainerEngine(EngineHealth, Protocol):
    """A connected container engine: builds, images, containers and its host's platform."""

    # builds
    def build(self, context: Path, *, target: str, network: str | None = "host",
              platform: str | None = None, secrets: dict[str, Path] | None = None,
              on_event: Callable[[BuildProgress, str], None] | None = None,
              no_cache: bool = False) -> BuildResult:
        """Build ``context/Dockerfile`` (untagged); EngineError naming the failed step.
        ``no_cache``: every step runs again (``build-env reproduce``)."""
        raise NotImplementedError

    # images
    def image(self, ref: str) -> ImageInfo:
        """What the engine knows about the image ``ref`` names; EngineError when it has none."""
        raise NotImplementedError

    def find(self, ref: str) -> str | None:
        """The image ID that ``ref`` names, or None when the engine has no such image."""
        raise NotImplementedError

    def identity(self, ref: str) -> str:
        """A base reference's repo digest (pulled when absent), else its image ID."""
        raise NotImplementedError

    def tag_once(self, image_id: str, ref: str) -> None:
        """Apply an immutable name: an error when ``ref`` already names another image."""
        raise NotImplementedError

    def tag(self, image_id: str, ref: str) -> None:
        """Point ``ref`` at ``image_id`` (a moving tag)."""
        raise NotImplementedError

    def push(self, repository: str, tag: str, *, auth_config: dict[str, str] | None = None
             ) -> Iterator[dict[str, Any]]:
        """The engine's push of ``repository:tag``, as its stream of decoded events."""
        raise NotImplementedError

    def remove_candidate(self, image_id: str) -> None:
        """Remove an image only while no tag names it, keeping the build cache."""
        raise NotImplementedError

    # containers
    def run(self, image: str, command: Sequence[str], *, entrypoint: Sequence[str],
            timeout: float, network: str = "none", files: Mapping[str, bytes] | None = None,
            dirs: Sequence[str] = (), collect: Sequence[str] = (),
            environment: dict[str, str] | None = None, gpus: str | None = None,
            shm_size: str = "2g", role: str = "verify") -> RunResult:
        """Run a container to completion (killed at ``timeout``); it is always removed."""
        raise NotImplementedError

    def host_devices(self, image: str, globs: Sequence[str], *, dev_root: str = "/dev",
                     timeout: float = 120) -> list[str]:
        """Device nodes matching ``globs`` under ``dev_root`` on the ENGINE's host."""
        raise NotImplementedError

    def export(self, image: str, *, chunk_size: int = 4 << 20
               ) -> AbstractContextManager[Iterator[bytes]]:
        """The image's flattened filesystem as a tar stream, for the ``with`` block."""
        raise NotImplementedError

    def file_tree(self, image: str) -> list[FileEntry]:
        """Every path of the image's flattened filesystem (:mod:`builder.engine.filetree`):
        type, mode, owner, size, content digest, link target; sorted by path."""
        raise NotImplementedError

    def remove_orphans(self, role: str | None = None) -> list[str]:
        """Remove the containers that dead runs of this tool on this host left; their names."""
        raise NotImplementedError

    # the engine's host
    def daemon_arch(self) -> str:
        """The engine host's CPU architecture (``x86_64``, ``aarch64``)."""
        raise NotImplementedError

    def require_emulation(self, platform: str, *, target: str | None = None) -> None:
        """EngineError naming what to install when the engine's host cannot run ``platform``."""
        raise NotImplementedError
