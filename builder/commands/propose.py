"""``build-env propose``: the newest coherent pins for a target, why each stops there, and a
candidate (matrix diff, snapshot, lock) proven by the build and the gate before review."""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.argtypes import positive_int
from builder.commands import _shared
from builder.errors import BuildEnvError, SpecError
from builder.matrix.spec import Target
from builder.propose import candidate, outputs
from builder.propose.online import refresh_candidates
from builder.propose.proposal import Proposal, propose
from builder.propose.search import Anchors
from builder.resolve.metadata import IndexClient, Snapshot, load_snapshot
from builder.resolve.targets import Site

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
                        "PROPOSAL.md, proposal.json; DIR/<target> for several); a new or empty "
                        "DIR, or this tool's own earlier output; never the site")
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


# a candidate made and refused: a failure (exit 1, or the build's own code), its directory kept as
# the record of why (`--apply` refuses it)
REFUSED = ("unresolvable", "gate-failed", "build-failed")


@dataclass
class Outcome:
    """One target's result: ``code`` is what ``propose --target T`` alone would exit with."""

    target: str
    status: str  # a proposal's status, or "error" (propose stopped: no candidate is left)
    code: int
    error: str | None
    output: Path | None
    doc: dict[str, Any]

    def line(self) -> str:
        if self.code == 0:
            return f"{self.target}: {self.status}" + (f", candidate {self.output}"
                                                      if self.output else "")
        kept = f" (its record: {self.output})" if self.output else ""
        return f"{self.target}: failed, exit {self.code}, {self.status}: {self.error}{kept}"


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
    targets = site.targets(_shared.target_names(args))
    several = len(targets) > 1
    outs = outputs.plan(args.output, [t.name for t in targets], several)  # before any work
    snapshot = _snapshot(args, site, targets)
    job = _Run(args, site, snapshot, anchors, args.output if several else None)
    try:
        results = [job.one(t, outs[t.name]) for t in targets]
    finally:
        if job.parent is not None:
            outputs.release(job.parent, job.created)
    failed = [r for r in results if r.code != 0]
    code = combined_exit([r.code for r in results])
    if several:
        _shared.info(args, "\n".join(["outcome:"] + [f"  {r.line()}" for r in results]))
        _shared.info(args, f"{len(results) - len(failed)} of {len(results)} targets proposed"
                     + (f"; failed: {', '.join(r.target for r in failed)} (exit {code})"
                        if failed else ""))
    if args.json:
        _shared.emit_json("proposal", {"matrix": str(site.path), "online": args.online,
                                       "targets": [r.doc for r in results],
                                       "failed": [r.target for r in failed], "exit_code": code})
    return code


def combined_exit(codes: list[int]) -> int:
    """The run's exit code from its targets': 0 when none failed, the failures' own code when
    they all share it, else 1 (docs/commands.md)."""
    failed = {c for c in codes if c != 0}
    return 0 if not failed else failed.pop() if len(failed) == 1 else 1


def _snapshot(args: argparse.Namespace, site: Site, targets: list[Target]) -> Snapshot:
    if not args.online:
        return site.snapshot(targets)
    snapshot = load_snapshot(site.snapshot_file)  # refreshed in memory, never written back
    with _shared.progress(args, "fetching the candidate releases' metadata"):
        missing = refresh_candidates(snapshot, targets, IndexClient(), limit=args.max_candidates)
    if not args.quiet:
        for m in missing:
            print(f"warning: not fetched: {m}", file=sys.stderr)
    return snapshot


@dataclass
class _Run:
    """One ``propose`` over its targets; ``parent``: the directory of several candidates."""

    args: argparse.Namespace
    site: Site
    snapshot: Snapshot
    anchors: Anchors
    parent: Path | None
    created: bool = False
    claimed: bool = False

    def one(self, t: Target, out: Path | None) -> Outcome:
        """Propose for ``t``; an error stops this target only, and the candidate directory this
        run wrote for it is removed (also on Ctrl-C, which stops the run)."""
        wrote = False
        try:
            proposal = propose(t, self.snapshot, self.anchors)
            with tempfile.TemporaryDirectory(prefix="verl-env-propose-") as tmp:
                locks = Path(tmp) / "locks"
                if not self.args.no_lock:
                    with _shared.progress(self.args, f"{t.name}: resolving the candidate with uv"):
                        candidate.resolve(self.site.path, t, proposal, self.snapshot, locks,
                                          fetch_git=not self.args.no_fetch)
                if out is not None:
                    self._claim()
                    candidate.write(out, site_matrix=self.site.path, target=t, proposal=proposal,
                                    snapshot=self.snapshot,
                                    locks=locks if not self.args.no_lock else None)
                    wrote = True  # a failed write left the path as it was
            built = self._build(t, proposal, out) if self.args.build and out else None
        except BuildEnvError as exc:
            if wrote and out is not None:
                outputs.remove_candidate(out)
            print(f"error: {exc}", file=sys.stderr)
            return Outcome(t.name, "error", exc.exit_code or 1, str(exc), None,
                           {"target": t.name, "status": "error", "error": str(exc),
                            "exit_code": exc.exit_code or 1, "output": None})
        except BaseException:
            if wrote and out is not None:
                outputs.remove_candidate(out)
            raise
        return self._report(proposal, out, built)

    def _claim(self) -> None:
        if self.parent is not None and not self.claimed:
            self.created = outputs.claim(self.parent)
            self.claimed = True

    def _build(self, t: Target, proposal: Proposal, out: Path) -> int | None:
        """The build's exit code (0 proven, 1 refused, 3 the engine...); None: not built."""
        a = self.args
        if proposal.status != "resolved":
            _shared.info(a, f"{t.name}: not built: {proposal.status}")
            return None
        opts = candidate.BuildOptions(
            ca_bundle=a.ca_bundle, templates=a.templates, tag_prefix=a.tag_prefix,
            network=None if a.network == "default" else a.network,
            verify_timeout=a.verify_timeout, gpus=a.gpus, expect_gpus=a.expect_gpus,
            quiet=a.quiet or a.json)
        return candidate.build(out, proposal, self.site.path, opts)

    def _report(self, proposal: Proposal, out: Path | None, built: int | None) -> Outcome:
        a = self.args
        code = (built or 1) if proposal.status in REFUSED else 0
        if not (a.quiet or a.json):
            print("\n".join(proposal.lines()))
            if out is not None:
                print(f"  candidate: {out} (PROPOSAL.md, matrix.diff, proposal.json)")
        if a.quiet and proposal.error:
            print(f"error: {proposal.target}: {proposal.error}", file=sys.stderr)
        doc = ({k: v for k, v in proposal.to_dict().items() if k != "schema"}
               | {"output": str(out) if out else None, "exit_code": code})
        return Outcome(proposal.target, proposal.status, code, proposal.error, out, doc)
