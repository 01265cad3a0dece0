"""Databases and installed trees the audit tests make (no web access): OSV advisories written
as OSV publishes them (one JSON document per advisory, zipped or in a directory), and
``*.dist-info`` / ``*.egg-info`` metadata as installers write it."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

MODIFIED = "2026-03-04T05:06:07Z"


def advisory(id: str, name: str, *, ranges: list[dict[str, Any]] | None = None,
             versions: list[str] | None = None, ecosystem: str = "PyPI",
             modified: str = MODIFIED, **extra: Any) -> dict[str, Any]:
    affected: dict[str, Any] = {"package": {"ecosystem": ecosystem, "name": name}}
    if ranges is not None:
        affected["ranges"] = ranges
    if versions is not None:
        affected["versions"] = versions
    return {"schema_version": "1.6.0", "id": id, "modified": modified,
            "published": "2024-01-01T00:00:00Z", "summary": f"{id} in {name}",
            "affected": [affected], **extra}


def ecosystem(*events: dict[str, str]) -> list[dict[str, Any]]:
    return [{"type": "ECOSYSTEM", "events": list(events)}]


def write_db(where: Path, advisories: list[dict[str, Any]], form: str = "zip") -> Path:
    """The advisories as OSV's PyPI all.zip (``form="zip"``) or its unpacked directory."""
    if form == "zip":
        path = where / "all.zip"
        with zipfile.ZipFile(path, "w") as z:
            for a in advisories:
                z.writestr(f"{a['id']}.json", json.dumps(a))
        return path
    path = where / "osv-pypi"
    path.mkdir()
    for a in advisories:
        (path / f"{a['id']}.json").write_text(json.dumps(a))
    return path


def dist_info(site: Path, name: str, version: str, *, dirname: str | None = None,
              metadata: bool = True) -> Path:
    """``NAME-VERSION.dist-info`` with its METADATA, as pip writes it."""
    d = site / (dirname or f"{name.replace('-', '_')}-{version}.dist-info")
    d.mkdir(parents=True)
    if metadata:
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                    "Summary: a test distribution\n\nName: not-a-header\n")
    return d
