"""``build-env lock``: the full dependency lock (hashes included) per target. The existing lock
is uv's preference: a re-lock with no change is byte-identical, and pins move only on request.
A lock made from the inputs the target has now (its recorded input hash, body digests, source
and prebuilt records all as ``check`` wants them) is kept without asking uv or the index:
``--refresh`` (or ``--upgrade``, ``--upgrade-package``, ``--repin``, ``--probe``) resolves again."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from builder import exclusive as runlock
from builder.resolve import sources, vendor
from builder.commands import _shared
from builder.resolve.compat import check_target
from builder.errors import CompatError, LockError
from builder.resolve.lock import (compile_lock, lock_path, moved_pins, parse_lock,
                                  refuse_unmeant, stale_reason)

NAME = "lock"
HELP = "resolve the full dependency lock (with hashes) for a target"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    p.add_argument("--target", help="lock one target (default: all)")
    p.add_argument("--probe", action="store_true",
                   help="vendor bases: inspect the base through the engine first and record "
                        "its interpreter and freeze in locks/T.base.json")
    p.add_argument("--offline", action="store_true", help="resolve from uv's cache only")
    # --upgrade moves every pin already: naming packages beside it is refused, not ignored
    upgrade = p.add_mutually_exclusive_group()
    upgrade.add_argument("--upgrade", action="store_true",
                         help="move every pin to its newest allowed version (default: the "
                              "existing lock's versions are kept wherever the matrix allows)")
    upgrade.add_argument("--upgrade-package", dest="upgrade_packages", action="append",
                         default=[], metavar="NAME",
                         help="move this package (repeatable); everything else stays")
    p.add_argument("--refresh", action="store_true",
                   help="resolve again with uv even when the lock was made from the inputs the "
                        "target has now (default: such a lock is kept, in well under a second; "
                        "a git ref that moved upstream is seen only by a resolution)")
    p.add_argument("--repin", action="store_true",
                   help="git sources: record the commit a ref names now even when it moved "
                        "since the lock recorded it (review the new commit first)")
    p.add_argument("--no-fetch", action="store_true",
                   help="git sources: keep the recorded commit of each unchanged source without "
                        "asking its remote (a host that cannot reach it); the ref is not "
                        "re-checked, and a source with no record is refused")
    _shared.index_url(p)
    _shared.json_flag(p, "each target's lock and what moved")
    _shared.quiet(p)


def base_record(args: argparse.Namespace, t: Any, lock_file: Path, probe: bool
                ) -> dict[str, Any] | None:
    """The vendor base's record: probed now (``--probe``, through the engine) and written beside
    the lock, or the one already there (builder.resolve.vendor)."""
    if not t.base.vendor:
        if probe:
            _shared.info(args, f"{t.name}: not a vendor base (base.vendor unset): nothing to probe")
        return None
    if not probe:
        return vendor.load_record(t, lock_file)
    with _shared.progress(args, f"{t.name}: probing the base through the engine"):
        from builder.engine import Engine  # the docker SDK, only when a base is probed

        record = vendor.probe(Engine.connect(), t)
    vendor.write_record(vendor.base_record_path(lock_file), record)
    _shared.info(args, f"{t.name}: base {record['image_id']} probed: {record['interpreter']} "
                       f"({record['kind']}), {len(record['dists'])} distributions -> "
                       f"{vendor.base_record_path(lock_file)}")
    for line in vendor.mismatches(t, record):
        print(f"warning: {t.name}: {line} (the gate will refuse the image)", file=sys.stderr)
    return record


def _unchanged(t: Any, snapshot: Any, path: Path) -> bool:
    """The lock was made from the inputs the target has now, and no git source on this host
    (``git+file://``, asked without a network call, as ``check`` asks) moved since: a remote
    one is asked only by a resolution (``--refresh``)."""
    return (stale_reason(t, snapshot, path) is None
            and not sources.moved_refs(t, path, remote=False)[0])


def _kept(args: argparse.Namespace, t: Any, path: Path) -> dict[str, Any]:
    """The result for a lock kept as it is: made from the target's inputs as they are now."""
    count = len(parse_lock(path.read_text()))
    _shared.info(args, f"{t.name}: {path} ({count} packages), unchanged: locked from the inputs "
                       "the target has now (--refresh resolves again)")
    return {"target": t.name, "lock": str(path), "seconds": 0.0, "packages": count,
            "unchanged": True, "resolved": False, "moved": []}


def run(args: argparse.Namespace) -> int:
    site = _shared.writable_site(args, "lock")
    targets = site.targets([args.target] if args.target else None)
    snapshot = site.snapshot(targets)
    wanted = {canonicalize_name(n) for n in args.upgrade_packages}
    for t in targets:  # every named package must be in the lock or the matrix: checked first
        known = {canonicalize_name(p.name) for p in t.enabled_packages}
        if lock_path(site.path, t).is_file():
            known |= {canonicalize_name(n) for n in parse_lock(lock_path(site.path, t).read_text())}
        if wanted - known:
            raise LockError(f"--upgrade-package {', '.join(sorted(wanted - known))}: not in the "
                            "lock or the matrix", target=t.name)
        # an unknown extra, an override of a package the lock shows the target does not
        # install: refused before any target resolves (builder.resolve.closure); what cannot be
        # told yet is judged on the resolution, before its lock is written (compile_lock)
        for w in refuse_unmeant(t, snapshot, lock_path(site.path, t)):
            if not args.quiet:
                print(f"warning: {w}", file=sys.stderr)
    results = []
    resolve_all = (args.refresh or args.upgrade or bool(args.upgrade_packages) or args.repin
                   or args.probe)
    for t in targets:
        problems = check_target(t, snapshot)
        if problems:
            raise CompatError("; ".join(str(p) for p in problems), target=t.name)
        path = lock_path(site.path, t)
        # One `lock` of a target at a time: the lock file and its records (base, sources,
        # prebuilt, build tools) are read and written as one set; a second run waits, then
        # starts from the first one's lock (usually: unchanged).
        with runlock.held(runlock.key_for_path(path), what=f"lock of {t.name} ({path})"):
            if not resolve_all and _unchanged(t, snapshot, path):
                results.append(_kept(args, t, path))
                continue
            record = base_record(args, t, path, args.probe)
            before = path.read_text() if path.is_file() else None
            with _shared.progress(args, f"{t.name}: resolving with uv"):
                lock = compile_lock(t, snapshot, path, offline=args.offline, record=record,
                                    prefer=None if args.upgrade else path,
                                    upgrade_packages=tuple(args.upgrade_packages),
                                    repin=args.repin, fetch_git=not args.no_fetch)
        moved = moved_pins(before, lock.text)
        count = len(parse_lock(lock.text))
        results.append({"target": t.name, "lock": str(lock.path), "seconds": round(lock.seconds, 2),
                        "packages": count, "unchanged": lock.text == before, "resolved": True,
                        "moved": [{"name": n, "old": o, "new": v} for n, o, v in moved]})
        _shared.info(args, f"{t.name}: {lock.path} ({count} packages, {lock.seconds:.1f} s)"
                           f"{', unchanged' if lock.text == before else ''}")
        for name, old, new in moved:
            _shared.info(args, f"  {name} {old or '(new)'} -> {new or '(removed)'}")
    if args.json:
        _shared.emit_json("lock", {"targets": results})
    return 0
