"""Local record of what the gate said about each image, keyed by image ID.

A verdict records how it was reached (the ``gate`` section that :mod:`builder.verify` adds to the
self-test report: phases and self-test arguments run, GPUs expected and seen). Only a passing
**release** verdict (the full required phase set of the target's family, no narrowing argument)
unlocks a release tag, a SIF or a publish: :func:`is_verified`. A narrowed run (``--phases``,
``--selftest-args``) is recorded as ``partial`` and unlocks nothing; :func:`why_not_release` says
why, for messages. Records written before the gate recorded its scope count as partial.

The record lives under ``$XDG_STATE_HOME/verl-env/verdicts/`` (default ``~/.local/state``), one
JSON file per image ID, written atomically.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.files import atomic_write_text

if TYPE_CHECKING:
    from builder.verify import Verification

RELEASE, PARTIAL = "release", "partial"


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "verl-env" / "verdicts"


def _path(image_id: str) -> Path:
    return state_dir() / f"{image_id.split(':')[-1]}.json"


def record(image_id: str, verdict: dict[str, Any]) -> Path:
    """Write a verdict record as given (prefer :func:`record_verification`)."""
    path = _path(image_id)
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    atomic_write_text(path, json.dumps({"image_id": image_id, "recorded_at": stamp, **verdict},
                                       indent=2, sort_keys=True) + "\n")
    return path


def record_verification(image_id: str, v: Verification, *, target: str | None,
                        tags: Sequence[str] = ()) -> Path:
    """Record what ``verify_image`` returned for ``image_id`` (tags: those it carries now)."""
    gate = v.report.get("gate") or {}
    return record(image_id, {"overall": v.overall, "exit_code": v.exit_code,
                             "scope": gate.get("scope", PARTIAL), "target": target,
                             "tags": list(tags), "report": v.report})


def lookup(image_id: str) -> dict[str, Any] | None:
    try:
        data = json.loads(_path(image_id).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def blocker(verdict: dict[str, Any] | None) -> str | None:
    """Why a verdict record is not a passing release verdict (None when it is one)."""
    if not verdict:
        return "no verdict recorded: run `build-env verify IMAGE` on it"
    overall = verdict.get("overall")
    if overall != "pass":
        return f"its verdict is {overall or 'unknown'}, not pass"
    gate = (verdict.get("report") or {}).get("gate")
    if not isinstance(gate, dict) or "scope" not in gate:
        return ("its verdict was recorded without the phases it ran (an older build-env): "
                "run `build-env verify IMAGE` again")
    if gate.get("scope") != RELEASE:
        why = gate.get("partial_reason") or "a narrowed run"
        return (f"its verdict is partial ({why}); only a full run (`build-env verify IMAGE` "
                "without --phases or narrowing --selftest-args) is a release verdict")
    return None


def why_not_release(image_id: str) -> str | None:
    """None when ``image_id`` has a passing release verdict, else the reason (for messages)."""
    reason = blocker(lookup(image_id))
    return None if reason is None else f"{image_id[:19]}: {reason}"


def is_verified(image_id: str) -> bool:
    """Whether ``image_id`` holds a passing **release** verdict (a partial pass does not count)."""
    return blocker(lookup(image_id)) is None
