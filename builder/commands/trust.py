"""``build-env trust keygen|sign|verify``: keys, signed attestations, and checking them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from builder.gate import verdicts
from builder.cluster.verdict import read as read_cluster_verdict
from builder.commands import _shared
from builder.errors import TrustError
from builder.trust import remote
from builder.trust.cluster_signing import sign_cluster
from builder.trust.keys import generate
from builder.trust.sign import sign_from_report
from builder.trust.signatures import summary_lines, verify_sif

NAME = "trust"
HELP = "sign and check attestations"
VERIFY_SCHEMA = "verl-env/trust-verify/v1"


def add_arguments(p: argparse.ArgumentParser) -> None:
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
    _shared.require(sg, "sign")

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
    _shared.require(vf, "accept")


def run(args: argparse.Namespace) -> int:
    return {"keygen": _keygen, "sign": _sign, "verify": _verify}[args.trust_command](args)


def _keygen(args: argparse.Namespace) -> int:
    files = generate(args.directory, pgp=args.pgp, name=args.name, email=args.email)
    print(f"{files.private} (private, keep on the build host)")
    print(f"{files.public} (public, give to clusters)  keyid {files.keyid}")
    if files.pgp_private:
        print(f"{files.pgp_private} (OpenPGP private)")
        print(f"{files.pgp_public} (OpenPGP public)  fingerprint {files.pgp_fingerprint}")
    return 0


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TrustError(f"{path}: cannot read the {what} ({exc})") from None
    if not isinstance(data, dict):
        raise TrustError(f"{path}: the {what} is not a JSON object")
    return data


def _sign(args: argparse.Namespace) -> int:
    if args.cluster_verdict is not None:
        return _sign_cluster(args)
    if args.report is None:
        raise TrustError("--report is required (the build's report.json; or --cluster-verdict "
                         "FILE to sign a cluster verdict)")
    signed = sign_from_report(
        args.sif, args.report, args.key, args.pgp_key,
        verdict=_read_json(args.verdict, "verdict") if args.verdict else None,
        sbom_doc=_read_json(args.sbom, "SBOM") if args.sbom else None,
        require=verdicts.requirement(args.require))
    print(f"{signed.sif}: signed {signed.digest} (key {signed.keyid[:16]}"
          + (f", PGP {signed.pgp_fingerprint}" if signed.pgp_fingerprint else "") + ")")
    print(f"{signed.sidecar}: 3 attestations (verdict, sbom, provenance)")
    return 0


def _sign_cluster(args: argparse.Namespace) -> int:
    for option, value in (("--report", args.report), ("--verdict", args.verdict),
                          ("--sbom", args.sbom), ("--pgp-key", args.pgp_key)):
        if value is not None:
            raise TrustError(f"{option} does not apply to --cluster-verdict")
    verdict = read_cluster_verdict(args.cluster_verdict)
    sidecar, kid = sign_cluster(args.sif, verdict, args.key)
    print(f"{args.sif}: signed the cluster verdict ({verdict.describe()}), key {kid[:16]}")
    print(f"{sidecar}: appended")
    return 0


def _verify(args: argparse.Namespace) -> int:
    path = Path(args.sif)
    if not path.exists() and remote.looks_like_reference(args.sif):
        for option, value in (("--pgp", args.pgp), ("--sidecar", args.sidecar)):
            if value is not None:
                raise TrustError(f"{option} applies to a SIF file, not to a registry reference "
                                 f"({args.sif})")
        ref = remote.verify_reference(args.sif, args.key, insecure=args.insecure,
                                      require=verdicts.requirement(args.require))
        doc, lines = ref.to_dict(), remote.summary_lines(ref)
    else:
        checked = verify_sif(path, args.key, args.pgp, args.sidecar,
                             require=verdicts.requirement(args.require))
        doc, lines = checked.to_dict(), summary_lines(checked)
    if args.json:
        print(json.dumps({"schema": VERIFY_SCHEMA, **doc}, indent=2, sort_keys=True))
    else:
        print("\n".join(lines))
    return 0
