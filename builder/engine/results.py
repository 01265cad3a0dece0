"""What the engine hands back, engine-neutral: :class:`ImageInfo` for an image,
:class:`RunResult` for a container, :class:`BuildProgress` and :class:`BuildResult` for a build.

Plain data: nothing above :mod:`builder.engine` (verify, sif, publish, trust, vendor) sees an
SDK object.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


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


@dataclass(frozen=True)
class RunResult:
    exit_code: int | None  # None: killed at the timeout
    logs: str
    seconds: float
    files: Mapping[str, bytes] = field(default_factory=dict)  # collected from the container


@dataclass
class BuildProgress:
    """What the build has done so far. ``steps``: one entry per Dockerfile step BuildKit ran or
    found cached (``stage``, ``step`` "x/y", ``instruction``, ``cached``, ``seconds``)."""

    step: int = 0  # steps started so far (BuildKit runs independent steps in parallel)
    total: int = 0  # steps in all stages
    instruction: str = ""
    cache_hits: int = 0
    started: float = field(default_factory=time.monotonic)
    steps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True)
class BuildResult:
    image_id: str
    steps: int
    cache_hits: int
    seconds: float
    log: str
    step_times: tuple[dict[str, Any], ...] = ()
    retried: str = ""  # what BuildKit said when it broke off an attempt built again, else ""


@dataclass(frozen=True)
class HostFacts:
    """What a build host's engine says about itself (``build-env doctor``): its version, its
    data root and the bytes free there (None: the engine is not on this machine), the container
    runtimes it registered (``nvidia`` when the NVIDIA Container Toolkit configured it), the
    CDI specs it can see (``nvidia.com/gpu`` when the toolkit generated them), and its default
    builder (``2``: BuildKit)."""

    version: str
    data_root: str
    free_bytes: int | None
    runtimes: tuple[str, ...] = ()
    cdi_devices: tuple[str, ...] = ()
    cdi_spec_dirs: tuple[str, ...] = ()
    builder_version: str | None = None
    local: bool = False
