"""What a target asks for must be something that can be meant (issue 37 item 2).

- An override (builder.matrix.overrides) of a package outside the target's closure changes
  nothing: uv's ``--override`` never adds a package, so the lock can never hold it and the site
  would be stuck (``check --locked`` and ``render`` want it in the lock, re-locking writes the
  same lock). The closure is the target's lock plus its pins; what is known without a lock is
  the pins and what their recorded metadata requires directly. When an override is outside
  both and the lock was resolved from the target's inputs as they are (its override lines
  apart), ``check`` and ``lock`` refuse it; when no such lock exists yet, ``check`` says it
  cannot tell and ``lock`` refuses it after resolving, before anything is written.
- An override equal to the target's own pin warns when no pinned package's recorded requirement
  excludes that version (then the pin alone installs it: the override replaces nothing the
  check can see).
- An extra of a pinned package that the package does not declare is refused, naming the ones
  it does (its recorded ``Provides-Extra``, else the extras its ``Requires-Dist`` names); a
  package with no recorded metadata (a local source) is a warning: the check cannot tell.

Pure: metadata and the lock come in as data; errors are :class:`SpecError` (file:line: key,
exit 2), warnings one line each.
"""

from __future__ import annotations

from collections.abc import Iterable

from builder.errors import SpecError
from builder.matrix import overrides
from builder.matrix.spec import Target
from builder.resolve.compat import declared, replacing
from builder.resolve.metadata import Snapshot


def _warning(target: Target, key: str, message: str) -> str:
    return f"{target.where(key)}: targets.{target.name}.{key}: {message}"


def extra_errors(target: Target, snapshot: Snapshot) -> tuple[list[SpecError], list[str]]:
    """Every extra asked of a pinned package that its metadata does not declare (errors), and
    the packages whose extras cannot be told (warnings)."""
    errors, warnings = [], []
    for p in target.enabled_packages:
        if not p.extras:
            continue
        key = f"packages.{p.name}.extras"
        rel = snapshot.release(p.name, p.version)
        if rel is None:
            warnings.append(_warning(target, key, f"cannot tell whether {p.name} {p.version} "
                                                  f"declares {', '.join(p.extras)}: no recorded "
                                                  "metadata (a local source)"))
            continue
        known, exact = rel.extras()
        unknown = [e for e in p.extras if e not in known]
        if not unknown:
            continue
        has = ", ".join(sorted(known)) or "none"
        how = ("its Provides-Extra" if exact else "the extras its recorded Requires-Dist names; "
               "`build-env check --online` records its Provides-Extra")
        errors.append(target.error(key, f"{p.name} {p.version} has no extra "
                                        f"{', '.join(repr(e) for e in unknown)} (it declares: "
                                        f"{has}; {how})"))
    return errors, warnings


def override_errors(target: Target, snapshot: Snapshot, locked: Iterable[str] | None,
                    authoritative: bool, lock_name: str) -> tuple[list[SpecError], list[str]]:
    """Every override of a package outside the closure. ``locked``: the package names of the
    target's lock (None: no lock); ``authoritative``: that lock was resolved from the target's
    inputs as they are, its overrides apart (then it is the closure; else an override it lacks
    that no pin requires cannot be told here, and ``lock`` judges it after resolving)."""
    known = declared(target, snapshot) | set(locked or ())
    errors, warnings = [], []
    for o in overrides.outside(target.overrides, known):
        key = f"overrides.{o.name}"
        if locked is not None and authoritative:
            errors.append(target.error(key, f"{o.name} is not installed by this target (not "
                                            f"in {lock_name}, not pinned, required by no pin): "
                                            "an override never adds a package, so it would "
                                            "change nothing and no lock could hold it; remove "
                                            "it (or pin the package that needs it)"))
        else:
            where = (f"{lock_name} was resolved from other inputs" if locked is not None
                     else f"no {lock_name} yet")
            warnings.append(_warning(target, key, f"cannot tell whether this target installs "
                                                  f"{o.name} ({where}; no pin requires it "
                                                  "directly): `build-env lock` refuses the "
                                                  "override if the resolution does not"))
    return errors, warnings


def unresolved_errors(target: Target, resolved: Iterable[str], lock_name: str
                      ) -> list[SpecError]:
    """After a resolution: every override of a package it did not install (nor pins)."""
    names = {*resolved, *(p.name for p in (*target.enabled_packages, *target.provided))}
    return [target.error(f"overrides.{o.name}", f"{o.name} is not installed by this target "
                                                 f"(the resolution for {lock_name} does not "
                                                 "hold it): an override never adds a package, "
                                                 "so it would change nothing and no lock could "
                                                 "hold it; remove it (nothing was written)")
            for o in overrides.outside(target.overrides, names)]


def echo_warnings(target: Target, snapshot: Snapshot) -> list[str]:
    """An override equal to the target's own pin that no pinned package's recorded requirement
    excludes: the pin alone installs that version."""
    pins = {p.name: p.version for p in target.enabled_packages}
    replaces = replacing(target, snapshot)
    return [_warning(target, f"overrides.{o.name}", f"overrides {o.name} to {o.version}, the "
                                                    f"version packages.{o.name} pins, and no "
                                                    "pinned package's requirement excludes it: "
                                                    "the pin already installs it (remove the "
                                                    "override, or name the deeper requirement "
                                                    "it replaces in its reason)")
            for o in overrides.pin_echoes(target.overrides, pins) if not replaces[o.name]]
