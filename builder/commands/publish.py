"""``build-env publish``: image and SIF to a registry, by digest."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from builder import publish as lib
from builder.commands import _shared

NAME = "publish"
HELP = "push image and SIF"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    _options(p)


def run(args: argparse.Namespace) -> int:
    return lib.run(args)


def _options(p: argparse.ArgumentParser) -> None:
    """Options of ``build-env publish`` (``--matrix``/``--snapshot`` come from the CLI)."""
    _shared.verified_image(p, "publish")
    p.add_argument("--sif", type=Path, default=None, metavar="PATH",
                   help="also push this SIF (made from the same image) as an ORAS artifact")
    p.add_argument("--registry", required=True, metavar="HOST[:PORT]/REPO",
                   help="where to push (plain HTTP for loopback hosts)")
    p.add_argument("--tag", default=None, help="registry tag (default: the target name, or the "
                                               "image's tag)")
    p.add_argument("--sif-tag", default=None, help="tag of the SIF artifact (default: TAG-sif)")
    p.add_argument("--record", type=Path, default=None, metavar="PATH",
                   help="publish record (default: build/<target>/publish.json)")
    p.add_argument("--insecure", action="store_true", help="plain HTTP to a non-loopback host")
    p.add_argument("--attempts", type=int, default=4,
                   help="tries per registry operation on transient errors (default: 4)")
    _shared.require(p)
    p.add_argument("--sign-key", type=Path, default=os.environ.get("VERL_ENV_SIGN_KEY") or None,
                   metavar="PATH", help="sign the verdict, SBOM and provenance statements with "
                   "this ECDSA key and push them as OCI referrers of the image (and the SIF) "
                   "(env VERL_ENV_SIGN_KEY)")
    p.add_argument("--report", type=Path, default=None, metavar="PATH",
                   help="the build's report.json, for the provenance statement (default: "
                        "build/<target>/report.json)")
    p.add_argument("--attach", type=Path, action="append", default=[], metavar="FILE",
                   help="a cluster verdict (`build-env cluster`) about --sif: signed with "
                        "--sign-key and pushed as a referrer of the image and the SIF; repeat "
                        "for several")
    p.add_argument("--json", action="store_true", help="print the record as JSON")
