"""``build-env sqsh``: a verified image as an enroot squashfs (pyxis), streamed like the SIF."""

from __future__ import annotations

import argparse

from builder.commands import _shared
from builder.sif import sqsh as lib

NAME = "sqsh"
HELP = "write a verified image as an enroot squashfs (pyxis)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    lib.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    return lib.run(args)
