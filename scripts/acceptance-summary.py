#!/usr/bin/env python3
"""The summary every acceptance script writes (scripts/acceptance-*.sh): the build report's
verdict, stages, tags and pins, the wall time, the image's size as the engine reports it, and
each check's status and reason, as one JSON file under docs/.

    scripts/acceptance-summary.py OUT STATUS SECONDS REPORT [--stage-seconds KEY=STAGE]...
                                  [--field KEY=JSON]... [--pin KEY=NAME]...

``--stage-seconds KEY=STAGE``: KEY gets the seconds of the RUN steps of build stage STAGE (a
source stage's compile time); ``--field KEY=JSON``: KEY gets the JSON value as it is; ``--pin
KEY=NAME``: KEY gets ``{NAME: the version the build pinned}`` (a pin the run moved). The build
context is recorded as the repository-relative path, not the checkout it ran in.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import docker


def image_size(image_id: str | None) -> int | None:
    if not image_id:
        return None
    try:
        return docker.from_env().images.get(image_id).attrs["Size"]
    except docker.errors.ImageNotFound:
        return None


def stage_seconds(report: dict[str, Any], stage: str) -> float | None:
    steps = (report["stages"].get("build") or {}).get("step_times", [])
    runs = [s for s in steps if s.get("stage") == stage
            and str(s.get("instruction", "")).startswith("RUN")]
    return sum(s.get("seconds") or 0 for s in runs) or None


def summary(report: dict[str, Any], status: int, seconds: int) -> dict[str, Any]:
    render = report["stages"].get("render") or {}
    if render.get("context"):
        render["context"] = os.path.relpath(render["context"])
    checks = (report.get("verification") or {}).get("checks", [])
    return {
        "target": report["target"], "exit_code": status, "result": report["result"],
        "wall_seconds": seconds, "stages": report["stages"],
        "image_size_bytes": image_size(report.get("image_id")),
        "tags": report["tags"], "pins": report["pins"],
        "checks": {c["id"]: {"status": c["status"], "reason": c.get("reason")} for c in checks},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("status", type=int)
    p.add_argument("seconds", type=int)
    p.add_argument("report")
    p.add_argument("--stage-seconds", action="append", default=[], metavar="KEY=STAGE")
    p.add_argument("--field", action="append", default=[], metavar="KEY=JSON")
    p.add_argument("--pin", action="append", default=[], metavar="KEY=NAME")
    args = p.parse_args()
    with open(args.report, encoding="utf-8") as f:
        report = json.load(f)
    out = summary(report, args.status, args.seconds)
    for item in args.stage_seconds:
        key, stage = item.split("=", 1)
        out[key] = stage_seconds(report, stage)
    for item in args.field:
        key, value = item.split("=", 1)
        out[key] = json.loads(value)
    for item in args.pin:
        key, name = item.split("=", 1)
        out[key] = {name: report["pins"].get(name)}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2, sort_keys=True)
    extra = [k.split("=", 1)[0] for k in args.stage_seconds]
    print(json.dumps({k: out[k] for k in ("result", "wall_seconds", "image_size_bytes", *extra)}))


if __name__ == "__main__":
    main()
