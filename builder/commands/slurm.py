"""``build-env slurm``: an sbatch script for a target; its family comes from the matrix."""

from __future__ import annotations

import argparse

from builder import slurm as lib
from builder.commands import _shared

NAME = "slurm"
HELP = "write an sbatch script"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    p.add_argument("--target", default=None, help="matrix target (sets the accelerator family)")
    lib.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    if args.target and not args.family:
        args.family = _shared.site(args).matrix.target(args.target).accelerator
    return lib.run(args)
