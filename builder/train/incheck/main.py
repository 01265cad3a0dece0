"""The train check's run: the stages in order (:mod:`.stages`) and one JSON report on stdout,
verl's own output on stderr; the exit status says the verdict (the package's docstring)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
import traceback
from typing import Any

from . import SCHEMA
from .args import parse
from .stages import Check, Tee

EXIT = {"pass": 0, "rejected": 1, "error": 3}


def _environment(tmp: str) -> None:
    """Offline, and every cache in a scratch directory (the image may be read-only)."""
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                      TOKENIZERS_PARALLELISM="false")
    os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(tmp, "datasets"))
    os.environ.setdefault("HF_HOME", os.path.join(tmp, "hf"))
    os.environ.setdefault("RAY_DISABLE_IMPORT_WARNING", "1")


def verdict(stages: list[dict[str, Any]]) -> str:
    return "rejected" if any(s["status"] == "fail" for s in stages) else "pass"


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    out = sys.stdout
    tee = Tee(sys.stderr)
    start = time.monotonic()
    report: dict[str, Any] = {"schema": SCHEMA, "level": "config", "nnodes": args.nnodes,
                              "gpus_per_node": args.gpus_per_node,
                              "overrides": list(args.overrides)}
    with tempfile.TemporaryDirectory(prefix="verl-env-train-check-") as tmp, \
            contextlib.redirect_stdout(tee):
        _environment(tmp)
        os.makedirs(os.path.join(tmp, "rows"))
        check = Check(args, tee, os.path.join(tmp, "rows"))
        try:
            import verl

            report["verl"] = getattr(verl, "__version__", "?")
        except Exception as exc:  # noqa: BLE001 - nothing to check with
            report.update(status="error", error=f"verl is not importable here: {exc}",
                          stages=[])
        else:
            try:
                check.all()
                report.update(status=verdict(check.stages), stages=check.stages)
                if report["status"] == "pass":
                    check.run("gpu", check.stop)
                    check.stages[-1]["status"] = "stop"
            except Exception as exc:  # noqa: BLE001 - the checker itself broke
                traceback.print_exc(file=sys.stderr)
                report.update(status="error", error=f"the checker broke: {exc!r}",
                              stages=check.stages)
    report["seconds"] = round(time.monotonic() - start, 2)
    text = json.dumps(report, indent=2, default=str)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    out.write(text + "\n")
    out.flush()
    return EXIT[report["status"]]

