"""``build-env status SIF... --key PUB [--cluster NAME]``: every verdict that travels with a SIF
(its signed build verdict and each signed cluster verdict), newest first; with ``--cluster``,
which of the SIFs last passed there. Refused verdicts (unsigned, unknown key, altered, about
another file) are listed with the reason and make the exit code 1."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from builder.errors import TrustError
from builder.trust.cluster import Entry


def _remote(ref: str, keys: list[Path], insecure: bool) -> list[Entry]:
    """The verdicts attached to a registry reference (every referrer checked as `trust verify`
    does: one that does not verify refuses the whole reference)."""
    from builder.trust import remote

    checked = remote.verify_reference(ref, keys, insecure=insecure)
    v = checked.verdict
    entries = [Entry("build", ref, v.recorded_at if v else None, v.overall if v else None,
                     v.level if v else None, None, v.describe() if v else "")]
    entries += [Entry("cluster", ref, c.recorded_at, c.overall, c.level, c.cluster, c.describe())
                for c in checked.clusters]
    return sorted(entries, key=lambda e: e.recorded_at or "", reverse=True)


def run(args: argparse.Namespace) -> int:
    from builder.trust import remote
    from builder.trust.cluster import status

    listing: dict[str, list[Entry]] = {}
    for item in args.sifs:
        if not Path(item).exists() and remote.looks_like_reference(item):
            listing[item] = _remote(item, args.key, args.insecure)
        else:
            listing[item] = status(Path(item), args.key)
    refused = [e for entries in listing.values() for e in entries if e.refused]
    best = None
    if args.cluster:
        candidates = [(k, e) for k, v in listing.items() for e in v
                      if e.kind == "cluster" and not e.refused and e.cluster == args.cluster
                      and e.overall == "pass"]
        best = max(candidates, key=lambda pair: pair[1].recorded_at or "", default=None)
    if args.json:
        print(json.dumps({"schema": "verl-env/status/v1", "sifs": {k: [e.to_dict() for e in v] for k, v in listing.items()},
                          "last_passed": None if best is None else
                          {"sif": best[0], **best[1].to_dict()}}, indent=2,
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
