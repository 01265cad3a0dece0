"""``build-env status``: every verdict that travels with a SIF or an image, newest first; with
``--cluster``, which of them last passed there; for an image index (one name for several
platforms), each platform's digest, verdict and gate time; for a registry reference, its last
signed audit (``build-env audit``: hit counts per severity and the OSV database's date) as an
entry of kind ``audit``. A refused verdict makes the exit code 1."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from builder.publish import status as lib
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
    found = lib.survey(args.sifs, args.key, insecure=args.insecure)
    listing = found.entries
    refused = [e for entries in listing.values() for e in entries if e.refused]
    refused += [p for ps in found.platforms.values() for p in ps if p.refused]
    best = lib.last_passed(listing, args.cluster) if args.cluster else None
    if args.json:
        print(json.dumps({"schema": "verl-env/status/v1",
                          "sifs": {k: [e.to_dict() for e in v] for k, v in listing.items()},
                          "platforms": {k: [p.to_dict() for p in v]
                                        for k, v in found.platforms.items()},
                          "last_passed": None if best is None else
                          {"sif": best[0], **best[1].to_dict()}}, indent=2, sort_keys=True))
    else:
        for item, entries in listing.items():
            if item in found.platforms:
                print("\n".join(_index_lines(item, found.platforms[item])))
                continue
            print(f"{item}:" + ("" if entries else " no verdict travels with it"))
            print("\n".join(_entry_lines(entries, "  ")))
        if args.cluster:
            print(f"last passed on {args.cluster}: " + (
                f"{best[0]} ({best[1].recorded_at})" if best else "none of these"))
    if refused:
        raise TrustError(f"{len(refused)} verdict(s) refused (listed above)")
    return 0


def _entry_lines(entries: list[Any], indent: str) -> list[str]:
    return [f"{indent}REFUSED {e.kind}: {e.refused}" if e.refused
            else f"{indent}{e.recorded_at}  {e.kind:7} {e.detail}" for e in entries]


def _index_lines(item: str, platforms: list[lib.PlatformStatus]) -> list[str]:
    """An image index: one block per platform (digest, target, verdict, gate time)."""
    lines = [f"{item}: image index, {len(platforms)} platforms"]
    for p in platforms:
        v = p.verdict
        verdict = (f"REFUSED: {p.refused}" if p.refused else
                   f"verdict {v.overall}, {v.level} level, gate {v.recorded_at}" if v
                   else "no verdict")
        lines.append(f"  {p.platform:16} {p.digest}  {p.target or '?'}: {verdict}")
        lines += _entry_lines([e for e in p.entries if e.kind != "build"], "    ")
    return lines
