"""``build-env status``: every verdict that travels with a SIF or an image, newest first."""

from __future__ import annotations

import argparse

from builder import status as lib

NAME = "status"
HELP = "every verdict that travels with a SIF or an image, newest first"


def add_arguments(p: argparse.ArgumentParser) -> None:
    lib.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    return lib.run(args)
