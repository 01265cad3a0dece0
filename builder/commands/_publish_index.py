"""``build-env publish --target A --target B ...``: the part of the publish command that puts
the builds of one stack for several platforms under one name
(:func:`builder.publish.index.publish_index`). Options that cannot apply to an index are refused before anything is read or sent."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from builder.publish import index as lib
from builder.publish import transfer
from builder.gate import verdicts
from builder.commands import _shared
from builder.engine import Engine
from builder.errors import PublishError, UsageError
from builder.matrix.spec import load_matrix


def _refuse_options(args: argparse.Namespace, targets: list[str]) -> None:
    """What an index publish cannot do: one line, exit 2, before the registry is asked."""
    if args.tag is None:
        raise UsageError(f"publishing {len(targets)} targets as one image index needs --tag "
                         "(the one name of the stack)")
    if args.force:
        raise UsageError("--force cannot put an image without a passing verdict into an index")
    if args.sif is not None or args.sif_tag is not None or args.attach:
        raise UsageError("--sif, --sif-tag and --attach publish one target's SIF: run them per "
                         "target (a SIF holds one platform)")
    if args.sign_key is None:
        raise UsageError("an image index needs --sign-key (or VERL_ENV_SIGN_KEY): each "
                         "platform's verdict travels with it as signed referrers")
    if args.report and len(args.report) != len(targets):
        raise UsageError(f"--report given {len(args.report)} times for {len(targets)} targets: "
                         "give one per --target, in order, or none (build/<target>/report.json)")


def members(args: argparse.Namespace, targets: list[str]
            ) -> tuple[Engine, list[lib.Member]]:
    """The engine, and each target's release image with its recorded verdict and report."""
    matrix = load_matrix(args.matrix)
    for t in targets:
        matrix.target(t)  # an unknown target: bad input, before the engine is asked
    reports = args.report or [Path("build") / t / "report.json" for t in targets]
    out = []
    engine = None
    for target, report in zip(targets, reports):
        engine, image = _shared.engine_image(f"{args.tag_prefix}:{target}", target, PublishError)
        out.append(lib.Member(target, image, verdicts.lookup(image.id), report))
    assert engine is not None
    return engine, out


def run(args: argparse.Namespace, targets: list[str]) -> int:
    _refuse_options(args, targets)
    require = verdicts.requirement(args.require)
    engine, chosen = members(args, targets)
    problem = lib.refusal(chosen, require)
    if problem is not None:  # known here: the registry is not even asked
        raise problem
    transfer.preflight(args.registry, insecure=args.insecure, attempts=max(1, min(args.attempts, 2)))
    record = lib.publish_index(
        engine, chosen, args.registry, tag=args.tag,
        record_path=args.record or Path("build") / args.tag / "publish-index.json",
        sign_key=args.sign_key, insecure=args.insecure, attempts=args.attempts, require=require)
    if args.json:
        print(json.dumps(record, indent=2, sort_keys=True))
    else:
        print("\n".join(lines(record)))
    return 0


def lines(record: dict[str, Any]) -> list[str]:
    """The index record, for a person: the one name, and each platform under it."""
    index = record["index"]
    out = [f"index  {index['tag']} -> {index['digest']} ({len(record['platforms'])} platforms)"]
    for p in record["platforms"]:
        v = p.get("verdict") or {}
        att = (p.get("attestations") or {}).get("image") or {}
        out.append(f"  {p['platform']:16} {p['digest'][:19]}  {p['target']}: verdict "
                   f"{v.get('overall')}, {v.get('level') or v.get('scope')} level; "
                   f"{len(att.get('referrers') or [])} signed referrers")
    out.append(f"record {record['record']}")
    return out
