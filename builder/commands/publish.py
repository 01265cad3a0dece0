"""``build-env publish``: image and SIF to a registry, by digest."""

from __future__ import annotations

import argparse

from builder import publish as lib
from builder.commands import _shared

NAME = "publish"
HELP = "push image and SIF"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    lib.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    return lib.run(args)
