"""The newest coherent set of pins for one target: the tool's own search over the snapshot.

Every enabled pin of the target is a variable; its domain is the releases the snapshot knows
(and the target's find-links directories hold) from the current pin upward, newest first, less
the ones that cannot be installed on the target at all (:mod:`builder.propose.coherence`). Two
choices agree when each one's declared requirements (markers evaluated for the target, with the
extras the matrix asks for) contain the other's version, and when the ranges both put on a
dependency that is not pinned leave some known release of it. Packages are decided in a fixed
order of importance (verl, the rollout engine, torch, transformers, then the matrix's order),
each the newest that still leaves the rest a coherent choice: the first solution of a
depth-first search that tries newest first. uv is the final word (``builder.resolve.lock``); this
search is what makes its answer explainable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from builder.resolve.compat import applies, local_sources
from builder.errors import BuildEnvError
from builder.resolve.metadata import Release, Snapshot, local_release
from builder.matrix import overrides
from builder.propose import coherence
from builder.matrix.model import Package, Target, engine_distributions

PRIORITY = ("verl", *engine_distributions(), "torch", "transformers")
NODE_BUDGET = 200_000


class ProposeError(BuildEnvError):
    stage = "propose"


class NotProven(ProposeError):
    """``--apply`` of a proposal whose candidate did not pass the gate: a check failed."""

    exit_code = 1


@dataclass(frozen=True)
class Anchors:
    """What the search may not choose freely: ``hold`` keeps pins, ``want`` fixes versions,
    ``only`` (``--package``) moves just these and keeps every other pin."""

    hold: frozenset[str] = frozenset()
    want: Mapping[str, str] = field(default_factory=dict)
    only: frozenset[str] = frozenset()

    @staticmethod
    def parse(hold: Iterable[str] = (), want: Iterable[str] = (), only: Iterable[str] = ()
              ) -> Anchors:
        wanted: dict[str, str] = {}
        for item in want:
            name, sep, version = item.partition("==")
            if not sep or not name.strip() or not version.strip():
                raise ProposeError(f"--want expects NAME==VERSION, got {item!r}")
            try:
                wanted[canonicalize_name(name.strip())] = str(Version(version.strip()))
            except InvalidVersion:
                raise ProposeError(f"--want {item}: {version!r} is not a version (PEP 440)"
                                   ) from None
        return Anchors(frozenset(canonicalize_name(n) for n in hold), wanted,
                       frozenset(canonicalize_name(n) for n in only))


@dataclass(frozen=True)
class Conflict:
    """Why two choices disagree. ``pin``: ``a`` requires ``dep`` (pinned, here at
    ``b_version``) in ``a_spec``; ``shared``: ``a`` and ``b`` put ``a_spec`` and ``b_spec`` on
    ``dep`` and no known release of it is in both."""

    kind: str  # pin | shared
    a: str
    a_version: str
    b: str
    b_version: str
    dep: str
    a_spec: str
    b_spec: str = ""


@dataclass
class Space:
    """The target, its snapshot and find-links releases, and every choice's requirements."""

    target: Target
    snapshot: Snapshot
    anchors: Anchors = field(default_factory=Anchors)
    local: dict[tuple[str, str], Release] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tags = coherence.supported_tags(self.target)
        self._reqs: dict[tuple[str, str], list[Requirement]] = {}
        self._conflicts: dict[tuple[str, str, str, str], Conflict | None] = {}
        self.local_only = {p.name for p in self.target.enabled_packages
                           if p.name in local_sources(self.target)
                           and self.release(p.name, p.version) is None}
        if not self.local:
            self.local = find_links_releases(self.target)
        names = {p.name for p in self.target.enabled_packages}
        for name in (*self.anchors.hold, *self.anchors.want, *self.anchors.only):
            if name not in names:
                raise ProposeError(f"{name} is not an enabled pin of targets.{self.target.name}"
                                   f" (its pins: {', '.join(sorted(names))})",
                                   target=self.target.name)

    # ------------------------------------------------------------------ facts
    @property
    def packages(self) -> list[Package]:
        """The enabled pins in the order they are decided."""
        pins = list(self.target.enabled_packages)
        rank = {n: i for i, n in enumerate(PRIORITY)}
        return sorted(pins, key=lambda p: (rank.get(p.name, len(rank)), pins.index(p)))

    def package(self, name: str) -> Package:
        p = self.target.package(name)
        assert p is not None
        return p

    def release(self, name: str, version: str) -> Release | None:
        return self.local.get((name, version)) or self.snapshot.release(name, version)

    def fixed(self, name: str) -> bool:
        """Provided by the base, or built from a local source the index does not know: not
        moved, and its (unknown or vendor-specific) requirements are not checked."""
        return name in self.local_only or any(p.name == name for p in self.target.provided)

    def requirements(self, name: str, version: str) -> list[Requirement]:
        key = (name, version)
        if key not in self._reqs:
            rel = self.release(name, version)
            pin = self.target.package(name)
            extras = pin.extras if pin is not None else ()
            # a reviewed override replaces what it names, as in `check` and `lock`
            self._reqs[key] = [] if rel is None or self.fixed(name) else [
                r for r in overrides.kept(self.target.overrides, name, rel.requirements())
                if canonicalize_name(r.name) != name and applies(r, self.target, extras)]
        return self._reqs[key]

    def known_versions(self, name: str, current: str) -> list[Version]:
        """Every release the snapshot and find-links know, final releases only (unless the pin
        itself is a pre-release), oldest first."""
        raw = set(self.snapshot.versions.get(name, []))
        raw |= {k.split("==", 1)[1] for k in self.snapshot.releases if k.split("==")[0] == name}
        mine = {v for n, v in self.local if n == name}
        pre = Version(current).is_prerelease
        out = set()
        for v in raw | mine | {current}:
            try:
                parsed = Version(v)
            except InvalidVersion:
                continue
            if parsed.is_prerelease and not pre and v != current:
                continue
            # a local build (+cpu, +cu128) is this target's only from its own find-links: the
            # snapshot may hold another target's
            if parsed.local and v not in mine and v != current:
                continue
            out.add(parsed)
        return sorted(out)

    def newest(self, name: str, current: str) -> str:
        return str(self.known_versions(name, current)[-1])

    def unusable(self, name: str, version: str) -> coherence.Stop | None:
        return coherence.unusable(self.package(name), self.release(name, version), version,
                                  self.target, self.tags)

    def overridden(self, name: str) -> overrides.Override | None:
        """The reviewed override that holds ``name`` to one version, if any."""
        return overrides.as_map(self.target.overrides).get(name)

    def domain(self, name: str) -> list[str]:
        """The versions the search may choose for ``name``, newest first."""
        pin = self.package(name)
        forced = self.overridden(name)
        if forced is not None:  # an override holds its package to its version
            return [forced.version]
        if self.fixed(name) or name in self.anchors.hold or (
                self.anchors.only and name not in self.anchors.only):
            return [pin.version]
        if name in self.anchors.want:
            want = self.anchors.want[name]
            why = self.unusable(name, want)
            if why:
                raise ProposeError(f"--want {name}=={want}: {why.reason}",
                                   target=self.target.name)
            return [want]
        current = Version(pin.version)
        out = [str(v) for v in reversed(self.known_versions(name, pin.version))
               if v > current and self.unusable(name, str(v)) is None]
        return [*out, pin.version]  # the reviewed pin stays a choice whatever the checks say

    # ------------------------------------------------------------------ agreement
    def conflict(self, a: str, va: str, b: str, vb: str) -> Conflict | None:
        key = (a, va, b, vb)
        if key not in self._conflicts:
            self._conflicts[key] = self._conflict(a, va, b, vb)
        return self._conflicts[key]

    def _conflict(self, a: str, va: str, b: str, vb: str) -> Conflict | None:
        for x, vx, y, vy in ((a, va, b, vb), (b, vb, a, va)):
            for req in self.requirements(x, vx):
                if canonicalize_name(req.name) == y and not req.specifier.contains(
                        vy, prereleases=True):
                    return Conflict("pin", x, vx, y, vy, y, _fmt(req.specifier))
        rb: dict[str, list[SpecifierSet]] = {}
        for req in self.requirements(b, vb):
            rb.setdefault(canonicalize_name(req.name), []).append(req.specifier)
        for req in self.requirements(a, va):
            dep = canonicalize_name(req.name)
            if dep not in rb or self.target.package(dep) is not None:
                continue
            for spec in rb[dep]:
                if self.disjoint(dep, req.specifier, spec):
                    return Conflict("shared", a, va, b, vb, dep, _fmt(req.specifier), _fmt(spec))
        return None

    def disjoint(self, dep: str, x: SpecifierSet, y: SpecifierSet) -> bool:
        known = self.snapshot.versions.get(dep, [])
        return bool(known) and not any(x.contains(v, prereleases=True) and
                                       y.contains(v, prereleases=True) for v in known)

    # ------------------------------------------------------------------ search
    def solve(self, fixed: Mapping[str, str] | None = None) -> dict[str, str] | None:
        """The first coherent assignment, newest first in the order of :attr:`packages`
        (``fixed`` pins some names to one version); None when there is none."""
        order = [p.name for p in self.packages]
        domains = {n: [fixed[n]] if fixed and n in fixed else self.domain(n) for n in order}
        chosen: dict[str, str] = {}
        nodes = 0

        def place(i: int) -> bool:
            nonlocal nodes
            if i == len(order):
                return True
            name = order[i]
            for v in domains[name]:
                nodes += 1
                if nodes > NODE_BUDGET:
                    raise ProposeError(f"the search over targets.{self.target.name} went past "
                                       f"{NODE_BUDGET} choices: anchor some pins (--hold, "
                                       "--want, --package)", target=self.target.name)
                if all(self.conflict(name, v, q, vq) is None for q, vq in chosen.items()):
                    chosen[name] = v
                    if place(i + 1):
                        return True
                    del chosen[name]
            return False

        return dict(chosen) if place(0) else None


def _fmt(spec: SpecifierSet) -> str:
    return ",".join(sorted(str(s) for s in spec)) or "(any)"


def find_links_releases(target: Target) -> dict[tuple[str, str], Release]:
    """The releases in the target's local find-links directories (a site's own CPU torch)."""
    out: dict[tuple[str, str], Release] = {}
    pins = {p.name for p in target.enabled_packages}
    for d in target.find_links:
        folder = Path(d)
        for wheel in sorted(folder.glob("*.whl")) if folder.is_dir() else ():
            try:
                name, version, _, _ = parse_wheel_filename(wheel.name)
            except (InvalidWheelFilename, InvalidVersion):
                continue
            if name not in pins:
                continue
            rel = local_release(name, str(version), [d])
            if rel is not None:
                prev = out.get((name, str(version)))
                wheels = (*(prev.wheels if prev else ()), wheel.name)
                out[(name, str(version))] = Release(rel.name, rel.version, rel.requires_python,
                                                    rel.requires_dist, None, True, wheels)
    return out
