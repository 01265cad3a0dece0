"""Run one phase in a subprocess with its own timeout; turn hangs and crashes into failed
checks that name the phase and the step; resume a phase after a crash.

The subprocess gets a new session; on timeout every process of that session (rank
processes, Ray's raylet and workers) is killed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .report import FAIL, SKIP, Check


ACTIVE: set[int] = set()  # sessions of running child processes (for signal cleanup)


def kill_active() -> None:
    """Kill every child session still running (called when we are terminated)."""
    for sid in list(ACTIVE):
        kill_session(sid)
        ACTIVE.discard(sid)


@dataclass
class PhaseResult:
    """What a phase produced: checks, facts, and how it ended."""

    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    ended: str = "ok"  # ok | timeout | crash | error
    attempts: int = 0


@dataclass
class Stream:
    """The parsed JSON-lines stream of one worker attempt. A worker that runs several phases
    tags its records with the phase (``plan``, ``start``, ``check``, ``fact``)."""

    plans: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)  # phases whose steps began, in order
    begun: list[str] = field(default_factory=list)
    finished: set[str] = field(default_factory=set)
    routed: list[tuple[str, Check]] = field(default_factory=list)  # (phase tag, check)
    tagged_facts: list[tuple[str, str, Any]] = field(default_factory=list)
    ended: bool = False

    @property
    def plan(self) -> list[dict[str, Any]] | None:
        """Every planned step, all phases together (None before the first plan record)."""
        if not self.plans:
            return None
        return [step for steps in self.plans.values() for step in steps]

    @property
    def checks(self) -> list[Check]:
        """The checks, in stream order."""
        return [c for _, c in self.routed]

    @property
    def facts(self) -> dict[str, Any]:
        """The facts (a later value of a key wins)."""
        return {k: v for _, k, v in self.tagged_facts}

    @property
    def in_progress(self) -> str | None:
        """The step that began but produced no check yet."""
        for sid in reversed(self.begun):
            if sid not in self.finished:
                return sid
        return None

    def phase_of(self, step_id: str) -> str | None:
        """The phase whose plan has the step ``step_id``."""
        for phase, steps in self.plans.items():
            if any(step["ids"][0] == step_id for step in steps):
                return phase
        return None


def parse_stream(text: str) -> Stream:
    """Parse a worker's output file (tolerates a truncated last line)."""
    s = Stream()
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        kind = rec.get("t")
        tag = str(rec.get("phase", ""))
        if kind == "plan":
            s.plans[tag] = rec["steps"]
        elif kind == "start":
            s.started.append(tag)
        elif kind == "begin":
            s.begun.append(rec["id"])
        elif kind == "done":
            s.finished.add(rec["id"])
        elif kind == "check":
            s.routed.append((tag, Check.from_dict(rec["check"])))
        elif kind == "fact":
            s.tagged_facts.append((tag, rec["key"], rec["value"]))
        elif kind == "end":
            s.ended = True
    return s


def read_stream(path: str) -> Stream:
    """The stream written so far (empty when the worker wrote nothing)."""
    try:
        with open(path, encoding="utf-8") as f:
            return parse_stream(f.read())
    except OSError:
        return Stream()


def describe_rc(rc: int) -> str:
    """``-11`` → ``killed by SIGSEGV``; ``1`` → ``exit status 1``."""
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


def session_pids(sid: int, proc: str = "/proc") -> list[int]:
    """Live (not zombie) pids whose session id is ``sid`` (from /proc/PID/stat)."""
    pids = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc}/{entry}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 3 and fields[3] == str(sid) and fields[0] not in ("Z", "X"):
            pids.append(int(entry))
    return pids


def kill_session(sid: int) -> None:
    """SIGKILL every process in the session the worker started (itself and its children)."""
    for _ in range(3):
        pids = session_pids(sid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


_EXC = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Timeout)\b.*)$",
                  re.MULTILINE)


def summarize_log(text: str, n: int = 400) -> str:
    """The last exception line of a log (``DistStoreError: Timed out ...``), else its tail."""
    hits = _EXC.findall(text)
    if hits:
        return " ".join(hits[-1].split())[:n]
    return " ".join(text[-n:].split())


def _tail(path: str, n: int = 400) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return summarize_log(f.read(), n)
    except OSError:
        return ""


def not_run(plan: list[dict[str, Any]], produced: set[str], phase: str,
            why: str) -> list[Check]:
    """Skip records for planned checks that never ran (never a pass)."""
    out = []
    for step in plan:
        for cid in step["ids"]:
            if cid not in produced:
                out.append(Check(id=cid, phase=phase, status=SKIP, required=step["required"],
                                 applies=step["applies"], reason=f"not run: {why}"))
    return out


def run_phase(phase: str, ctx_path: str, timeout: float, workdir: str,
              python: str = sys.executable, max_restarts: int = 3,
              env: dict[str, str] | None = None) -> PhaseResult:
    """Run ``phase`` in a subprocess (several attempts after crashes, one time budget)."""
    return run_worker([phase], ctx_path, {phase: timeout}, workdir, python, max_restarts,
                      env)[phase]


POLL_S = 0.1  # how often a worker of several phases is looked at (whose clock runs)


class _Worker:
    """One or more phases run in order in one subprocess, each with its own time budget
    (its clock starts when its steps start; the first one's when the worker starts) and its
    own report: a hang or a crash names the phase of the step in progress, and the phases
    after it run on in a new worker."""

    def __init__(self, phases: Sequence[str], timeouts: Mapping[str, float]) -> None:
        self.results = {p: PhaseResult() for p in phases}
        self.timeouts = dict(timeouts)
        self.open: list[str] = list(phases)
        self.plans: dict[str, list[dict[str, Any]]] = {}
        self.clock: dict[str, float] = {}
        self.done: list[str] = []

    def produced(self) -> set[str]:
        return {c.id for r in self.results.values() for c in r.checks}

    def current(self, stream: Stream) -> str:
        """The open phase whose steps run now (the first open one before any started)."""
        started = [p for p in stream.started if p in self.open]
        return started[-1] if started else self.open[0]

    def watch(self, stream: Stream, now: float) -> str | None:
        """Start the clocks of phases that started; the phase over its budget, if any."""
        for p in stream.started:
            if p in self.open:
                self.clock.setdefault(p, now)
        p = self.current(stream)
        return p if self.left(p, now) <= 0 else None

    def left(self, phase: str, now: float) -> float:
        """Seconds left of ``phase``'s budget (its clock started)."""
        return self.clock[phase] + self.timeouts[phase] - now

    def take(self, stream: Stream) -> None:
        """Keep an attempt's plans, checks and facts, each under its phase."""
        first = self.open[0]
        self.plans.update({(t or first): steps for t, steps in stream.plans.items()})
        for tag, check in stream.routed:
            self.results[tag if tag in self.results else first].checks.append(check)
        for tag, key, value in stream.tagged_facts:
            self.results[tag if tag in self.results else first].facts[key] = value

    def close(self, phase: str, why: str) -> None:
        """Close an open phase; its planned checks with no record become skips (``why``)."""
        res = self.results[phase]
        res.checks.extend(not_run(self.plans.get(phase, []), self.produced(), phase, why))
        self.open.remove(phase)

    def close_before(self, phase: str) -> None:
        """Phases before ``phase`` in the worker finished all their steps."""
        for p in self.open[:self.open.index(phase)]:
            self.close(p, f"phase '{p}' produced no record for it")

    def timed_out(self, phase: str, stream: Stream) -> None:
        self.close_before(phase)
        res = self.results[phase]
        res.ended = "timeout"
        why = f"phase '{phase}' timed out after {self.timeouts[phase]:.0f} s (killed)"
        cur = stream.in_progress
        cur = cur if cur and stream.phase_of(cur) in (phase, "") else None
        where = f"; hung in {cur}" if cur else " before its first check"
        res.checks.append(Check(id=cur or f"{phase}.timeout", phase=phase, status=FAIL,
                                reason=why + where))
        self.close(phase, why)

    def exited(self, rc: int, log: str) -> None:
        """All records written, then a bad exit: keep the records, flag it on the last."""
        last = self.open[-1]
        for p in self.open:
            self.results[p].ended = "error"
        who = " + ".join(f"'{p}'" for p in self.open)
        self.results[last].checks.append(Check(
            id=f"{last}.exit", phase=last, status=FAIL,
            reason=f"phase {who} worker {describe_rc(rc)} after finishing: {_tail(log)}"))
        for p in list(self.open):
            self.close(p, f"phase '{p}' produced no record for it")

    def crashed(self, rc: int, stream: Stream, log: str, now: float) -> None:
        """A crash: fail the step in progress; the rest of its phase and the phases after it
        resume in the next worker (none when the crash came before the first check)."""
        cur = stream.in_progress
        phase = (stream.phase_of(cur) or self.open[0]) if cur else self.current(stream)
        phase = phase if phase in self.open else self.open[0]
        self.close_before(phase)
        res = self.results[phase]
        res.ended = "crash"
        why = f"phase '{phase}' worker {describe_rc(rc)}"
        if not self.plans or cur is None:
            res.checks.append(Check(id=f"{phase}.error", phase=phase, status=FAIL,
                                    reason=f"{why} before its first check: {_tail(log)}"))
            for p in list(self.open):
                self.close(p, why)
            return
        step = next((s for s in self.plans.get(phase, []) if s["ids"][0] == cur), None)
        res.checks.append(Check(id=cur, phase=phase, status=FAIL,
                                required=step["required"] if step else True,
                                reason=f"{why} while running it: {_tail(log)}"))
        if step:
            res.checks.extend(not_run([step], {cur}, phase, f"{why} in {cur}"))
        self.done = list(dict.fromkeys(self.done + stream.begun))
        self.clock.setdefault(phase, now)
        if self.left(phase, now) <= 0:
            self.close(phase, f"phase '{phase}' crashed {res.attempts} times")


def run_worker(phases: Sequence[str], ctx_path: str, timeouts: Mapping[str, float],
               workdir: str, python: str = sys.executable, max_restarts: int = 3,
               env: dict[str, str] | None = None) -> dict[str, PhaseResult]:
    """Run ``phases`` in order in one subprocess (a phase that imports what the next one
    needs saves that import), each reported as if it ran alone; several attempts after
    crashes, each phase with its own time budget."""
    pkg = __package__ or "verl_env_selftest"
    w = _Worker(phases, timeouts)
    name = "+".join(phases)
    for attempt in range(max_restarts + 1):
        for p in w.open:
            w.results[p].attempts = attempt + 1
        out = os.path.join(workdir, f"{name}.{attempt}.jsonl")
        log = os.path.join(workdir, f"{name}.{attempt}.log")
        cmd = [python, "-m", f"{pkg}.launch.worker", "--phase", ",".join(w.open),
               "--ctx", ctx_path, "--out", out, "--done", ",".join(w.done)]
        over: str | None = None
        several = len(w.open) > 1  # else one phase: wait for its deadline, read nothing
        with open(log, "wb") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, env=env)
            ACTIVE.add(proc.pid)
            w.clock.setdefault(w.open[0], time.monotonic())
            try:
                while True:
                    try:
                        rc = proc.wait(timeout=POLL_S if several else max(
                            w.left(w.open[0], time.monotonic()), 0.1))
                        break
                    except subprocess.TimeoutExpired:
                        over = w.watch(read_stream(out) if several else Stream(),
                                       time.monotonic())
                        if over:
                            kill_session(proc.pid)
                            rc = proc.wait()
                            break
            finally:
                kill_session(proc.pid)  # stragglers (e.g. Ray workers) of a finished phase
                ACTIVE.discard(proc.pid)
        stream = read_stream(out)
        w.take(stream)
        if stream.ended and rc == 0 and not over:
            for p in list(w.open):
                w.close(p, f"phase '{p}' produced no record for it")
            return w.results
        if over:
            w.timed_out(over, stream)
        elif stream.ended:
            w.exited(rc, log)
        else:
            w.crashed(rc, stream, log, time.monotonic())
        if not w.open:
            return w.results
    for p in list(w.open):
        w.close(p, f"phase '{p}' crashed {w.results[p].attempts} times")
    return w.results
