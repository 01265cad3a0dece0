"""An offline OSV database of PyPI advisories, and the OSV schema's evaluation of one version.

The database is what OSV publishes for the PyPI ecosystem: ``all.zip`` (one JSON document per
advisory), or that archive unpacked into a directory (``*.json`` at any depth). Every document is
read; one that is not an OSV advisory (no ``id``, not a JSON object) makes the whole database bad
input, named. Its date is the newest ``modified`` of its advisories: the date of what it knows,
whatever the file's own mtime (which is kept beside it).

Matching follows the OSV schema (ossf/osv-schema, docs/schema.md, "Evaluation"):

* only ``affected[]`` entries whose ``package.ecosystem`` is ``PyPI``, their ``package.name``
  compared with the installed name after PEP 503 normalisation;
* a version is affected when it is listed in ``versions`` (compared as PEP 440 versions, or as
  strings where one does not parse) or lies in any ``ECOSYSTEM`` range: its events sorted by
  version (``introduced: "0"`` first), then ``introduced`` sets affected, ``fixed`` (at or below
  the version) and ``last_affected`` (below it) clear it; ``limit`` events bound the range
  (``v < limit`` for some limit, ``*`` infinite). ``GIT`` and ``SEMVER`` ranges are not read
  (OSV's PyPI records carry ``ECOSYSTEM`` ranges, and a ``versions`` list for their GIT ones);
* advisories with ``withdrawn`` set are left out.

A range whose events do not parse as PEP 440 versions cannot be evaluated: the advisory is
reported as unevaluated for that package, never silently passed.
"""

from __future__ import annotations

import datetime
import json
import os
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.audit import cvss
from builder.errors import UsageError

ECOSYSTEM = "PyPI"
LEVELS = ("LOW", "MODERATE", "HIGH", "CRITICAL")


class Unevaluable(ValueError):
    """A range of an advisory whose versions are not PEP 440 versions."""


@dataclass(frozen=True)
class Advisory:
    """One OSV advisory, as read."""

    id: str
    data: Mapping[str, Any]

    @property
    def aliases(self) -> list[str]:
        return [str(a) for a in self.data.get("aliases") or [] if isinstance(a, str)]

    @property
    def modified(self) -> str:
        return str(self.data.get("modified") or "")

    @property
    def withdrawn(self) -> bool:
        return bool(self.data.get("withdrawn"))

    @property
    def summary(self) -> str:
        return str(self.data.get("summary") or "")

    def entries(self, name: str) -> list[Mapping[str, Any]]:
        """The ``affected[]`` entries about the PyPI package ``name`` (normalised)."""
        want = canonicalize_name(name)
        return [a for a in self.data.get("affected") or []
                if isinstance(a, dict) and isinstance(a.get("package"), dict)
                and a["package"].get("ecosystem") == ECOSYSTEM
                and canonicalize_name(str(a["package"].get("name") or "")) == want]

    def packages(self) -> set[str]:
        """The normalised names of the PyPI packages this advisory is about."""
        return {canonicalize_name(str(a["package"].get("name") or ""))
                for a in self.data.get("affected") or []
                if isinstance(a, dict) and isinstance(a.get("package"), dict)
                and a["package"].get("ecosystem") == ECOSYSTEM}

    def severity(self, entries: Iterable[Mapping[str, Any]] = ()) -> tuple[str | None, str]:
        """(level, where it came from): ``database_specific.severity`` (of the advisory, else of
        an affected entry), else the highest CVSS v3 base score of ``severity[]`` (the
        advisory's or the entries'); (None, "") when none is given."""
        sources: list[Mapping[str, Any]] = [self.data, *entries]
        for src in sources:
            ds = src.get("database_specific")
            level = str(ds.get("severity") or "").upper() if isinstance(ds, dict) else ""
            level = "MODERATE" if level == "MEDIUM" else level
            if level in LEVELS:
                return level, "database_specific.severity"
        best: tuple[float, str] | None = None
        for src in sources:
            for s in src.get("severity") or []:
                if not isinstance(s, dict) or not str(s.get("type", "")).startswith("CVSS_V3"):
                    continue
                score = cvss.base_score(str(s.get("score") or ""))
                if score is not None and (best is None or score > best[0]):
                    best = (score, str(s.get("score")))
        if best is not None:
            level = cvss.rating(best[0])
            return level, f"CVSS {best[0]:.1f} ({best[1]})"
        return None, ""


def parse_version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise Unevaluable(text) from None


def _same(installed: str, listed: str) -> bool:
    try:
        return Version(installed) == Version(listed)
    except InvalidVersion:
        return installed.strip() == listed.strip()


def in_versions(version: str, versions: Iterable[Any]) -> bool:
    """The schema's IncludedInVersions."""
    return any(_same(version, str(v)) for v in versions)


def _event_key(event: Mapping[str, Any]) -> tuple[int, Version]:
    kind, value = next(iter(event.items()))
    if kind == "introduced" and value == "0":
        return (0, Version("0"))
    return (1, parse_version(str(value)))


def in_range(version: Version, events: list[Mapping[str, Any]]) -> bool:
    """The schema's BeforeLimits and the event walk of IncludedInRanges, for one range."""
    events = [e for e in events if isinstance(e, dict) and len(e) == 1]
    limits = [str(e["limit"]) for e in events if "limit" in e]
    if limits and not any("*" in lim or version < parse_version(lim) for lim in limits):
        return False
    vulnerable = False
    for event in sorted((e for e in events if "limit" not in e), key=_event_key):
        kind, value = next(iter(event.items()))
        if kind == "introduced" and (value == "0" or version >= parse_version(str(value))):
            vulnerable = True
        elif kind == "fixed" and version >= parse_version(str(value)):
            vulnerable = False
        elif kind == "last_affected" and version > parse_version(str(value)):
            vulnerable = False
    return vulnerable


def affects(entry: Mapping[str, Any], version: str) -> bool:
    """Whether one ``affected[]`` entry covers ``version`` (its versions list, or any of its
    ECOSYSTEM ranges). Raises :class:`Unevaluable` when the answer hangs on a range whose
    versions (or the installed one) are not PEP 440 versions."""
    if in_versions(version, entry.get("versions") or []):
        return True
    ranges = [r for r in entry.get("ranges") or []
              if isinstance(r, dict) and r.get("type") == "ECOSYSTEM"]
    if not ranges:
        return False
    v = parse_version(version)
    return any(in_range(v, list(r.get("events") or [])) for r in ranges)


def fixed_versions(entries: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every ``fixed`` event of the entries' ECOSYSTEM ranges, in order, once each."""
    found: list[str] = []
    for entry in entries:
        for r in entry.get("ranges") or []:
            if isinstance(r, dict) and r.get("type") == "ECOSYSTEM":
                for e in r.get("events") or []:
                    if isinstance(e, dict) and "fixed" in e and str(e["fixed"]) not in found:
                        found.append(str(e["fixed"]))
    return found


@dataclass
class Database:
    """The advisories of an OSV database, by normalised package name."""

    path: Path
    form: str  # "zip" or "directory"
    advisories: dict[str, Advisory] = field(default_factory=dict)
    by_package: dict[str, list[Advisory]] = field(default_factory=dict)
    withdrawn: int = 0

    @property
    def newest_modified(self) -> str:
        """The database's date: the newest ``modified`` of its advisories (ISO 8601, UTC)."""
        stamps = [a.modified for a in self.advisories.values() if a.modified]
        return max(stamps, key=_instant) if stamps else ""

    @property
    def file_mtime(self) -> str:
        stamp = datetime.datetime.fromtimestamp(self.path.stat().st_mtime, datetime.timezone.utc)
        return stamp.isoformat(timespec="seconds").replace("+00:00", "Z")

    def add(self, advisory: Advisory) -> None:
        self.advisories[advisory.id] = advisory
        if advisory.withdrawn:
            self.withdrawn += 1
            return
        for name in advisory.packages():
            self.by_package.setdefault(name, []).append(advisory)

    def about(self, name: str) -> list[Advisory]:
        """The advisories (not withdrawn) about the PyPI package ``name``."""
        return self.by_package.get(canonicalize_name(name), [])


def _instant(stamp: str) -> datetime.datetime:
    try:
        parsed = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.timezone.utc)


def _documents(path: Path) -> Iterator[tuple[str, bytes]]:
    if path.is_dir():
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".json"):
                    full = Path(root, name)
                    yield str(full.relative_to(path)), full.read_bytes()
        return
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.is_dir() and info.filename.endswith(".json"):
                    yield info.filename, archive.read(info)
    except (zipfile.BadZipFile, OSError) as exc:
        raise UsageError(f"--osv {path}: not an OSV zip archive or directory ({exc})") from None


def load(path: Path) -> Database:
    """The database at ``path`` (a zip or a directory). Bad input (UsageError naming --osv and
    the path, and the document at fault): a missing path, something that is neither, a document
    that is not an OSV advisory, a database that holds none (it would have no date)."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"--osv {path}: no such file or directory")
    db = Database(path, "directory" if path.is_dir() else "zip")
    for name, raw in _documents(path):
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise UsageError(f"--osv {path}: {name}: not JSON ({exc})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("id"), str):
            raise UsageError(f"--osv {path}: {name}: not an OSV advisory (no id)")
        db.add(Advisory(doc["id"], doc))
    if not db.advisories:
        raise UsageError(f"--osv {path}: holds no OSV advisory (*.json); expected OSV's PyPI "
                         "all.zip or its unpacked directory")
    return db
