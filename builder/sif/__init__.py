"""Apptainer SIF images: convert a verified image (:mod:`.convert`, the ``build-env sif``
command), the native writer streaming ``docker export`` into ``mksquashfs`` (:mod:`.native`,
:mod:`.overlay`), apptainer's generated metadata (:mod:`.meta`), the SIF container format
(:mod:`.format`, its one reader) and the checks of a SIF (:mod:`.checks`)."""

from __future__ import annotations

from builder.sif.convert import convert, convert_verified, pick_backend, summary
from builder.sif.checks import DEFAULT_PHASES, verify_sif

__all__ = ["DEFAULT_PHASES", "convert", "convert_verified", "pick_backend", "summary",
           "verify_sif"]
