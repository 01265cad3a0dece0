"""``build-env sif``: a verified image as an Apptainer ``.sif``."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.commands import _shared
from builder import sif as lib
from builder.sif.convert import DEFAULT_PHASES

NAME = "sif"
HELP = "convert a verified image to .sif"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    _options(p)


def run(args: argparse.Namespace) -> int:
    return lib.run(args)


def _options(p: argparse.ArgumentParser) -> None:
    """Options of ``build-env sif`` (``--matrix``/``--snapshot`` are added by the CLI)."""
    _shared.verified_image(p, "convert")
    p.add_argument("--output", "-o", type=Path, default=None, metavar="PATH",
                   help="the .sif to write (default: ./<target>.sif)")
    p.add_argument("--backend", choices=["auto", "apptainer", "native"], default="auto",
                   help="apptainer (through spython) or native (mksquashfs + SIF writer); "
                        "auto: apptainer when installed")
    _shared.require(p)
    p.add_argument("--phases", default=DEFAULT_PHASES,
                   help=f"self-test phases run from the SIF (default: {DEFAULT_PHASES})")
    p.add_argument("--no-run", action="store_true",
                   help="check structure and contents only; do not run the self-test from the "
                        "SIF (the verification is then incomplete, and accepted as such)")
    p.add_argument("--timeout", type=float, default=900, help="seconds for the self-test run")
    p.add_argument("--tmpdir", type=Path, default=None,
                   help="scratch space (default: beside the output)")
    p.add_argument("--report", type=Path, default=None, metavar="PATH",
                   help="also write the conversion and verification report here")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
