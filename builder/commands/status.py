"""``build-env status``: every verdict that travels with a SIF or an image, newest first; with
``--cluster``, which of them last passed there. A refused verdict makes the exit code 1."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from builder import status as lib
from builder.errors import TrustError

NAME = "status"
HELP = "every verdict that travels with a SIF or an image, newest first"


def add_arguments(p: argparse.ArgumentParser) -> None:
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


def run(args: argparse.Namespace) -> int:
    listing = lib.gather(args.sifs, args.key, insecure=args.insecure)
    refused = [e for entries in listing.values() for e in entries if e.refused]
    best = lib.last_passed(listing, args.cluster) if args.cluster else None
    if args.json:
        print(json.dumps({"schema": "verl-env/status/v1",
                          "sifs": {k: [e.to_dict() for e in v] for k, v in listing.items()},
                          "last_passed": None if best is None else
                          {"sif": best[0], **best[1].to_dict()}}, indent=2, sort_keys=True))
    else:
        for sif, entries in listing.items():
            print(f"{sif}:" + ("" if entries else " no verdict travels with it"))
            for e in entries:
                if e.refused:
                    print(f"  REFUSED {e.kind}: {e.refused}")
                else:
                    print(f"  {e.recorded_at}  {e.kind:7} {e.detail}")
        if args.cluster:
            print(f"last passed on {args.cluster}: " + (
                f"{best[0]} ({best[1].recorded_at})" if best else "none of these"))
    if refused:
        raise TrustError(f"{len(refused)} verdict(s) refused (listed above)")
    return 0
