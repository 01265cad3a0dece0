"""An audit: the installed distributions matched against an OSV database (:func:`match`), as one
document (``verl-env/audit/v1``, described by ``audit.schema.json`` beside this module) that is
printed, recorded locally and attached to a published image.

The local record lives beside the verdicts (``$XDG_STATE_HOME/verl-env/audits/``, one JSON file
per image ID, written atomically): the last audit of that image, which ``publish --audit`` signs
and attaches.

Severity, for ``--fail-on``: ``database_specific.severity`` (LOW, MODERATE, HIGH, CRITICAL), else
the CVSS v3 base score of ``severity[]`` rated as CVSS does, else the severity of an alias of the
advisory that the database holds (a PYSEC record and its GHSA twin); a hit whose severity nothing
gives is ``UNKNOWN`` and counts as at or above any threshold (it cannot be shown to be below).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from builder.audit import osv
from builder.files import atomic_write_text, state_home

SCHEMA = "verl-env/audit/v1"
SCHEMA_FILE = Path(__file__).with_name("audit.schema.json")
UNKNOWN = "UNKNOWN"
ORDER = {level: i for i, level in enumerate(osv.LEVELS)}


@dataclass(frozen=True)
class Hit:
    """One advisory that matches one installed distribution."""

    id: str
    aliases: tuple[str, ...]
    package: str  # as installed (its metadata's Name)
    version: str
    path: str  # where its metadata lies
    fixed: tuple[str, ...]
    severity: str  # LOW | MODERATE | HIGH | CRITICAL | UNKNOWN
    severity_source: str
    summary: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "aliases": list(self.aliases), "package": self.package,
                "version": self.version, "path": self.path, "fixed": list(self.fixed),
                "severity": self.severity, "severity_source": self.severity_source,
                "summary": self.summary}


def at_or_above(severity: str, threshold: str) -> bool:
    """Whether a hit of ``severity`` fails ``--fail-on threshold`` (UNKNOWN always does)."""
    return severity == UNKNOWN or ORDER[severity] >= ORDER[threshold]


def _severity(db: osv.Database, advisory: osv.Advisory,
              entries: list[Mapping[str, Any]]) -> tuple[str, str]:
    level, source = advisory.severity(entries)
    if level:
        return level, source
    for alias in advisory.aliases:
        twin = db.advisories.get(alias)
        if twin is not None:
            level, source = twin.severity(twin.entries(entries[0]["package"]["name"]))
            if level:
                return level, f"{source} of {alias}"
    return UNKNOWN, ""


def match(dists: Iterable[Mapping[str, str]], db: osv.Database
          ) -> tuple[list[Hit], list[dict[str, str]]]:
    """(hits, unevaluated): every advisory that affects an installed distribution, and each
    (advisory, package) whose ranges could not be evaluated (versions that are not PEP 440)."""
    hits: list[Hit] = []
    unevaluated: list[dict[str, str]] = []
    for dist in dists:
        name, version = str(dist.get("name") or ""), str(dist.get("version") or "")
        for advisory in db.about(name):
            entries = advisory.entries(name)
            try:
                affected = [e for e in entries if osv.affects(e, version)]
            except osv.Unevaluable as exc:
                unevaluated.append({"id": advisory.id, "package": name, "version": version,
                                    "reason": f"not a PEP 440 version: {exc}"})
                continue
            if not affected:
                continue
            level, source = _severity(db, advisory, affected)
            hits.append(Hit(advisory.id, tuple(advisory.aliases), name, version,
                            str(dist.get("path") or ""), tuple(osv.fixed_versions(affected)),
                            level, source, advisory.summary))
    hits.sort(key=lambda h: (canonicalize_name(h.package), h.version, h.id))
    return hits, unevaluated


def counts(hits: Iterable[Hit]) -> dict[str, int]:
    """Hits per severity (every level present, zeros included)."""
    out = {level: 0 for level in (*osv.LEVELS, UNKNOWN)}
    for h in hits:
        out[h.severity] += 1
    return out


def document(subject: Mapping[str, Any], db: osv.Database, dists: list[Mapping[str, str]],
             hits: list[Hit], unevaluated: list[dict[str, str]]) -> dict[str, Any]:
    """The audit document (``verl-env/audit/v1``)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "schema": SCHEMA,
        "audited_at": now.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "subject": dict(subject),
        "database": {"path": str(db.path), "form": db.form, "advisories": len(db.advisories),
                     "withdrawn": db.withdrawn, "newest_modified": db.newest_modified,
                     "file_mtime": db.file_mtime},
        "distributions": len(dists),
        "counts": counts(hits),
        "hits": [h.to_dict() for h in hits],
        "unevaluated": unevaluated,
    }


def failing(doc: Mapping[str, Any], threshold: str | None) -> list[Mapping[str, Any]]:
    """The hits of ``doc`` at or above ``threshold`` (none without one)."""
    if threshold is None:
        return []
    return [h for h in doc["hits"] if at_or_above(str(h["severity"]), threshold)]


def text_lines(doc: Mapping[str, Any]) -> list[str]:
    """The document, for a person: the subject, the database and its date, each hit."""
    db, subject = doc["database"], doc["subject"]
    lines = [f"audit of {subject.get('reference') or subject.get('path')}: "
             f"{doc['distributions']} installed distributions",
             f"OSV database {db['path']} ({db['form']}, {db['advisories']} advisories, "
             f"{db['withdrawn']} withdrawn): newest modified {db['newest_modified'] or '?'} "
             f"(file mtime {db['file_mtime']})"]
    for h in doc["hits"]:
        aliases = f" ({', '.join(h['aliases'])})" if h["aliases"] else ""
        fixed = ", ".join(h["fixed"]) or "no fixed version"
        lines.append(f"  {h['severity']:8} {h['id']}{aliases}  {h['package']} {h['version']}  "
                     f"fixed in: {fixed}")
    for u in doc["unevaluated"]:
        lines.append(f"  UNEVALUATED {u['id']}  {u['package']} {u['version']}: {u['reason']}")
    shown = ", ".join(f"{n} {k}" for k, n in doc["counts"].items() if n)
    if doc["hits"]:
        lines.append(f"{len(doc['hits'])} known vulnerabilities ({shown})")
    else:
        lines.append(f"no known vulnerabilities as of {db['newest_modified'] or '?'}")
    return lines


# --------------------------------------------------------------------------- the local record


def state_dir() -> Path:
    return state_home() / "audits"


def _path(image_id: str) -> Path:
    return state_dir() / f"{image_id.split(':')[-1]}.json"


def record(image_id: str, doc: Mapping[str, Any]) -> Path:
    """Keep ``doc`` as the last audit of ``image_id``."""
    path = _path(image_id)
    atomic_write_text(path, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return path


def lookup(image_id: str) -> dict[str, Any] | None:
    """The last audit recorded for ``image_id``, or None."""
    try:
        doc = json.loads(_path(image_id).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA else None


def summary(doc: Mapping[str, Any]) -> str:
    """One line: the counts and the database date (``status``, ``publish``)."""
    c = doc.get("counts") or {}
    # in the levels' order, whatever order the document kept (a signed one comes back sorted)
    levels = [k for k in (*osv.LEVELS, UNKNOWN) if k in c] + sorted(set(c) - {*osv.LEVELS, UNKNOWN})
    shown = ", ".join(f"{c[k]} {k}" for k in levels if c[k]) or "no known vulnerabilities"
    db = doc.get("database") or {}
    return (f"{sum(c.values())} hits ({shown}) in {doc.get('distributions')} distributions; "
            f"OSV database of {db.get('newest_modified') or '?'}")
