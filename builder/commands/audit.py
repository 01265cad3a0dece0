"""``build-env audit IMAGE|TARGET --osv PATH``: every installed Python distribution of an image
(its installed metadata, not the lock) matched against an offline OSV database
(:mod:`builder.audit`); each hit listed with its advisory, aliases, fixed versions and severity,
the database's date always printed. ``--fail-on LEVEL``: a hit at or above it exits 1. The
result of an image is recorded locally (``publish --audit`` attaches it)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from builder.audit import installed, osv
from builder.audit import result as lib
from builder.audit.image import AuditError, read_image
from builder.commands import _shared
from builder.engine import faults
from builder.matrix.spec import load_matrix

NAME = "audit"
HELP = "known vulnerabilities of an image's Python distributions (offline OSV database)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    p.add_argument("subject", metavar="IMAGE_OR_TARGET",
                   help="an image (reference or ID), a matrix target (its release image, "
                        "TAG_PREFIX:TARGET), or a directory (an unpacked root file system or a "
                        "virtual environment)")
    p.add_argument("--osv", type=Path, required=True, metavar="PATH",
                   help="the OSV database: OSV's PyPI all.zip, or the directory it unpacks to")
    p.add_argument("--fail-on", choices=osv.LEVELS, default=None, metavar="LEVEL",
                   help="exit 1 when a hit is at or above this severity (LOW, MODERATE, HIGH, "
                        "CRITICAL; a hit of unknown severity counts)")
    p.add_argument("--tag-prefix", default="verl-env", metavar="REPO",
                   help="repository of the local release tags (default: verl-env)")
    _shared.json_flag(p, "the audit")


def _target_of(args: argparse.Namespace) -> str | None:
    """The matrix target ``subject`` names, when it is a bare name the matrix holds."""
    name = str(args.subject)
    if any(c in name for c in ":/@") or Path(name).exists():
        return None
    return name if name in load_matrix(args.matrix).targets else None


def _subject(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, str]],
                                                  str | None]:
    """(subject, distributions, image ID to record under) of the command's IMAGE_OR_TARGET."""
    where = Path(args.subject)
    if where.is_dir():
        dists = installed.read_tree(str(where))
        return {"path": str(where.absolute())}, dists, None
    target = _target_of(args)
    ref = f"{args.tag_prefix}:{target}" if target else str(args.subject)
    engine, image = _shared.engine_image(ref, target, AuditError)
    with faults.stage(engine, "audit", what=f"the installed metadata of {ref}"):
        found = read_image(engine, image.id)
    subject = {"reference": ref, "image_id": image.id,
               "target": target or (image.labels or {}).get("org.verl-env.target"),
               "interpreters": [str(i) for i in found.get("interpreters") or []],
               "paths": [str(p) for p in found.get("paths") or []]}
    return subject, list(found["distributions"]), image.id


def run(args: argparse.Namespace) -> int:
    with _shared.progress(args, f"reading the OSV database {args.osv}"):
        db = osv.load(args.osv)  # bad input first, before the engine is asked
    subject, dists, image_id = _subject(args)
    hits, unevaluated = lib.match(dists, db)
    doc = lib.document(subject, db, dists, hits, unevaluated)
    failing = lib.failing(doc, args.fail_on)
    if image_id:
        lib.record(image_id, doc)
    if args.json:
        print(json.dumps({**doc, "fail_on": args.fail_on, "failing": len(failing)}, indent=2,
                         sort_keys=True))
    else:
        print("\n".join(lib.text_lines(doc)))
        if args.fail_on:
            print(f"--fail-on {args.fail_on}: {len(failing)} hit(s) at or above it")
    return 1 if failing else 0
