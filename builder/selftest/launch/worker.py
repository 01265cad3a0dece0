"""Phase subprocess: ``python -m verl_env_selftest.launch.worker --phase P --ctx CTX --out OUT``.

Writes JSON lines to OUT as it goes: ``plan`` (the step ids), ``begin`` before each step,
``check`` and ``fact`` records, ``end``. Anything the libraries print goes to this process's
stdout/stderr, which the parent keeps in a log file.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from typing import Any, Callable

from ..phase import Run, Step, maybe_inject
from ..report import FAIL, SKIP, Check

# the self-test package (verl_env_selftest in an image, builder.selftest here)
ROOT = (__package__ or "verl_env_selftest.launch").rpartition(".")[0]
# phase name -> (module of .phases, plan function name)
PHASES: dict[str, tuple[str, str]] = {
    "detect": ("gpu", "detect_plan"),
    "preflight": ("preflight", "plan"),
    "env": ("envlint", "plan"),
    "imports": ("imports", "plan"),
    "versions": ("versions", "plan"),
    "coverage": ("coverage", "plan"),
    "abi": ("abi", "plan"),
    "cpu": ("cpu", "plan"),
    "gpu": ("gpu", "plan"),
    "collective": ("collective", "plan"),
    "ray": ("rayphase", "plan"),
}


def load_plan(phase: str) -> Callable[[Run], list[Step]]:
    """The plan function of a phase (imports only the stdlib-level phase module)."""
    module, fn = PHASES[phase]
    return getattr(importlib.import_module(f"{ROOT}.phases.{module}"), fn)


def run_steps(phase: str, run: Run, steps: list[Step], done: set[str],
              emit: Callable[[dict[str, Any]], None]) -> None:
    """Run the steps not in ``done``, emitting markers and records."""
    emit({"t": "plan", "steps": [{"ids": list(s.ids), "required": s.required,
                                  "applies": s.applies} for s in steps]})
    for step in steps:
        if step.id in done:
            continue
        emit({"t": "begin", "id": step.id})
        t0 = time.monotonic()
        try:
            maybe_inject(step.id)
            result = step.fn(run)
        except Exception as e:  # noqa: BLE001 - a failing probe is a failed check
            why = f"{type(e).__name__}: {e}"
            result = [Check(id=step.id, phase=phase, status=FAIL, required=step.required,
                            applies=step.applies, reason=why)]
            result += [Check(id=cid, phase=phase, status=SKIP, required=step.required,
                             applies=step.applies, reason=f"not run: {step.id} raised {why}")
                       for cid in step.ids[1:]]
        checks = result if isinstance(result, list) else [result]
        elapsed = time.monotonic() - t0
        for c in checks:
            if not c.duration_s:
                c.duration_s = elapsed / max(len(checks), 1)
            emit({"t": "check", "check": c.to_dict(internal=True)})
        emit({"t": "done", "id": step.id})
    emit({"t": "end"})


def main(argv: list[str] | None = None) -> int:
    """Entry point of the phase subprocess."""
    p = argparse.ArgumentParser(prog="verl_env_selftest.launch.worker")
    p.add_argument("--phase", required=True, choices=sorted(PHASES))
    p.add_argument("--ctx", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--done", default="")
    a = p.parse_args(argv)
    with open(a.ctx, encoding="utf-8") as f:
        ctx = json.load(f)
    out = open(a.out, "a", encoding="utf-8")

    def emit(rec: dict[str, Any]) -> None:
        out.write(json.dumps(rec) + "\n")
        out.flush()

    run = Run(ctx=ctx, emit=emit)
    steps = load_plan(a.phase)(run)
    run_steps(a.phase, run, steps, {d for d in a.done.split(",") if d}, emit)
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
