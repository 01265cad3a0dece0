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
"""

from builder.engine.buildkit import (CLI_OVERRIDE, FALLBACK_CLIS, BuildKitCli, PlainProgress,
                                     find_buildkit_cli)
from builder.engine.containers import OWNER_LABEL
from builder.engine.client import context_host
from builder.engine.docker_engine import Engine
from builder.engine.platforms import (BINFMT_DIR, EMULATION_PACKAGES, emulation_problem,
                                      platform_of)
from builder.engine.protocol import ContainerEngine, EngineHealth
from builder.engine.results import BuildProgress, BuildResult, HostFacts, ImageInfo, RunResult
from builder.engine.signals import interrupts_raise

__all__ = ["BINFMT_DIR", "CLI_OVERRIDE", "EMULATION_PACKAGES", "FALLBACK_CLIS", "OWNER_LABEL",
           "BuildKitCli", "BuildProgress", "BuildResult", "ContainerEngine", "Engine",
           "EngineHealth", "HostFacts", "ImageInfo", "PlainProgress", "RunResult", "context_host",
           "emulation_problem", "find_buildkit_cli", "interrupts_raise", "platform_of"]
