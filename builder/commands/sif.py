"""``build-env sif``: a verified image as an Apptainer ``.sif``."""

from __future__ import annotations

import argparse

from builder.commands import _shared
from builder import sif as lib

NAME = "sif"
HELP = "convert a verified image to .sif"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    lib.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    return lib.run(args)
