"""``build-env sif``: a verified image as an Apptainer ``.sif``."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.commands import _shared
from builder import sif as lib
from builder import verdicts
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
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--target", help="convert the release image of this matrix target")
    src.add_argument("--image", metavar="REF", help="convert this image (reference or ID)")
    p.add_argument("--output", "-o", type=Path, default=None, metavar="PATH",
                   help="the .sif to write (default: ./<target>.sif)")
    p.add_argument("--backend", choices=["auto", "apptainer", "native"], default="auto",
                   help="apptainer (through spython) or native (mksquashfs + SIF writer); "
                        "auto: apptainer when installed")
    p.add_argument("--tag-prefix", default="verl-env", metavar="REPO",
                   help="repository of the release tags (default: verl-env)")
    p.add_argument("--force", action="store_true",
                   help="convert an image that has no passing verdict")
    p.add_argument("--require", choices=verdicts.LEVELS, default=None,
                   help="the verdict level the image needs: build (default; GPU phases may be "
                        f"pending) or gpu (GPU phases proven); env {verdicts.REQUIRE_ENV}")
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
