"""``build-env doctor``: pre-flight a cluster node."""

from __future__ import annotations

import argparse

from builder import doctor as lib

NAME = "doctor"
HELP = "pre-flight a cluster node"


def add_arguments(p: argparse.ArgumentParser) -> None:
    lib.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    return lib.run(args)
