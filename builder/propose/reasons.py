"""Why a package stops where the search left it, in words a reviewer can act on.

For a package below its newest release, the next release above the proposal is tried against
the proposal: the first thing that refuses it is named with both packages and both ranges
("vllm 0.32.0 needs transformers>=5.16.1; verl 0.9.1 requires transformers<5.11"), and with
what would unblock it (a newer release of which package, a newer glibc, a wheel for the
target's CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from builder.propose.search import Conflict, Space


@dataclass(frozen=True)
class Blocker:
    version: str  # the release that was refused (the next one above the proposal)
    reason: str
    unblock: str


def _label(space: Space, name: str, version: str) -> str:
    pin = space.target.package(name)
    extras = f"[{','.join(pin.extras)}]" if pin is not None and pin.extras else ""
    return f"{name}{extras} {version}"


def _anchor(space: Space, name: str) -> str | None:
    a = space.anchors
    if name in a.hold:
        return f"--hold {name}"
    if name in a.want:
        return f"--want {name}=={a.want[name]}"
    if a.only and name not in a.only:
        return f"--package {' --package '.join(sorted(a.only))} moves only that"
    return None


def _newest_note(space: Space, name: str, version: str) -> str:
    pin = space.package(name)
    newest = space.newest(name, pin.version)
    return f" ({version} is the newest {name})" if newest == version else ""


def explain(space: Space, solution: dict[str, str], name: str) -> Blocker | None:
    """Why ``name`` is not at a newer release than ``solution[name]`` (None: it is the newest
    known release)."""
    chosen = Version(solution[name])
    pin = space.package(name)
    above = [v for v in space.known_versions(name, pin.version) if v > chosen]
    if not above:
        return None
    nxt = str(above[0])
    anchor = _anchor(space, name)
    if anchor:
        return Blocker(nxt, f"{name} is anchored at {solution[name]} ({anchor})",
                       f"drop {anchor.split(' moves')[0]}")
    forced = space.overridden(name)
    if forced is not None:
        return Blocker(nxt, f"{name} is held at {forced.version} by its reviewed override "
                            f"({forced.reason})", f"review overrides.{name} in the matrix")
    if space.fixed(name):
        return Blocker(nxt, f"{name} is built from a local source", "a new local source")
    stop = space.unusable(name, nxt)
    if stop is not None:
        return Blocker(nxt, stop.reason, stop.unblock)
    found = [(q, c) for q in (p.name for p in space.packages if p.name != name)
             if (c := space.conflict(name, nxt, q, solution[q])) is not None]
    # a conflict the other package could move out of is not the reason: name the one it cannot
    for q, c in found:
        if not _movable(space, solution, name, nxt, q):
            return _from_conflict(space, solution, name, nxt, c)
    if found:
        return _from_conflict(space, solution, name, nxt, found[0][1])
    alt = space.solve({name: nxt})
    if alt is not None:
        moved = [q for q in alt if alt[q] != solution[q] and q != name]
        shown = ", ".join(f"{q} {alt[q]} instead of {solution[q]}" for q in moved)
        return Blocker(nxt, f"{name} {nxt} fits only with {shown} (decided before {name})",
                       f"`--want {name}=={nxt}` to prefer it")
    for q in (p.name for p in space.packages if p.name != name):
        conflicts = [space.conflict(name, nxt, q, v) for v in space.domain(q)]
        if all(conflicts):
            first = conflicts[0]
            assert first is not None
            return _from_conflict(space, solution, name, nxt, first)
    return Blocker(nxt, f"no coherent set holds {name} {nxt} with the other pins at or above "
                        "their current versions", f"`--want {name}=={nxt}` with older anchors")


def _movable(space: Space, solution: dict[str, str], name: str, nxt: str, q: str) -> bool:
    """Whether ``q`` has a choice that takes ``name`` at ``nxt`` and agrees with the rest of
    the proposal."""
    for v in space.domain(q):
        if space.conflict(name, nxt, q, v) is None and all(
                space.conflict(q, v, r, solution[r]) is None
                for r in solution if r not in (name, q)):
            return True
    return False


def _accepting(space: Space, solution: dict[str, str], a: str, name: str, nxt: str) -> str:
    """`` (vllm 0.32.0 allows it and is itself held back: see vllm)`` when a newer release of
    ``a`` than the proposal's would take ``name`` at ``nxt``."""
    chosen = Version(solution[a])
    for v in space.known_versions(a, space.package(a).version):
        if v > chosen and space.release(a, str(v)) is not None and \
                space.conflict(a, str(v), name, nxt) is None:
            return f" ({a} {v} allows it and is itself held back: see {a})"
    return _newest_note(space, a, solution[a])


def _from_conflict(space: Space, solution: dict[str, str], name: str, nxt: str, c: Conflict
                   ) -> Blocker:
    if c.kind == "shared":
        other = c.b if c.a == name else c.a
        ov = c.b_version if c.a == name else c.a_version
        mine, theirs = (c.a_spec, c.b_spec) if c.a == name else (c.b_spec, c.a_spec)
        return Blocker(nxt, f"{_label(space, name, nxt)} needs {c.dep}{mine}; "
                            f"{_label(space, other, ov)} requires {c.dep}{theirs}; no {c.dep} "
                            "release satisfies both",
                       f"a {other} release whose {c.dep} range meets {c.dep}{mine}"
                       + _newest_note(space, other, ov))
    if c.a == name:  # the next release needs another pin elsewhere
        q, vq = c.b, c.b_version
        text = f"{_label(space, name, nxt)} needs {q}{c.a_spec}"
        wanted = SpecifierSet(c.a_spec.replace("(any)", ""))
        for r in (p.name for p in space.packages if p.name not in (name, q)):
            for req in space.requirements(r, solution[r]):
                if req.name.lower().replace("_", "-") != q:
                    continue
                if _disjoint(space, q, wanted, req.specifier):
                    rv = solution[r]
                    spec = ",".join(sorted(str(s) for s in req.specifier))
                    return Blocker(nxt, f"{text}; {_label(space, r, rv)} requires {q}{spec}",
                                   f"a {r} release that allows {q}{c.a_spec}"
                                   + _newest_note(space, r, rv))
        anchor = _anchor(space, q)
        if anchor:
            return Blocker(nxt, f"{text}; {q} is anchored at {vq} ({anchor})",
                           f"drop {anchor.split(' moves')[0]}")
        fits = [v for v in space.known_versions(q, space.package(q).version)
                if wanted.contains(v, prereleases=True)]
        if not fits:
            return Blocker(nxt, f"{text}; no {q} release in that range is known",
                           f"a {q} release in {c.a_spec}")
        for v in fits:
            stop = space.unusable(q, str(v))
            if stop is not None:
                return Blocker(nxt, f"{text}; {stop.reason}", stop.unblock)
        if all(v < Version(space.package(q).version) for v in fits):
            return Blocker(nxt, f"{text}, older than the pinned {q} {space.package(q).version}",
                           f"a {name} release that allows {q} {space.package(q).version}")
        return Blocker(nxt, f"{text}; {q} {vq} is kept by the rest of the proposal",
                       f"`--want {name}=={nxt}` shows what else would have to move")
    # another pin refuses the next release
    return Blocker(nxt, f"{_label(space, c.a, c.a_version)} requires {name}{c.a_spec}",
                   f"a {c.a} release that allows {name} {nxt}"
                   + _accepting(space, solution, c.a, name, nxt))


def _disjoint(space: Space, name: str, x: SpecifierSet, y: SpecifierSet) -> bool:
    pin = space.package(name)
    known = space.known_versions(name, pin.version)
    return not any(x.contains(v, prereleases=True) and y.contains(v, prereleases=True)
                   for v in known)
