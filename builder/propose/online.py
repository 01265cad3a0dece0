"""``propose --online``: the snapshot refreshed for the releases a proposal may choose.

For every pin the search may move: the index's version list, and for the releases from the
current pin up (at most ``limit``: the ones just above the pin and the newest) their metadata (Requires-Python, Requires-Dist
from the PEP 658 file or an HTTP range read of the wheel: never a whole wheel) and their wheel
file names (the platform tags). Then the version lists of unpinned dependencies two pinned
packages both constrain, so disjoint ranges can be told apart from ranges that meet.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.resolve.compat import applies, local_sources
from builder.resolve.metadata import IndexClient, MetadataError, Snapshot, _file_version
from builder.matrix.spec import Target

DEFAULT_LIMIT = 40


def _files(client: IndexClient, name: str) -> dict[str, list[str]]:
    """Each version's files that are not yanked (a version whose files are all yanked is not
    a candidate: an installer would not pick it)."""
    out: dict[str, list[str]] = {}
    for f in client.project(name).get("files", []):
        fn = f.get("filename", "")
        v = _file_version(fn) if not f.get("yanked") else None
        if v is not None:
            out.setdefault(v, []).append(fn)
    return out


def _candidates(versions: Iterable[str], current: str, limit: int) -> list[str]:
    cur = Version(current)
    out = []
    for v in versions:
        try:
            parsed = Version(v)
        except InvalidVersion:
            continue
        if parsed >= cur and (not parsed.is_prerelease or v == current):
            out.append(parsed)
    ordered = sorted(out)
    if len(ordered) > limit:  # the releases just above the pin (where a blocked package stops)
        ordered = ordered[:limit // 2] + ordered[-(limit - limit // 2):]  # and the newest
    return [str(v) for v in reversed(ordered)]


def refresh_candidates(snapshot: Snapshot, targets: Iterable[Target], client: IndexClient,
                       *, limit: int = DEFAULT_LIMIT,
                       note: Callable[[str], None] = lambda line: None) -> list[str]:
    """Fetch what the search needs into ``snapshot``; returns the releases that could not be
    fetched (each ``name==version: why``; the search then names them as lacking metadata)."""
    missing: list[str] = []
    pinned: set[str] = set()
    seen: set[tuple[str, str]] = set()
    for t in targets:
        local = set(local_sources(t))
        for p in t.enabled_packages:
            pinned.add(p.name)
            if p.name in local and snapshot.release(p.name, p.version) is None:
                continue  # a site's own source package: not on the index
            try:
                files = _files(client, p.name)
                versions = [v for v in client.versions(p.name) if v in files]
            except MetadataError as exc:
                missing.append(f"{p.name}: {exc}")
                continue
            snapshot.versions[p.name] = versions
            chosen = _candidates(versions, p.version, limit)
            note(f"{t.name}: {p.name}: {len(chosen)} releases from {p.version} up")
            for v in chosen:
                if v not in files:  # the pin itself may be a find-links build (2.13.0+cpu)
                    continue
                if (p.name, v) in seen:
                    continue
                seen.add((p.name, v))
                key = f"{canonicalize_name(p.name)}=={v}"
                rel = snapshot.releases.get(key)
                if rel is None:
                    try:
                        rel = client.release(p.name, v)
                    except MetadataError as exc:
                        missing.append(f"{p.name}=={v}: {exc}")
                        continue
                wheels = sorted(f for f in files.get(v, []) if f.endswith(".whl"))
                snapshot.releases[key] = replace(rel, wheels=tuple(wheels))
    # unpinned dependencies constrained by two pinned packages' candidate releases
    constrainers: dict[str, set[str]] = {}
    for t in targets:
        for key, rel in snapshot.releases.items():
            owner = key.split("==", 1)[0]
            pin = t.package(owner)
            if (owner, rel.version) not in seen or pin is None:
                continue
            for req in rel.requirements():
                dep = canonicalize_name(req.name)
                if dep not in pinned and applies(req, t, pin.extras):
                    constrainers.setdefault(dep, set()).add(owner)
    shared = sorted(d for d, names in constrainers.items() if len(names) >= 2)
    note(f"version lists of {len(shared)} shared dependencies")
    for shared_dep in shared:
        try:
            snapshot.versions[shared_dep] = client.versions(shared_dep)
        except MetadataError as exc:
            missing.append(f"{shared_dep}: {exc}")
    snapshot.fetched = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return missing
