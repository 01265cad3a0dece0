"""``build-env verify IMAGE``: the in-image self-test on any image."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder import verify as lib
from builder.commands import _shared
from builder.verify import EMULATION_FACTOR, _count

NAME = "verify"
HELP = "run the in-image self-test on any image"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    _options(p)


def run(args: argparse.Namespace) -> int:
    return lib.run(args)


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("image", metavar="IMAGE_OR_SIF",
                   help="image reference or ID, or a .sif file (run here, on this node, with the "
                        "family's --nv/--rocm and the node's GPUs)")
    p.add_argument("--report", type=Path, default=None, metavar="PATH",
                   help="write the self-test report (with the gate section) here")
    p.add_argument("--json", action="store_true",
                   help="print the report (with the gate section) as JSON on stdout")
    p.add_argument("--timeout", type=float, default=900, help="seconds before the run is killed")
    p.add_argument("--gpus", choices=["auto", "nvidia", "amd", "none"], default="auto",
                   help="GPUs handed to the container (auto: the family's, when expected)")
    p.add_argument("--expect-gpus", type=_count, default=None, metavar="N",
                   help="GPUs the self-test must see (default: what the engine's host shows for "
                        "the target's family; 0 for cpu targets and emulated images)")
    p.add_argument("--target", default=None,
                   help="hold the image to this matrix target's pins instead of its baked manifest")
    p.add_argument("--phases", default=None, metavar="LIST",
                   help="run only these self-test phases (a partial verdict unless it covers the "
                        "family's required set)")
    p.add_argument("--emulated", action="store_true", default=None,
                   help="run the self-test as under QEMU emulation (timeouts x"
                        f"{EMULATION_FACTOR:g}); default: when the image's architecture is not "
                        "the engine host's")
    p.add_argument("--runtime", choices=("apptainer", "singularity", "ch-run"), default=None,
                   help="for a SIF: the runtime that runs it (default: apptainer, singularity, "
                        "then ch-run, which can run cpu images and GPU images where no GPU is "
                        "expected)")
    p.add_argument("--selftest-args", default="", metavar="ARGS",
                   help="extra self-test arguments, one string (e.g. '--strict'); arguments that "
                        "narrow or relax the run make the verdict partial")
