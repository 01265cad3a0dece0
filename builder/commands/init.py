"""``build-env init DIR``: a starter site (matrix, snapshot, locks)."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.commands import _shared
from builder.targets import init_site

NAME = "init"
HELP = "write a starter site directory (matrix, snapshot, locks)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("directory", type=Path, metavar="DIR")
    _shared.json_flag(p, "the files written")
    _shared.quiet(p)


def run(args: argparse.Namespace) -> int:
    written = init_site(args.directory)
    if args.json:
        _shared.emit_json("init", {"site": str(args.directory.resolve()),
                                   "written": [str(p) for p in written]})
    _shared.info(args, f"{args.directory}: verl-env site with {len(written)} files (matrix.yaml, "
                       f"metadata/, locks/); next: cd {args.directory} && build-env check")
    return 0
