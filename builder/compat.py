"""Cross-package compatibility check over one target's pins (pure; metadata comes in as data).

Every enabled pinned package's declared requirements (markers evaluated for the target's python
and architecture, with the extras the matrix asks for) must be satisfied by the other pins. Two
packages that constrain the same dependency to ranges no release satisfies are reported together,
naming both packages and both ranges. Packages *provided* by the base image are checked as
dependencies only: their index metadata describes the index build, not the vendor's (AMD's vLLM is
built on a different torch than the index's vLLM wheel says).
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.metadata import Snapshot
from builder.spec import Package, Target


@dataclass(frozen=True)
class Problem:
    """One failed compatibility rule, with the matrix location it concerns."""

    where: str  # file:line
    key: str  # dotted key inside the target
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.key}: {self.message}"


def marker_env(target: Target, extra: str = "") -> dict[str, str]:
    return {
        "python_version": target.python, "python_full_version": f"{target.python}.0",
        "platform_machine": target.arch, "sys_platform": "linux", "platform_system": "Linux",
        "os_name": "posix", "implementation_name": "cpython",
        "platform_python_implementation": "CPython", "extra": extra,
    }


def _applies(req: Requirement, target: Target, extras: tuple[str, ...]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate(marker_env(target, e)) for e in ("", *extras))


def _key(target: Target, p: Package) -> str:
    return f"{'provided' if p in target.provided else 'packages'}.{p.name}"


def _fmt(spec: SpecifierSet) -> str:
    return str(spec) or "(any)"


def _disjoint(a: SpecifierSet, b: SpecifierSet, known: list[str]) -> bool:
    """True when no known release satisfies both ranges (needs the dependency's version list)."""
    return bool(known) and not any(a.contains(v, prereleases=True) and
                                   b.contains(v, prereleases=True) for v in known)


def check_target(target: Target, snapshot: Snapshot) -> list[Problem]:
    """Return every compatibility problem of ``target``; an empty list means it passes."""
    problems: list[Problem] = []
    if target.provided and not target.base.vendor:
        problems.append(Problem(
            target.where("provided"), f"targets.{target.name}.provided",
            f"provided packages ({', '.join(p.name for p in target.provided)}) need a base that "
            "provides them: set base.vendor (declared or probed) and base.interpreter, or move "
            "them to packages: (a fresh venv would hide the base's copies)"))
    pins = {p.name: p for p in (*target.enabled_packages, *target.provided)}
    constraints: dict[str, list[tuple[Package, Requirement]]] = {}

    for p in target.enabled_packages:
        rel = snapshot.release(p.name, p.version)
        if rel is None and p.name in local_sources(target):
            continue  # a local-only source build: nothing on the index to check it against
        if rel is None:
            problems.append(Problem(target.where(_key(target, p)), f"targets.{target.name}."
                                    f"{_key(target, p)}", f"no metadata for {p.name}=={p.version} "
                                    "in the snapshot: run `build-env check --online`"))
            continue
        if rel.requires_python and not SpecifierSet(rel.requires_python).contains(
                Version(f"{target.python}.0"), prereleases=True):
            problems.append(Problem(target.where("python"), f"targets.{target.name}.python",
                                    f"python {target.python} is outside {p.name} {p.version}'s "
                                    f"Requires-Python {rel.requires_python}"))
        for req in rel.requirements():
            if _applies(req, target, p.extras):
                constraints.setdefault(canonicalize_name(req.name), []).append((p, req))

    for dep, cons in sorted(constraints.items()):
        known = snapshot.versions.get(dep, [])
        pin = pins.get(dep)
        if pin is not None and pin.version not in known:
            known = [*known, pin.version]
        reported: set[str] = set()
        for i, (a, ra) in enumerate(cons):
            for b, rb in cons[i + 1:]:
                if a.name == b.name or not _disjoint(ra.specifier, rb.specifier, known):
                    continue
                problems.append(Problem(
                    target.where(_key(target, b)), f"targets.{target.name}.{_key(target, b)}",
                    f"conflict on {dep}: {a.name} {a.version} requires {dep}{_fmt(ra.specifier)} "
                    f"but {b.name} {b.version} requires {dep}{_fmt(rb.specifier)}; "
                    f"no {dep} release satisfies both"))
                reported.update((a.name, b.name))
        if pin is None:
            continue
        for p, req in cons:
            if p.name in reported or req.specifier.contains(pin.version, prereleases=True):
                continue
            problems.append(Problem(
                target.where(_key(target, pin)), f"targets.{target.name}.{_key(target, pin)}",
                f"{dep} {pin.version} does not satisfy {p.name} {p.version}'s requirement "
                f"{dep}{_fmt(req.specifier)}"))
    return problems


def index_pins(target: Target) -> list[tuple[str, str]]:
    """The ``(name, version)`` pairs whose metadata comes from the package index. Provided
    packages are not among them: their versions are the vendor's own builds (e.g.
    ``2.9.1.dev20251204+rocm7.0.2``), checked against the base, never looked up on the index."""
    return [(p.name, p.version) for p in target.enabled_packages]


def local_sources(target: Target) -> list[str]:
    """Packages built from a source of their own: a git repository, a local directory, an
    archive or a URL (they may be absent from the index)."""
    return [p.name for p in target.enabled_packages
            if p.build == "source" and p.source is not None]
