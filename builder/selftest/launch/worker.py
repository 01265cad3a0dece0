"""Phase subprocess: ``python -m verl_env_selftest.launch.worker --phase P[,Q] --ctx C --out O``.

Writes JSON lines to OUT as it goes: a ``plan`` of each phase (the step ids), then per phase
``start``, ``begin`` before each step, ``check`` and ``fact`` records; ``end`` at the end.
Every record but ``end`` names its phase. Anything the libraries print goes to this process's
stdout/stderr, which the parent keeps in a log file.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import gc
import importlib
import json
import os
import sys
import time
from typing import Any, Callable

from ..phase import Run, Step, fault, maybe_inject
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


def run_phases(phases: list[str], ctx: dict[str, Any], done: set[str],
               emit: Callable[[dict[str, Any]], None]) -> None:
    """Plan every phase first (so that a hang or crash in one leaves the later ones' checks
    known), then run them in order; every record names its phase."""
    runs: list[tuple[str, Run, list[Step]]] = []
    for phase in phases:
        tagged = functools.partial(_tagged, emit, phase)
        run = Run(ctx=ctx, emit=tagged)
        steps = load_plan(phase)(run)
        tagged({"t": "plan", "steps": [{"ids": list(s.ids), "required": s.required,
                                        "applies": s.applies} for s in steps]})
        runs.append((phase, run, steps))
    for phase, run, steps in runs:
        run.emit({"t": "start"})
        run_steps(phase, run, steps, done, run.emit)
    emit({"t": "end"})


def _tagged(emit: Callable[[dict[str, Any]], None], phase: str, rec: dict[str, Any]) -> None:
    emit({**rec, "phase": phase})


def main(argv: list[str] | None = None) -> int:
    """Entry point of the phase subprocess."""
    p = argparse.ArgumentParser(prog="verl_env_selftest.launch.worker")
    p.add_argument("--phase", required=True, help="a phase, or a comma list run in order")
    p.add_argument("--ctx", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--done", default="")
    a = p.parse_args(argv)
    phases = a.phase.split(",")
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        p.error(f"unknown phase(s) {unknown}; choose from {', '.join(sorted(PHASES))}")
    with open(a.ctx, encoding="utf-8") as f:
        ctx = json.load(f)
    out = open(a.out, "a", encoding="utf-8")

    def emit(rec: dict[str, Any]) -> None:
        out.write(json.dumps(rec) + "\n")
        out.flush()

    run_phases(phases, ctx, {d for d in a.done.split(",") if d}, emit)
    out.close()
    # The interpreter's exit then skips the collector's passes over every object the stack
    # made (with torch, transformers and verl imported: 1.0 s -> 0.2 s of exit, measured in
    # the CPU fixture). Module teardown, atexit handlers and native destructors still run, and
    # a crash in them still fails the phase (runner: "... after finishing").
    gc.freeze()
    if fault("crash:exit"):  # the self-test's own tests: a library that crashes at exit
        atexit.register(os.abort)
    return 0


if __name__ == "__main__":
    sys.exit(main())
