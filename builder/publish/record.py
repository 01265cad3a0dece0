"""What a publish writes beside its records: the record itself (atomically), the incomplete
record (:class:`Progress`) from the first byte sent until it is finished, and the leftovers of a
killed run."""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from builder.errors import InfraError, PublishError, PublishInfraError
from builder.gate import verdicts

RECORD_SCHEMA = "verl-env/publish-record/v1"
PIN_LABEL = "org.verl-env.pin."


def pins_from_labels(labels: dict[str, str]) -> dict[str, str]:
    return {k[len(PIN_LABEL):]: v for k, v in sorted(labels.items()) if k.startswith(PIN_LABEL)}


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Atomically: a temp file in the same directory, renamed over the target."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.",
                                     delete=False) as f:
        json.dump(record, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(f.name, path)


def incomplete_path(record_path: Path) -> Path:
    """Where a publish that has not finished says what it did and did not publish
    (``publish.json`` -> ``publish.incomplete.json``)."""
    return record_path.with_name(f"{record_path.stem}.incomplete{record_path.suffix}")


def clean_leftovers(record_path: Path) -> list[Path]:
    """The temp files a killed run left beside the records (``.publish.json.XXXX``): removed.
    Called under the record's run lock, so no live run is writing them."""
    removed = []
    for name in (record_path.name, incomplete_path(record_path).name):
        for stale in record_path.parent.glob(f".{name}.*"):
            try:
                stale.unlink()
                removed.append(stale)
            except OSError:
                pass
    return removed


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Progress:
    """What this publish has pushed so far, kept on disk beside the record
    (:func:`incomplete_path`) from the first byte sent until the record is written: a run that
    fails, or is killed, leaves a file that says which stage it was in, what is in the registry
    by digest and what was not published; no release tag has moved unless it says so."""

    def __init__(self, record_path: Path, base: dict[str, Any], stages: list[str],
                 tags: list[str]) -> None:
        self.path = incomplete_path(record_path)
        self.base = base
        self.stages = stages
        self.tags = tags  # the release tags, HOST/REPO:TAG
        self.stage: str | None = None
        self.done: list[str] = []
        self.published: dict[str, Any] = {}
        self.moved: list[str] = []  # bare tags moved
        self.started = now()

    def enter(self, stage: str) -> None:
        self.stage = stage
        self.save()

    def finish(self, stage: str, **published: Any) -> None:
        self.done.append(stage)
        self.published.update(published)
        self.save()

    def save(self, error: str | None = None) -> None:
        moved = {t for t in self.tags if t.rsplit(":", 1)[1] in self.moved}
        write_record(self.path, {
            **self.base, "status": "incomplete", "pid": os.getpid(),
            "started_at": self.started, "updated_at": now(), "stage": self.stage,
            "error": error, "stages_done": list(self.done),
            "not_published": [s for s in self.stages if s not in self.done],
            "published": dict(self.published),
            "release_tags": {t: "moved" if t in moved else "not moved (names what it named "
                             "before)" for t in self.tags}})

    def failure(self, exc: Exception) -> PublishError:
        """Record ``exc`` and make the one-line error the user sees: the stage, the cause,
        what is (not) released, where the record of it is."""
        reason = str(exc.args[0]) if exc.args else str(exc)
        self.save(error=reason)
        pushed = ", ".join(f"{what} {info['digest']}" for what, info in self.published.items()
                           if isinstance(info, dict) and info.get("digest")) or "nothing"
        moved = [t for t in self.tags if t.rsplit(":", 1)[1] in self.moved]
        released = (f"tags moved: {', '.join(moved)}" if moved
                    else "no release tag was moved")
        kind = PublishInfraError if isinstance(exc, InfraError) else PublishError
        return kind(f"{self.stage} failed: {reason}; {released}; in the registry by "
                    f"digest: {pushed}; what was and was not published: {self.path}")



def verdict_summary(v: verdicts.Verdict | None) -> dict[str, Any] | None:
    """The verdict's level and GPU evidence, for the publish record."""
    if v is None:
        return None
    return {"overall": v.overall, "scope": v.scope, "level": v.level, "gpu": v.gpu.to_dict(),
            "recorded_at": v.recorded_at}
