"""A target's lock against what its pinned packages' extras declare (issue 37 item 1).

verl states in its own metadata what each way of training needs (``verl[fsdp]``: flash-attn,
cupy, liger-kernel, trl, flash-linear-attention ...). A target that asks for ``verl[vllm,fsdp]``
must hold all of it, at the versions declared, except what the matrix names in
``extras_exceptions`` with a reason (a package the index lacks, one built from its own source
block, one that conflicts with the stack). The exceptions are left out of the resolution
(:func:`excluded`: uv's ``--excludes``), so the lock never holds them by accident.

The declared requirements are read from the recorded metadata snapshot: every ``Requires-Dist``
line of the pinned release whose marker holds for one of the asked extras on the target's
platform, following the package's references to its own extras (``verl[verl-core]``).

Pure: the snapshot and the lock come in as data; errors are :class:`SpecError`
(file:line: key, exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from builder.errors import SpecError
from builder.matrix.spec import Package, Target
from builder.resolve.compat import holds
from builder.resolve.metadata import Snapshot


@dataclass(frozen=True)
class Declared:
    """One distribution an extra asks for: ``via`` is ``verl[fsdp]``, ``spec`` its specifier."""

    name: str
    spec: str
    via: str


@dataclass(frozen=True)
class Difference:
    """How the lock differs from one declared requirement: ``locked`` is the version the lock
    holds (None: not at all); ``reason`` the reviewed exception's, or None (an error)."""

    declared: Declared
    locked: str | None
    reason: str | None

    def line(self) -> str:
        d = self.declared
        want = f"{d.name}{d.spec}" if d.spec else d.name
        have = "not in the lock" if self.locked is None else f"the lock holds {self.locked}"
        tail = f" (reviewed: {self.reason})" if self.reason else ""
        return f"{d.via} declares {want}: {have}{tail}"


def _requirements(pkg: Package, snapshot: Snapshot) -> list[Requirement]:
    rel = snapshot.release(pkg.name, pkg.version)
    if rel is None:
        return []
    return rel.requirements()


def declared(target: Target, snapshot: Snapshot) -> list[Declared]:
    """Every requirement the extras asked of the target's pinned packages declare (a package's
    references to its own extras followed), once per distribution and extra."""
    out: dict[tuple[str, str], Declared] = {}
    for pkg in target.enabled_packages:
        reqs = _requirements(pkg, snapshot)
        for top in pkg.extras:
            todo, seen = [top], set()
            while todo:
                extra = todo.pop()
                if extra in seen:
                    continue
                seen.add(extra)
                for req in reqs:
                    if req.marker is None or not holds(req, target, extra):
                        continue
                    if "extra" not in str(req.marker):
                        continue  # the package's own requirement, not its extra's
                    name = canonicalize_name(req.name)
                    if name == pkg.name:
                        todo += [canonicalize_name(e) for e in req.extras]
                        continue
                    out.setdefault((name, top), Declared(name, str(req.specifier),
                                                         f"{pkg.name}[{top}]"))
    return sorted(out.values(), key=lambda d: (d.name, d.via))


def excluded(target: Target) -> list[str]:
    """The distributions left out of the resolution: the reviewed exceptions."""
    return [name for name, _ in target.extras_exceptions]


def differences(target: Target, snapshot: Snapshot,
                locked: dict[str, str]) -> list[Difference]:
    """Each declared requirement the lock (``name -> version``) lacks or holds at a version
    the specifier excludes, with the reviewed exception's reason where there is one."""
    return _differences(target, declared(target, snapshot), locked)


def _differences(target: Target, decl: list[Declared],
                 locked: dict[str, str]) -> list[Difference]:
    """:func:`differences` of requirements already read (``decl``)."""
    reasons = dict(target.extras_exceptions)
    out = []
    for d in decl:
        have = locked.get(d.name)
        if have is not None and (not d.spec or Requirement(f"x{d.spec}").specifier.contains(
                have, prereleases=True)):
            continue
        out.append(Difference(d, have, reasons.get(d.name)))
    return out


def exception_errors(target: Target, snapshot: Snapshot) -> list[SpecError]:
    """An exception for a distribution no asked extra declares excuses nothing: refused."""
    decl = declared(target, snapshot)
    asked = {d.name for d in decl}
    vias = sorted({d.via for d in decl})
    return [target.error(f"extras_exceptions.{name}",
                         f"no extra this target asks for declares {name}"
                         + (f" (asked: {', '.join(vias)})" if vias else " (it asks for no extra)")
                         + ": remove the exception")
            for name, _ in target.extras_exceptions if name not in asked]


def difference_errors(target: Target, snapshot: Snapshot,
                      locked: dict[str, str]) -> list[SpecError]:
    """Each unreviewed difference between the lock and the asked extras, at the extras' line."""
    out = []
    for diff in differences(target, snapshot, locked):
        if diff.reason is not None:
            continue
        pkg = canonicalize_name(diff.declared.via.split("[", 1)[0])
        out.append(target.error(f"packages.{pkg}.extras",
                                f"{diff.line()}: re-lock, or name {diff.declared.name} in "
                                "extras_exceptions with the reason"))
    return out


def report(target: Target, snapshot: Snapshot, locked: dict[str, str] | None
           ) -> dict[str, object]:
    """What ``check --json`` and ``list --json`` show: the extras asked, how many
    distributions they declare, and each difference (``locked`` None: the lock lacks it; no
    lock at all: ``differences`` is None)."""
    decl = declared(target, snapshot)
    asked = sorted({d.via for d in decl})
    diffs = None if locked is None else [
        {"name": d.declared.name, "declared": d.declared.spec, "via": d.declared.via,
         "locked": d.locked, "reason": d.reason} for d in _differences(target, decl, locked)]
    return {"asked": asked, "declared": len(decl),
            "exceptions": dict(target.extras_exceptions), "differences": diffs}


def summary(target: Target, snapshot: Snapshot, locked: dict[str, str] | None) -> list[str]:
    """One line per asked extra set and one per difference, for the text of check and list."""
    decl = declared(target, snapshot)
    asked = sorted({d.via for d in decl})
    if not asked:
        return []
    if locked is None:
        return [f"{target.name}: extras {', '.join(asked)}: not locked yet"]
    diffs = _differences(target, decl, locked)
    n = len(decl)
    head = (f"{target.name}: extras {', '.join(asked)}: the lock holds {n - len(diffs)} of the "
            f"{n} requirements they declare")
    return [head, *(f"{target.name}:   {d.line()}" if d.reason else
                    f"{target.name}:   {d.line()} (NOT reviewed: `build-env check` fails)"
                    for d in diffs)]
