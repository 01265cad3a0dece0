"""Local record of which images passed the gate, keyed by image ID.

``sif`` and ``publish`` refuse an image without a passing verdict (unless ``--force``). The record
lives under ``$XDG_STATE_HOME/verl-env/verdicts/`` (default ``~/.local/state/verl-env``), one JSON
file per image ID, written atomically.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

from builder.files import atomic_write_text


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "verl-env" / "verdicts"


def _path(image_id: str) -> Path:
    return state_dir() / f"{image_id.split(':')[-1]}.json"


def record(image_id: str, verdict: dict[str, Any]) -> Path:
    path = _path(image_id)
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    atomic_write_text(path, json.dumps({"image_id": image_id, "recorded_at": stamp, **verdict}, indent=2,
                                       sort_keys=True) + "\n")
    return path


def lookup(image_id: str) -> dict[str, Any] | None:
    try:
        return json.loads(_path(image_id).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def is_verified(image_id: str) -> bool:
    verdict = lookup(image_id)
    return bool(verdict) and verdict.get("overall") == "pass"
