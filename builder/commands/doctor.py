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
    _options(p)


def run(args: argparse.Namespace) -> int:
    args.accelerator = None
    if args.target:
        t = _shared.site(args).matrix.target(args.target)
        args.accelerator = t.accelerator
        args.cuda = args.cuda or t.cuda
    return lib.run(args)


def _options(parser: argparse.ArgumentParser) -> None:
    """Options of ``build-env doctor``."""
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument("--interface", default="ib0", help="interface Ray/NCCL will use")
    parser.add_argument("--hf-home", default=None, help="HF cache to test (default $HF_HOME)")
    parser.add_argument("--runtime", default="apptainer",
                        help="container runtime command (apptainer, singularity, ch-run; pyxis: "
                             "srun --container-image and enroot)")
    parser.add_argument("--cuda", default=None, metavar="X.Y",
                        help="hold the node's driver to this CUDA (default: the --target's)")
