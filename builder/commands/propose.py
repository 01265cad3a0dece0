"""``build-env propose``: the newest coherent pins for a target, why each stops there, and a
candidate (matrix diff, snapshot, lock) proven by the build and the gate before review."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from builder.argtypes import positive_int
from builder.commands import _shared
from builder.errors import SpecError
from builder.resolve.metadata import IndexClient, load_snapshot
from builder.propose import candidate
from builder.propose.online import refresh_candidates
from builder.propose.proposal import propose
from builder.propose.search import Anchors

NAME = "propose"
HELP = "propose the newest coherent pins for a target, say why each stops, prove the candidate"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--target", dest="targets", action="append",
                       help="propose for this target (repeatable)")
    which.add_argument("--all", action="store_true", help="propose for every target")
    which.add_argument("--apply", type=Path, default=None, metavar="DIR",
                       help="write the proven proposal in DIR into the matrix, its lock and "
                            "snapshot (an unproven one is refused)")
    p.add_argument("--hold", action="append", default=[], metavar="NAME",
                   help="keep this pin where it is (repeatable)")
    p.add_argument("--want", action="append", default=[], metavar="NAME==VERSION",
                   help="take exactly this release and fit the rest around it (repeatable)")
    p.add_argument("--package", dest="only", action="append", default=[], metavar="NAME",
                   help="move only this package (repeatable); every other pin stays")
    p.add_argument("--online", action="store_true",
                   help="refresh the snapshot for the candidate releases from the package index "
                        "first (metadata only, never a whole wheel); default: the recorded "
                        "snapshot only")
    p.add_argument("--max-candidates", type=positive_int, default=40, metavar="N",
                   help="--online: at most N releases per package, newest first (default 40)")
    p.add_argument("--no-lock", action="store_true",
                   help="the tool's own search only: skip uv's resolution of the candidate")
    p.add_argument("--no-fetch", action="store_true",
                   help="keep each git source's recorded commit (its ref is not re-checked "
                        "against a remote this host cannot reach)")
    p.add_argument("--output", type=Path, default=None, metavar="DIR",
                   help="write the candidate here (matrix entry, matrix.diff, snapshot, lock, "
                        "PROPOSAL.md, proposal.json; DIR/<target> for several); never the site")
    p.add_argument("--build", action="store_true",
                   help="render, build and gate the candidate (needs --output): the proposal is "
                        "proven only when the gate passes")
    _shared.render_options(p)
    p.add_argument("--tag-prefix", default="verl-env-proposal", metavar="REPO",
                   help="repository of a proven candidate's tags (default: verl-env-proposal, "
                        "apart from the site's release tags)")
    _shared.gate_options(p)
    _shared.index_url(p)
    _shared.json_flag(p, "each target's proposal")
    _shared.quiet(p)


def run(args: argparse.Namespace) -> int:
    if args.apply is not None:  # writes the site's matrix, lock and snapshot
        site = _shared.writable_site(args, "propose --apply")
        written = candidate.apply(args.apply, site.path, site.snapshot_file)
        _shared.info(args, f"applied {args.apply}: " + ", ".join(str(w) for w in written))
        if args.json:
            _shared.emit_json("proposal-apply", {"applied": str(args.apply),
                                                 "written": [str(w) for w in written]})
        return 0
    site = _shared.site(args)
    if args.build and args.output is None:
        raise SpecError("--build needs --output DIR (the candidate it builds and proves)",
                        file="--build")
    anchors = Anchors.parse(args.hold, args.want, args.only)
    names = _shared.target_names(args)
    targets = site.targets(names)
    if args.online:  # the site's snapshot is read, refreshed in memory, never written back
        snapshot = load_snapshot(site.snapshot_file)
        with _shared.progress(args, "fetching the candidate releases' metadata"):
            missing = refresh_candidates(snapshot, targets, IndexClient(),
                                         limit=args.max_candidates)
        if not args.quiet:
            for m in missing:
                print(f"warning: not fetched: {m}", file=sys.stderr)
    else:
        snapshot = site.snapshot(targets)
    several = len(targets) > 1
    results, code = [], 0
    for t in targets:
        proposal = propose(t, snapshot, anchors)
        out = (args.output / t.name if several else args.output) if args.output else None
        with tempfile.TemporaryDirectory(prefix="verl-env-propose-") as tmp:
            locks = Path(tmp) / "locks"
            if not args.no_lock:
                with _shared.progress(args, f"{t.name}: resolving the candidate with uv"):
                    candidate.resolve(site.path, t, proposal, snapshot, locks,
                                      fetch_git=not args.no_fetch)
            if out is not None:
                candidate.write(out, site_matrix=site.path, target=t, proposal=proposal,
                                snapshot=snapshot, locks=locks if not args.no_lock else None)
        if args.build and out is not None:
            if proposal.status != "resolved":
                _shared.info(args, f"{t.name}: not built: {proposal.status}")
            else:
                opts = candidate.BuildOptions(
                    ca_bundle=args.ca_bundle, templates=args.templates,
                    tag_prefix=args.tag_prefix,
                    network=None if args.network == "default" else args.network,
                    verify_timeout=args.verify_timeout, gpus=args.gpus,
                    expect_gpus=args.expect_gpus, quiet=args.quiet or args.json)
                candidate.build(out, proposal, site.path, opts)
        if proposal.status in ("unresolvable", "gate-failed", "build-failed"):
            code = 1
        if not (args.quiet or args.json):
            print("\n".join(proposal.lines()))
            if out is not None:
                print(f"  candidate: {out} (PROPOSAL.md, matrix.diff, proposal.json)")
        if args.quiet and proposal.error:
            print(f"error: {t.name}: {proposal.error}", file=sys.stderr)
        results.append({k: v for k, v in proposal.to_dict().items() if k != "schema"}
                       | {"output": str(out) if out else None})
    if args.json:
        _shared.emit_json("proposal", {"matrix": str(site.path), "online": args.online,
                                       "targets": results})
    return code
