"""``build-env check``: the matrix, the pins' compatibility and the locks."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from builder.resolve import extras, sources
from builder.commands import _shared
from builder.resolve.compat import check_target, index_pins, local_sources, overridden
from builder.resolve.lock import (
    lock_edits, lock_path, parse_lock, refuse_unmeant, stale_reason,
)
from builder.resolve.metadata import IndexClient, load_snapshot, refresh, save_snapshot

NAME = "check"
HELP = "validate the matrix, the pins' compatibility and locks"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    p.add_argument("--target", dest="targets", action="append", default=None,
                   help="check this target (repeatable; default: all)")
    p.add_argument("--online", action="store_true",
                   help="refresh the metadata snapshot from the package index first, and ask "
                        "each git source's remote whether its tag still names the locked "
                        "commit (without it, check makes no network call)")
    p.add_argument("--locked", action="store_true",
                   help="a missing or stale lock is an error (for a site's CI); without it, "
                        "check names `build-env lock` as the next step and passes")
    _shared.index_url(p)
    _shared.json_flag(p, "each target's result")
    _shared.quiet(p)


def forced_json(t: Any, snapshot: Any) -> list[dict[str, Any]]:
    """The target's reviewed dependency overrides (builder.matrix.overrides), each with its reason and
    the declared requirements it replaces."""
    replaces = overridden(t, snapshot)
    return [{"name": o.name, "version": o.version, "reason": o.reason,
             "replaces": [what for n, what in replaces if n == o.name]}
            for o in t.overrides]


def forced_lines(name: str, forced: list[dict[str, Any]]) -> list[str]:
    return [f"override: {name}: {o['name']}=={o['version']} replaces "
            f"{'; '.join(o['replaces'])} ({o['reason']})" for o in forced]


def locked_versions(lock: Any, stale: str | None) -> dict[str, str] | None:
    """The lock's versions, when it was resolved from the target's inputs as they are."""
    if stale or not lock.is_file():
        return None
    return {n: p.version for n, p in parse_lock(lock.read_text()).items()}


def extras_problems(t: Any, snapshot: Any, locked: dict[str, str] | None) -> list[str]:
    """Each unreviewed difference between the lock and what the extras declare
    (builder.resolve.extras): the lock fails, as a stale one does."""
    if locked is None:
        return []
    return [str(e) for e in extras.difference_errors(t, snapshot, locked)]


def refuse(targets: list[Any], snapshot: Any, site: Any) -> list[str]:
    """What the matrix asks for that cannot be meant (an override of a package the target does
    not install, an extra its package does not declare, an extras exception that excuses
    nothing): bad input, refused before anything is reported (builder.resolve.closure,
    builder.resolve.extras); the warnings of what cannot be told."""
    warnings: list[str] = []
    for t in targets:
        warnings += refuse_unmeant(t, snapshot, lock_path(site.path, t))
        unmeant = extras.exception_errors(t, snapshot)
        if unmeant:
            raise unmeant[0]
    return warnings


def run(args: argparse.Namespace) -> int:
    # --online writes the site's snapshot: a site of its own, never the shipped reference
    site = _shared.writable_site(args, "check --online") if args.online else _shared.site(args)
    names = _shared.target_names(args)
    targets = site.targets(names)
    refreshed = None
    if args.online:
        snapshot = load_snapshot(site.snapshot_file)
        pins = [pin for t in targets for pin in index_pins(t)]
        links = [link for t in targets for link in t.find_links]
        local = [n for t in targets for n in local_sources(t)]
        with _shared.progress(args, f"fetching metadata of {len(set(pins))} pinned releases"):
            refresh(snapshot, pins, IndexClient(), links, local)
        save_snapshot(snapshot, site.snapshot_file)
        refreshed = len(set(pins))
        _shared.info(args, f"refreshed {site.snapshot_file} ({refreshed} pinned releases)")
    snapshot = site.snapshot(targets)
    warnings = [w for w in site.matrix.warnings
                if names is None or any(f"targets.{n}." in w for n in names)]
    warnings += refuse(targets, snapshot, site)
    if not args.quiet:
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
    results = []
    for t in targets:
        problems = [str(p) for p in check_target(t, snapshot)]
        lock = lock_path(site.path, t)
        # a source that cannot be pinned (hashed) is reported here, not by a failed build;
        # one not pinned yet is the lock's next step
        problems += [f"{t.where(k)}: targets.{t.name}{'.' + k if k else ''}: {m}"
                     for k, m in sources.problems(t, snapshot, lock) if "not pinned" not in m
                     or args.locked]
        # a lock edited since `build-env lock` wrote it is a failure with or without --locked
        edited = lock_edits(t, lock)
        problems += [f"{t.where('')}: targets.{t.name}: {m}" for m in edited]
        stale = stale_reason(t, snapshot, lock)
        if (stale and args.locked and not edited
                and stale != sources.record_problem(t, lock)):
            problems.append(f"{t.where('')}: targets.{t.name}: {stale}")
        if not stale:  # a git tag that moved since the lock recorded its commit: a remote
            # is asked only under --online (the offline check asks repositories on this host)
            moved, unconfirmed = sources.moved_refs(t, lock, remote=args.online)
            problems += [f"{t.where(k)}: targets.{t.name}.{k}: {m}" for k, m in moved]
            if not args.quiet:
                for w in unconfirmed:
                    print(f"warning: {t.name}: {w}", file=sys.stderr)
        locked = locked_versions(lock, stale)
        problems += extras_problems(t, snapshot, locked)
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        forced = forced_json(t, snapshot)
        if not args.quiet:
            for line in forced_lines(t.name, forced) + extras.summary(t, snapshot, locked):
                print(line, file=sys.stderr)
        status = "fail" if problems else ("unlocked" if stale else "ok")
        results.append({"target": t.name, "status": status, "problems": problems,
                        "next": stale if stale and not problems else None,
                        **({"overrides": forced} if forced else {}),
                        **({"extras": extras.report(t, snapshot, locked)}
                           if extras.declared(t, snapshot) else {})})
        if problems:
            _shared.info(args, f"{t.name}: FAIL")
        elif stale:  # the pins fit together; the lock is the next step, not a failure
            _shared.info(args, f"{t.name}: ok, not locked: {stale}")
        else:
            _shared.info(args, f"{t.name}: ok")
    failed = sum(r["status"] == "fail" for r in results)
    if args.json:
        _shared.emit_json("check", {"matrix": str(site.matrix.path), "refreshed": refreshed,
                                    "warnings": warnings, "targets": results})
    return 1 if failed else 0
