"""``build-env reproduce IMAGE|--target T``: rebuild an image from the inputs it records, with no
cache, into an untagged candidate, and compare the two file trees (:mod:`builder.reproduce`).
Exit 0 identical, 1 a difference (each path named), 3 the inputs cannot be had (each named).
``--against-record``: the image against the tree recorded for it, with no rebuild."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from builder.commands import _shared
from builder.engine import Engine
from builder.errors import UsageError
from builder.reproduce.run import ReproduceRequest, against_record, reproduce

NAME = "reproduce"
HELP = "rebuild an image from its recorded inputs with no cache and compare the file trees"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    p.add_argument("image", nargs="?", default=None, metavar="IMAGE",
                   help="the image (reference or ID) built by build-env; its labels name the "
                        "target, matrix entry, lock and sources")
    p.add_argument("--target", default=None,
                   help="instead of IMAGE: the image under this target's content tag here")
    _shared.render_options(p)
    p.add_argument("--tag-prefix", default="verl-env", metavar="REPO",
                   help="the repository of the image's tags (default: verl-env)")
    p.add_argument("--network", default="host",
                   help="network for build steps (default: host; 'default' for the daemon's)")
    p.add_argument("--keep", action="store_true",
                   help="keep the rebuilt candidate (untagged; its ID is printed)")
    p.add_argument("--tree", type=Path, default=None, metavar="PATH",
                   help="write the original image's per-file list (path, type, mode, owner, "
                        "size, digest) and root digest here, as JSON")
    p.add_argument("--no-record", dest="record", action="store_false",
                   help="do not record the proved tree with the image's verdict")
    p.add_argument("--against-record", nargs="?", const="", default=None, metavar="FILE",
                   help="no rebuild: compare the image with the tree recorded for it (its "
                        "local verdict's, or FILE: a --tree document or a verdict record)")
    p.add_argument("--json", action="store_true",
                   help="print the result as JSON (schema verl-env/reproduce/v1)")


def _say(line: str) -> None:
    print(f"reproduce: {line}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    if (args.image is None) == (args.target is None):
        raise UsageError("reproduce: name the image (IMAGE) or --target T, one of them")
    if args.tree is not None and not args.tree.parent.is_dir():
        raise UsageError(f"reproduce --tree {args.tree}: no such directory {args.tree.parent}")
    if args.against_record is not None:
        if args.image is None:
            raise UsageError("reproduce --against-record: name the image (IMAGE)")
        return _against(args)
    req = ReproduceRequest(image=args.image, target=args.target, matrix=args.matrix,
                           snapshot=args.snapshot, ca_bundle=args.ca_bundle,
                           templates=args.templates, tag_prefix=args.tag_prefix,
                           network=None if args.network == "default" else args.network,
                           keep=args.keep, tree=args.tree, record=args.record)
    engine = Engine.connect()
    outcome = reproduce(req, engine, say=(lambda line: None) if args.json else _say)
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=2, sort_keys=True))
    else:
        for line in outcome.comparison.lines():
            print(line)
        if outcome.kept:
            _say(f"the rebuilt candidate is kept: {outcome.candidate}")
        if outcome.recorded:
            _say(f"recorded with the verdict of {outcome.original[7:19]}: root {outcome.root}")
    return outcome.exit_code


def _against(args: argparse.Namespace) -> int:
    record = Path(args.against_record) if args.against_record else None
    comparison, root, recorded = against_record(Engine.connect(), args.image, record)
    same = root == recorded if comparison is None else comparison.identical
    if args.json:
        print(json.dumps({"schema": "verl-env/reproduce-record/v1", "image": args.image,
                          "root": root, "recorded_root": recorded, "identical": same,
                          "differences": [d.to_dict() for d in comparison.differences]
                          if comparison else None}, indent=2, sort_keys=True))
    elif comparison is not None:
        for line in comparison.lines():
            print(line)
    else:
        print(f"identical (root {root})" if same else
              f"differs: root {root}, recorded {recorded} (give --against-record FILE with a "
              "--tree document to name the files)")
    return 0 if same else 1
