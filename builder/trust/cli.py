"""``build-env trust keygen|sign|verify``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from builder.errors import TrustError


def _require(p: argparse.ArgumentParser, what: str) -> None:
    from builder import verdicts

    p.add_argument("--require", choices=verdicts.LEVELS, default=None,
                   help=f"the verdict level to {what}: build (default; the GPU phases may be "
                        "pending) or gpu (GPU and collective phases proven on GPUs); env "
                        f"{verdicts.REQUIRE_ENV}")


def _level(args: argparse.Namespace) -> str:
    from builder import verdicts

    return verdicts.requirement(args.require)


def run(args: argparse.Namespace) -> int:
    return {"keygen": _keygen, "sign": _sign, "verify": _verify}[args.trust_command](args)


def _keygen(args: argparse.Namespace) -> int:
    from builder.trust.keys import generate

    files = generate(args.directory, pgp=args.pgp, name=args.name, email=args.email)
    print(f"{files.private} (private, keep on the build host)")
    print(f"{files.public} (public, give to clusters)  keyid {files.keyid}")
    if files.pgp_private:
        print(f"{files.pgp_private} (OpenPGP private)")
        print(f"{files.pgp_public} (OpenPGP public)  fingerprint {files.pgp_fingerprint}")
    return 0


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TrustError(f"{path}: cannot read the {what} ({exc})") from None
    if not isinstance(data, dict):
        raise TrustError(f"{path}: the {what} is not a JSON object")
    return data


def _sign(args: argparse.Namespace) -> int:
    from builder.trust.sign import sign_from_report

    if args.cluster_verdict is not None:
        return _sign_cluster(args)
    if args.report is None:
        raise TrustError("--report is required (the build's report.json; or --cluster-verdict "
                         "FILE to sign a cluster verdict)")

    signed = sign_from_report(
        args.sif, args.report, args.key, args.pgp_key,
        verdict=_read_json(args.verdict, "verdict") if args.verdict else None,
        sbom_doc=_read_json(args.sbom, "SBOM") if args.sbom else None, require=_level(args))
    print(f"{signed.sif}: signed {signed.digest} (key {signed.keyid[:16]}"
          + (f", PGP {signed.pgp_fingerprint}" if signed.pgp_fingerprint else "") + ")")
    print(f"{signed.sidecar}: 3 attestations (verdict, sbom, provenance)")
    return 0


def _sign_cluster(args: argparse.Namespace) -> int:
    from builder.cluster import read
    from builder.trust.cluster import sign_cluster

    for option, value in (("--report", args.report), ("--verdict", args.verdict),
                          ("--sbom", args.sbom), ("--pgp-key", args.pgp_key)):
        if value is not None:
            raise TrustError(f"{option} does not apply to --cluster-verdict")
    verdict = read(args.cluster_verdict)
    sidecar, kid = sign_cluster(args.sif, verdict, args.key)
    print(f"{args.sif}: signed the cluster verdict ({verdict.describe()}), key {kid[:16]}")
    print(f"{sidecar}: appended")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from builder.trust import remote
    from builder.trust.verify import summary_lines, verify_sif

    path = Path(args.sif)
    if not path.exists() and remote.looks_like_reference(args.sif):
        for option, value in (("--pgp", args.pgp), ("--sidecar", args.sidecar)):
            if value is not None:
                raise TrustError(f"{option} applies to a SIF file, not to a registry reference "
                                 f"({args.sif})")
        ref = remote.verify_reference(args.sif, args.key, insecure=args.insecure,
                                      require=_level(args))
        if args.json:
            print(json.dumps({"schema": "verl-env/trust-verify/v1", **ref.to_dict()}, indent=2,
                             sort_keys=True))
        else:
            print("\n".join(remote.summary_lines(ref)))
        return 0
    checked = verify_sif(path, args.key, args.pgp, args.sidecar, require=_level(args))
    if args.json:
        print(json.dumps({"schema": "verl-env/trust-verify/v1", **checked.to_dict()}, indent=2,
                         sort_keys=True))
    else:
        print("\n".join(summary_lines(checked)))
    return 0
