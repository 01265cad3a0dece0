"""``build-env doctor``: pre-flight a cluster node."""

from __future__ import annotations

import argparse

from builder import doctor as lib
from builder.commands import _shared

NAME = "doctor"
HELP = "pre-flight a cluster node"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    p.add_argument("--target", default=None,
                   help="the matrix target whose image will run here (its family and CUDA)")
    lib.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    args.accelerator = None
    if args.target:
        t = _shared.site(args).matrix.target(args.target)
        args.accelerator = t.accelerator
        args.cuda = args.cuda or t.cuda
    return lib.run(args)
