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
    """The parsed JSON-lines stream of one worker attempt."""

    plan: list[dict[str, Any]] | None = None
    begun: list[str] = field(default_factory=list)
    finished: set[str] = field(default_factory=set)
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    ended: bool = False

    @property
    def in_progress(self) -> str | None:
        """The step that began but produced no check yet."""
        for sid in reversed(self.begun):
            if sid not in self.finished:
                return sid
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
        if kind == "plan":
            s.plan = rec["steps"]
        elif kind == "begin":
            s.begun.append(rec["id"])
        elif kind == "done":
            s.finished.add(rec["id"])
        elif kind == "check":
            s.checks.append(Check.from_dict(rec["check"]))
        elif kind == "fact":
            s.facts[rec["key"]] = rec["value"]
        elif kind == "end":
            s.ended = True
    return s


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
    pkg = __package__ or "verl_env_selftest"
    result = PhaseResult()
    done: list[str] = []
    plan: list[dict[str, Any]] | None = None
    deadline = time.monotonic() + timeout
    for attempt in range(max_restarts + 1):
        result.attempts = attempt + 1
        out = os.path.join(workdir, f"{phase}.{attempt}.jsonl")
        log = os.path.join(workdir, f"{phase}.{attempt}.log")
        cmd = [python, "-m", f"{pkg}.launch.worker", "--phase", phase, "--ctx", ctx_path,
               "--out", out, "--done", ",".join(done)]
        with open(log, "wb") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, env=env)
            ACTIVE.add(proc.pid)
            timed_out = False
            try:
                rc = proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_session(proc.pid)
                rc = proc.wait()
            finally:
                kill_session(proc.pid)  # stragglers (e.g. Ray workers) of a finished phase
                ACTIVE.discard(proc.pid)
        try:
            with open(out, encoding="utf-8") as f:
                stream = parse_stream(f.read())
        except OSError:
            stream = Stream()
        plan = stream.plan or plan
        result.checks.extend(stream.checks)
        result.facts.update(stream.facts)
        produced = {c.id for c in result.checks}
        if stream.ended and rc == 0 and not timed_out:
            result.checks.extend(not_run(plan or [], produced, phase,
                                         f"phase '{phase}' produced no record for it"))
            return result
        current = stream.in_progress
        if timed_out:
            result.ended = "timeout"
            why = f"phase '{phase}' timed out after {timeout:.0f} s (killed)"
            where = f"; hung in {current}" if current else " before its first check"
            result.checks.append(Check(id=current or f"{phase}.timeout", phase=phase,
                                       status=FAIL, reason=why + where))
            result.checks.extend(not_run(plan or [], produced | {current or ""}, phase, why))
            return result
        if stream.ended:  # all records written, then a bad exit: keep records, flag it
            result.ended = "error"
            result.checks.append(Check(id=f"{phase}.exit", phase=phase, status=FAIL,
                                       reason=f"phase '{phase}' worker {describe_rc(rc)} "
                                              f"after finishing: {_tail(log)}"))
            return result
        result.ended = "crash"
        why = f"phase '{phase}' worker {describe_rc(rc)}"
        if plan is None or current is None:
            result.checks.append(Check(id=f"{phase}.error", phase=phase, status=FAIL,
                                       reason=f"{why} before its first check: {_tail(log)}"))
            result.checks.extend(not_run(plan or [], produced, phase, why))
            return result
        step = next((s for s in plan if s["ids"][0] == current), None)
        result.checks.append(Check(id=current, phase=phase, status=FAIL,
                                   required=step["required"] if step else True,
                                   reason=f"{why} while running it: {_tail(log)}"))
        if step:
            result.checks.extend(not_run([step], {current}, phase, f"{why} in {current}"))
        done = list(dict.fromkeys(done + stream.begun))
        if time.monotonic() >= deadline:
            break
    produced = {c.id for c in result.checks}
    result.checks.extend(not_run(plan or [], produced, phase,
                                 f"phase '{phase}' crashed {result.attempts} times"))
    return result
