"""``build-env verify IMAGE``: the in-image self-test on any image."""

from __future__ import annotations

import argparse

from builder import verify as lib
from builder.commands import _shared

NAME = "verify"
HELP = "run the in-image self-test on any image"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    lib.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    return lib.run(args)
