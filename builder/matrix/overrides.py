"""Dependency overrides: reviewed matrix data that forces one version of a package over what
other packages declare, as uv's ``--override`` does (and verl's own lock does for its
``sglang`` extra: sglang 0.5.12 pins ``transformers==5.6.0``, which verl excludes).

``overrides: {NAME: {version: "V", reason: "why, in words"}}`` under a target. An override
replaces every other requirement on NAME in the resolution, so it is never implied: each one is
written in the matrix with its reason, resolved by ``build-env lock`` as ``--override``,
recorded in the lock's header (covered by its body digest), the image's manifest and labels,
shown by ``check`` and ``list``, and held by the gate (the installed version is the override's;
the one requirement it replaces is the only unmet one accepted).

Pure: no I/O and nothing of ``builder`` imported (a foundation module); :mod:`builder.matrix.spec`
hands in the grammar's check for plain text and turns an :class:`OverrideError` into its
file:line:key error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

KEYS = {"version", "reason"}
MIN_REASON = 10
# A distribution name (PEP 508)
_NAME = re.compile(r"[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9]", re.ASCII)
# The grammar's check of one plain line of text (builder.matrix.grammar.plain): raises ValueError
Plain = Callable[[str], str]
# The header line of a lock that was resolved with an override (builder.resolve.lock, lockbody).
LOCK_KEY = "# override: "


class OverrideError(ValueError):
    """A malformed override: ``subkey`` is the dotted key below ``overrides``."""

    def __init__(self, subkey: str, message: str) -> None:
        super().__init__(message)
        self.subkey = subkey


@dataclass(frozen=True)
class Override:
    name: str
    version: str
    reason: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    def to_value(self) -> dict[str, str]:
        return {"version": self.version, "reason": self.reason}

    def lock_line(self) -> str:
        """The lock header's line for it (one line: the reason is plain text)."""
        return f"{LOCK_KEY}{self.requirement} ({self.reason})\n"


def _text(value: Any, subkey: str, what: str, plain: Plain) -> str:
    if not isinstance(value, str):
        raise OverrideError(subkey, f"expected {what} as a quoted string, got {value!r}")
    try:
        return plain(value)
    except ValueError as exc:
        raise OverrideError(subkey, str(exc)) from None


def _one(name: Any, value: Any, plain: Plain) -> Override:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise OverrideError(str(name), f"{name!r} is not a distribution name (PEP 508: "
                                       "letters, digits, '.', '_', '-'; the version goes "
                                       "under version:)")
    if not isinstance(value, dict):
        raise OverrideError(name, "expected {version: V, reason: WHY}")
    for k in value:
        if k not in KEYS:
            raise OverrideError(f"{name}.{k}", f"unknown key {k!r} (allowed: "
                                               f"{', '.join(sorted(KEYS))})")
    for k in sorted(KEYS):
        if k not in value:
            raise OverrideError(name, f"missing key {k!r}: an override names its version and "
                                      "says why it is needed")
    text = _text(value["version"], f"{name}.version", "the version", plain)
    try:
        version = str(Version(text))
    except InvalidVersion:
        raise OverrideError(f"{name}.version", f"invalid version {text!r} (PEP 440)") from None
    reason = _text(value["reason"], f"{name}.reason", "the reason", plain).strip()
    if len(reason) < MIN_REASON:
        raise OverrideError(f"{name}.reason", "give the reason in words (which requirement it "
                                              "replaces and why that is safe)")
    return Override(canonicalize_name(name), version, reason)


def parse(value: Any, plain: Plain) -> tuple[Override, ...]:
    """The target's ``overrides:`` mapping (None: none), sorted by name; ``plain`` checks
    each string against the grammar of one plain line (builder.matrix.grammar.plain)."""
    if value is None:
        return ()
    if not isinstance(value, dict) or not value:
        raise OverrideError("", "expected a mapping of package names to {version, reason}")
    out = [_one(name, v, plain) for name, v in value.items()]
    names = [o.name for o in out]
    for n in names:
        if names.count(n) > 1:
            raise OverrideError(n, f"{n} is overridden twice (names are compared normalised)")
    return tuple(sorted(out, key=lambda o: o.name))


def pin_conflict(overrides: Iterable[Override], pins: dict[str, str]) -> tuple[str, str] | None:
    """``(name, message)`` for an override that contradicts the target's own pin of the same
    package (the matrix would say two versions), else None."""
    for o in overrides:
        pinned = pins.get(o.name)
        if pinned is not None and pinned != o.version:
            return o.name, (f"overrides {o.name} to {o.version}, but packages.{o.name} pins "
                            f"{pinned}: one version, said once")
    return None


def pin_echoes(overrides: Iterable[Override], pins: dict[str, str]) -> list[Override]:
    """The overrides that say again the version the target's own pin of the package says (the
    pin already installs it: such an override is needed only where another package's
    requirement excludes that version)."""
    return [o for o in overrides if pins.get(o.name) == o.version]


def outside(overrides: Iterable[Override], closure: Iterable[str]) -> list[Override]:
    """The overrides of packages outside ``closure`` (normalised names of what the target
    installs): uv's ``--override`` never adds a package, so such an override changes nothing,
    and a lock can never hold it."""
    names = {canonicalize_name(n) for n in closure}
    return [o for o in overrides if o.name not in names]


def as_map(overrides: Iterable[Override]) -> dict[str, Override]:
    return {o.name: o for o in overrides}


def replaced(overrides: Iterable[Override], requirer: str, req: Requirement) -> Override | None:
    """The override that replaces ``req`` (declared by ``requirer``), if any: every
    requirement on an overridden package, except the override itself, is replaced."""
    o = as_map(overrides).get(canonicalize_name(req.name))
    if o is None or canonicalize_name(requirer) == o.name:
        return None
    return o


def kept(overrides: Iterable[Override], requirer: str, reqs: Iterable[Requirement]
         ) -> list[Requirement]:
    """The requirements ``requirer`` declares that stand: those no override replaces. The one
    reading of overrides that ``check`` (builder.resolve.compat) and ``propose``
    (builder.propose.search) share, as ``lock`` hands them to uv's ``--override``."""
    found = tuple(overrides)
    return [r for r in reqs if replaced(found, requirer, r) is None]


def lock_lines(overrides: Iterable[Override]) -> str:
    return "".join(o.lock_line() for o in overrides)


def recorded(header: str) -> dict[str, str]:
    """``{name: version}`` of the override lines in a lock's header."""
    out = {}
    for line in header.splitlines():
        if line.startswith(LOCK_KEY):
            req = line[len(LOCK_KEY):].split(" ", 1)[0]
            name, _, version = req.partition("==")
            out[canonicalize_name(name)] = version
    return out


def labels(overrides: Iterable[Override], namespace: str) -> dict[str, str]:
    """One OCI label per override: the version and its reason."""
    return {f"{namespace}.dep-override.{o.name}": f"{o.version} ({o.reason})" for o in overrides}
