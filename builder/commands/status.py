"""``build-env status``: every verdict that travels with a SIF or an image, newest first."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder import status as lib

NAME = "status"
HELP = "every verdict that travels with a SIF or an image, newest first"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _options(p)


def run(args: argparse.Namespace) -> int:
    return lib.run(args)


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("sifs", nargs="+", metavar="SIF_OR_REF",
                   help="a SIF file, or HOST/REPO@sha256:<hex> (:TAG; oras://... for a SIF "
                        "artifact): its referrers")
    p.add_argument("--insecure", action="store_true",
                   help="plain HTTP to a non-loopback registry")
    p.add_argument("--key", type=Path, action="append", required=True,
                   help="trusted ECDSA public key (PEM); repeat for several")
    p.add_argument("--cluster", default=None, metavar="NAME",
                   help="answer which of the SIFs last passed on this cluster")
    p.add_argument("--json", action="store_true", help="print the entries as JSON")
