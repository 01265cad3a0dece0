"""What a phase is: a plan of steps, each producing one or more checks.

A phase module exposes ``plan(run) -> list[Step]``. The worker subprocess (``worker.py``)
runs the steps in order and streams a marker before each, so the parent (``runner.py``) can
name the check that hung or crashed, and resume the phase after a crash.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .manifest import GpuExpectation, expectation_from_dict
from .report import SKIP, Check

StepFn = Callable[["Run"], "Check | list[Check]"]


@dataclass
class Step:
    """One unit of work. ``ids`` are the check ids it produces (the first names the step);
    ``required``/``applies`` are what a not-run record of it carries."""

    ids: tuple[str, ...]
    fn: StepFn
    required: bool = True
    applies: bool = True

    @property
    def id(self) -> str:
        """The step's name (its first check id)."""
        return self.ids[0]


@dataclass
class Run:
    """What a step sees: the run context and a way to record facts (platform, versions)."""

    ctx: dict[str, Any]
    emit: Callable[[dict[str, Any]], None] = lambda rec: None
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def manifest(self) -> dict[str, Any]:
        """The baked manifest (normalised)."""
        return self.ctx["manifest"]

    @property
    def options(self) -> dict[str, Any]:
        """CLI options that phases need (bandwidth size, reference table, gloo ranks...)."""
        return self.ctx.get("options", {})

    @property
    def expect(self) -> GpuExpectation:
        """The resolved GPU expectation."""
        return expectation_from_dict(self.ctx["expect"])

    @property
    def accelerator(self) -> str:
        """cuda | rocm | cpu, from the manifest."""
        return self.manifest["accelerator"]

    def fact(self, key: str, value: Any) -> None:
        """Record a fact such as ``versions.torch`` or ``platform.gpus``."""
        self.facts[key] = value
        self.emit({"t": "fact", "key": key, "value": value})


def rank_timeout(run: Run, phase: str) -> float:
    """Deadline for ranks spawned inside a phase: shorter than the phase's own timeout, so
    a hung collective is reported by the phase (naming the ranks) before it is killed."""
    t = float(run.options.get("timeouts", {}).get(phase, 120.0))
    return max(t - max(10.0, 0.2 * t), 5.0)


def skip(id: str, phase: str, reason: str, required: bool = False, applies: bool = True,
         **kw: Any) -> Check:
    """A skip record."""
    return Check(id=id, phase=phase, status=SKIP, required=required, applies=applies,
                 reason=reason, **kw)


def gpu_skip(id: str, phase: str, expect: GpuExpectation) -> Check:
    """The skip a GPU check gets when GPUs are not expected (reason from the expectation)."""
    return skip(id, phase, expect.skip_reason or "GPU checks not expected", required=False,
                applies=expect.applies)


def fault(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Fault injection for the self-test's own tests: ``VERL_ENV_SELFTEST_FAULT`` is a comma
    list (e.g. ``hang:cpu.gloo_allreduce``, ``hang-rank:1``, ``crash:imports.torch``).
    Inert unless that variable is set."""
    env = os.environ if env is None else env
    return name in [f.strip() for f in env.get("VERL_ENV_SELFTEST_FAULT", "").split(",")]


def maybe_inject(step_id: str) -> None:
    """Hang or crash at a step when the fault variable asks for it (tests only)."""
    if fault(f"hang:{step_id}"):
        while True:
            time.sleep(3600)
    if fault(f"crash:{step_id}"):
        os.abort()
