"""The per-package records a lock keeps beside it (``locks/T.sources.json``: git pins,
``locks/T.prebuilt.json``: prebuilt choices): one JSON document ``{"schema", "packages"}``,
written atomically, absent when there is nothing to record, refused when it is not one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builder.errors import LockError
from builder.files import atomic_write_text


def write_packages(path: Path, schema: str, packages: dict[str, Any]) -> None:
    """Write the record (no file when ``packages`` is empty)."""
    if packages:
        atomic_write_text(path, json.dumps({"schema": schema, "packages": packages},
                                           indent=2, sort_keys=True) + "\n")
    elif path.exists():
        path.unlink()


def read_packages(path: Path, schema: str, kind: str) -> dict[str, Any]:
    """The record's packages ({} when there is no file); a file of another kind is an error
    naming it."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise LockError(f"{path}: not a verl-env {kind} record ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != schema:
        raise LockError(f"{path}: not a verl-env {kind} record (schema {schema})")
    return dict(data.get("packages", {}))
