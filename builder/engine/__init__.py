"""The only code that speaks Docker (the SDK and the docker CLI).

The rest of ``builder`` holds one :class:`Engine` (connected once per run and handed down) and
gets engine-neutral data back: :class:`ImageInfo` for an image, :class:`RunResult` for a
container, :class:`BuildResult` for a build. Parts: :mod:`.client` (connection, contexts),
:mod:`.buildkit` (builds and progress), :mod:`.containers` (run, export, copy), :mod:`.images`
(inspect, tag, push), :mod:`.platforms` (architectures, emulation), :mod:`.signals`, and
:mod:`.faults` (the engine dying or its data root filling up, as one error naming the stage).
"""

from builder.engine.buildkit import (CLI_OVERRIDE, FALLBACK_CLIS, BuildKitCli, BuildProgress,
                                     BuildResult, PlainProgress, find_buildkit_cli)
from builder.engine.client import Engine, context_host
from builder.engine.containers import OWNER_LABEL, RunResult
from builder.engine.images import ImageInfo
from builder.engine.platforms import (BINFMT_DIR, EMULATION_PACKAGES, emulation_problem,
                                      platform_of)
from builder.engine.signals import interrupts_raise

__all__ = ["BINFMT_DIR", "CLI_OVERRIDE", "EMULATION_PACKAGES", "FALLBACK_CLIS", "OWNER_LABEL",
           "BuildKitCli", "BuildProgress", "BuildResult", "Engine", "ImageInfo",
           "PlainProgress", "RunResult", "context_host", "emulation_problem",
           "find_buildkit_cli", "interrupts_raise", "platform_of"]
