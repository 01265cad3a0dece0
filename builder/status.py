"""``build-env status SIF... --key PUB [--cluster NAME]``: every verdict that travels with a SIF
(its signed build verdict and each signed cluster verdict), newest first; with ``--cluster``,
which of the SIFs last passed there. Refused verdicts (unsigned, unknown key, altered, about
another file) are listed with the reason and make the exit code 1."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from builder.errors import TrustError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sifs", type=Path, nargs="+", metavar="SIF")
    p.add_argument("--key", type=Path, action="append", required=True,
                   help="trusted ECDSA public key (PEM); repeat for several")
    p.add_argument("--cluster", default=None, metavar="NAME",
                   help="answer which of the SIFs last passed on this cluster")
    p.add_argument("--json", action="store_true", help="print the entries as JSON")


def run(args: argparse.Namespace) -> int:
    from builder.trust.cluster import last_passed, status

    listing = {str(sif): status(sif, args.key) for sif in args.sifs}
    refused = [e for entries in listing.values() for e in entries if e.refused]
    best = last_passed(list(args.sifs), args.key, args.cluster) if args.cluster else None
    if args.json:
        print(json.dumps({"sifs": {k: [e.to_dict() for e in v] for k, v in listing.items()},
                          "last_passed": None if best is None else
                          {"sif": str(best[0]), **best[1].to_dict()}}, indent=2,
                         sort_keys=True))
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
