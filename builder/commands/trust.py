"""``build-env trust``: keys, signed attestations, and checking them."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.trust import cli as lib
from builder.trust.cli import _require

NAME = "trust"
HELP = "sign and check attestations"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _options(p)


def run(args: argparse.Namespace) -> int:
    return lib.run(args)


def _options(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="trust_command", metavar="ACTION", required=True)
    kg = sub.add_parser("keygen", help="write an ECDSA P-256 key pair (and an OpenPGP key)")
    kg.add_argument("directory", type=Path, metavar="DIR")
    kg.add_argument("--pgp", action="store_true",
                    help="also an OpenPGP RSA-3072 key for the SIF's native signature")
    kg.add_argument("--name", default="verl-env signing key", help="OpenPGP user id name")
    kg.add_argument("--email", default="verl-env@localhost", help="OpenPGP user id e-mail")

    sg = sub.add_parser("sign", help="embed SBOM and verdict in a SIF, sign it, write the sidecar")
    sg.add_argument("sif", type=Path, metavar="SIF")
    sg.add_argument("--key", type=Path, required=True, help="ECDSA P-256 private key (PEM)")
    sg.add_argument("--pgp-key", type=Path, default=None,
                    help="OpenPGP private key: also sign the SIF natively (apptainer verify)")
    sg.add_argument("--report", type=Path, default=None,
                    help="the build's report.json (build/<target>/report.json): provenance "
                         "(required, except with --cluster-verdict)")
    sg.add_argument("--cluster-verdict", type=Path, default=None, metavar="FILE",
                    help="sign this cluster verdict (`build-env cluster`) about the SIF instead: "
                         "appended to SIF.clusters.intoto.jsonl")
    sg.add_argument("--verdict", type=Path, default=None,
                    help="verdict JSON (default: the local verdict record of the report's image)")
    sg.add_argument("--sbom", type=Path, default=None,
                    help="CycloneDX JSON (default: inventory the report's image in the engine)")
    _require(sg, "sign")

    vf = sub.add_parser("verify", help="check a SIF and its sidecar offline, or an image/SIF "
                        "artifact's attestations in a registry")
    vf.add_argument("sif", metavar="SIF_OR_REF",
                    help="a SIF file, or HOST/REPO@sha256:<hex> (or :TAG; oras://... for a SIF "
                         "artifact): its referrers are checked")
    vf.add_argument("--key", type=Path, action="append", required=True,
                    help="trusted ECDSA public key (PEM); repeat for several")
    vf.add_argument("--pgp", type=Path, default=None,
                    help="OpenPGP public key: also check the SIF's native signature")
    vf.add_argument("--sidecar", type=Path, default=None,
                    help="attestations (default: SIF.intoto.jsonl beside the SIF)")
    vf.add_argument("--insecure", action="store_true",
                    help="plain HTTP to a non-loopback registry")
    vf.add_argument("--json", action="store_true", help="print the result as JSON")
    _require(vf, "accept")
