"""``build-env sqsh``: a verified image as an enroot squashfs (pyxis), streamed like the SIF."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.commands import _shared
from builder.sif import sqsh as lib
from builder.sif.sqsh import COMPRESSIONS

NAME = "sqsh"
HELP = "write a verified image as an enroot squashfs (pyxis)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    _options(p)


def run(args: argparse.Namespace) -> int:
    return lib.run(args)


def _options(p: argparse.ArgumentParser) -> None:
    """Options of ``build-env sqsh`` (``--matrix``/``--snapshot`` are added by the CLI)."""
    _shared.verified_image(p, "convert")
    p.add_argument("--output", "-o", type=Path, default=None, metavar="PATH",
                   help="the .sqsh to write (default: ./<target>.sqsh)")
    p.add_argument("--compression", choices=sorted(COMPRESSIONS), default="gzip",
                   help="squashfs compression (default gzip; none: fastest to write)")
    p.add_argument("--tmpdir", type=Path, default=None,
                   help="scratch space (default: beside the output)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
