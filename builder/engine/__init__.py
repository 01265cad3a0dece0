"""The only code that speaks Docker (the SDK and the docker CLI).

The rest of ``builder`` holds one engine (connected once per run and handed down) and gets
engine-neutral data back (:mod:`.results`): :class:`ImageInfo` for an image, :class:`RunResult`
for a container, :class:`BuildResult` for a build. What it may ask of an engine is
:class:`ContainerEngine` (:mod:`.protocol`); :class:`Engine` (:mod:`.docker_engine`) is the
Docker implementation, composed of parts on one :class:`~.client.Daemon` (:mod:`.client`:
connection, contexts): :mod:`.buildkit` (builds and progress), :mod:`.containers` (run, export,
copy), :mod:`.images` (inspect, tag, push), :mod:`.platforms` (architectures, emulation). Beside
them: :mod:`.signals`, and :mod:`.faults` (the engine dying or its data root filling up, as one
error naming the stage; it asks only :class:`EngineHealth`).

Importing this package imports none of them: each name below is imported from its module on
first use (PEP 562), so that a command that never meets an engine (``build-env check``) does
not pay for the docker SDK and ``requests`` at start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module of this package that defines it
_WHERE = {
    "CLI_OVERRIDE": "buildkit", "FALLBACK_CLIS": "buildkit", "BuildKitCli": "buildkit",
    "PlainProgress": "buildkit", "find_buildkit_cli": "buildkit",
    "OWNER_LABEL": "containers",
    "context_host": "client",
    "Engine": "docker_engine",
    "BINFMT_DIR": "platforms", "EMULATION_PACKAGES": "platforms",
    "emulation_problem": "platforms", "platform_of": "platforms",
    "ContainerEngine": "protocol", "EngineHealth": "protocol",
    "BuildProgress": "results", "BuildResult": "results", "HostFacts": "results",
    "ImageInfo": "results", "RunResult": "results",
    "interrupts_raise": "signals",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """``builder.engine.Engine`` and the rest of ``__all__``: imported from their module on first
    use; a submodule (``from builder.engine import signals``) is left to the import system."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


if TYPE_CHECKING:  # what the names are, for the type checker; nothing is imported at run time
    from builder.engine.buildkit import (CLI_OVERRIDE, FALLBACK_CLIS, BuildKitCli, PlainProgress,
                                         find_buildkit_cli)
    from builder.engine.client import context_host
    from builder.engine.containers import OWNER_LABEL
    from builder.engine.docker_engine import Engine
    from builder.engine.platforms import (BINFMT_DIR, EMULATION_PACKAGES, emulation_problem,
                                          platform_of)
    from builder.engine.protocol import ContainerEngine, EngineHealth
    from builder.engine.results import (BuildProgress, BuildResult, HostFacts, ImageInfo,
                                        RunResult)
    from builder.engine.signals import interrupts_raise
