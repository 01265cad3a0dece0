"""Apptainer SIF images: convert a verified image (:mod:`.convert`, the ``build-env sif``
command), the native writer streaming ``docker export`` into ``mksquashfs`` (:mod:`.native`,
:mod:`.overlay`), apptainer's generated metadata (:mod:`.meta`), the SIF container format
(:mod:`.format`) and the proof of a SIF (:mod:`.verify`)."""

from __future__ import annotations

from builder.sif.convert import convert, convert_verified, pick_backend, run, summary
from builder.sif.verify import DEFAULT_PHASES, verify_sif

__all__ = ["DEFAULT_PHASES", "convert", "convert_verified", "pick_backend", "run", "summary",
           "verify_sif"]
