"""``build-env render``: the build context, without building."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.commands import _shared
from builder.resolve.lock import lock_for, lock_path
from builder.render import render_context
from builder.resolve.targets import resolve_target
from builder.resolve.vendor import load_record

NAME = "render"
HELP = "write the build context without building"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    _shared.overrides(p)
    _shared.render_options(p)
    p.add_argument("--target", required=True)
    p.add_argument("--output", type=Path, default=None,
                   help="context directory (default: build/<target>); an existing directory is "
                        "replaced only if it is an earlier context")
    p.add_argument("--no-fetch", action="store_true",
                   help="do not fetch git and URL sources (the Dockerfile, which names their "
                        "pinned commits and hashes, is the same; the context is for reading, "
                        "it cannot be built)")
    _shared.index_url(p)
    _shared.json_flag(p, "the context written")
    _shared.quiet(p)


def run(args: argparse.Namespace) -> int:
    site = _shared.site(args)
    target = resolve_target(site, args.target, args.overrides, args.base_image)
    snapshot = site.snapshot([target])
    out = args.output or Path("build") / target.name
    if target.override:
        with _shared.progress(args, f"{target.name}: resolving the override's lock with uv"):
            lock_text, lock_file = lock_for(site.path, target, snapshot, out.parent)
    else:
        lock_text, lock_file = lock_for(site.path, target, snapshot, out.parent)
    ctx = render_context(target, lock_text, snapshot, out, lock_file=lock_file,
                         ca_bundle=args.ca_bundle, templates=args.templates,
                         base_record=load_record(target, lock_path(site.path, target)),
                         fetch_sources=not args.no_fetch)
    if args.json:
        _shared.emit_json("render", {"target": target.name, "context": str(ctx.path),
                                     "lock_hash": ctx.lock_hash, "override": target.override,
                                     "labels": ctx.labels})
    _shared.info(args, f"{target.name}: build context in {ctx.path} (lock {ctx.lock_hash[:19]})"
                       + (" without its git/URL sources (--no-fetch)" if args.no_fetch else ""))
    return 0
