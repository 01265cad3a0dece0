"""``build-env cluster``: collect (and sign) a Slurm job's cluster verdict."""

from __future__ import annotations

import argparse

from builder import cluster as lib

NAME = "cluster"
HELP = "collect (and sign) a Slurm job's cluster verdict"


def add_arguments(p: argparse.ArgumentParser) -> None:
    lib.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    return lib.run(args)
