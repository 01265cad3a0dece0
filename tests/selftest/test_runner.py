"""The phase runner: stream parsing, and real subprocess phases (stdlib-only phases run with
this interpreter) that finish, crash and resume, hang and get killed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder.selftest import runner
from builder.selftest.manifest import resolve_expectation

from .helpers import REPO, clean_env


def test_parse_stream_and_in_progress() -> None:
    text = "\n".join(json.dumps(r) for r in [
        {"t": "plan", "steps": [{"ids": ["a.1"], "required": True, "applies": True},
                                {"ids": ["a.2", "a.3"], "required": False, "applies": True}]},
        {"t": "begin", "id": "a.1"},
        {"t": "check", "check": {"id": "a.1", "phase": "a", "status": "pass"}},
        {"t": "fact", "key": "versions.x", "value": "1"},
        {"t": "done", "id": "a.1"},
        {"t": "begin", "id": "a.2"},
    ]) + '\n{"t": "che'   # truncated by a crash
    s = runner.parse_stream(text)
    assert s.plan and len(s.plan) == 2 and s.facts == {"versions.x": "1"}
    assert [c.id for c in s.checks] == ["a.1"] and s.in_progress == "a.2" and not s.ended
    skipped = runner.not_run(s.plan, {"a.1", "a.2"}, "a", "phase 'a' timed out")
    assert [(c.id, c.status, c.required) for c in skipped] == [("a.3", "skip", False)]
    assert skipped[0].reason == "not run: phase 'a' timed out"


def test_describe_rc() -> None:
    assert runner.describe_rc(-11) == "killed by SIGSEGV"
    assert runner.describe_rc(-9) == "killed by SIGKILL"
    assert runner.describe_rc(1) == "exit status 1"


def test_kill_session_kills_grandchildren() -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300 & wait"],
                            start_new_session=True)
    time.sleep(0.3)
    assert len(runner.session_pids(proc.pid)) >= 3
    runner.kill_session(proc.pid)
    proc.wait(timeout=10)
    assert runner.session_pids(proc.pid) == []


@pytest.fixture
def ctx(tmp_path: Path) -> str:
    manifest = {"accelerator": "cpu", "pins": {}, "provided": {}, "imports": {}}
    path = tmp_path / "ctx.json"
    path.write_text(json.dumps({"manifest": manifest, "options": {},
                                "expect": resolve_expectation(None, "cpu", 0).to_dict()}))
    return str(path)


def phase_env(fault: str = "") -> dict[str, str]:
    env = clean_env(PYTHONPATH=str(REPO))
    if fault:
        env["VERL_ENV_SELFTEST_FAULT"] = fault
    return env


def test_phase_runs_in_subprocess(ctx: str, tmp_path: Path) -> None:
    res = runner.run_phase("env", ctx, 30, str(tmp_path), python=sys.executable, env=phase_env())
    assert res.ended == "ok" and res.attempts == 1
    assert [c.id for c in res.checks][:3] == ["env.hip_cuda_visible_devices",
                                              "env.rocr_visible_devices", "env.ray_debug"]
    assert all(c.status == "pass" for c in res.checks), [c.reason for c in res.checks]


def test_crash_is_a_named_failure_and_the_phase_resumes(ctx: str, tmp_path: Path) -> None:
    res = runner.run_phase("env", ctx, 30, str(tmp_path), python=sys.executable,
                           env=phase_env("crash:env.ray_debug"))
    by_id = {c.id: c for c in res.checks}
    crashed = by_id["env.ray_debug"]
    assert crashed.status == "fail" and "killed by SIGABRT while running it" in crashed.reason
    assert "phase 'env'" in crashed.reason
    assert res.attempts == 2 and by_id["env.hf_cache"].status == "pass"   # resumed after it
    assert len(res.checks) == 7


def test_hang_is_killed_and_named(ctx: str, tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = runner.run_phase("env", ctx, 3, str(tmp_path), python=sys.executable,
                           env=phase_env("hang:env.nccl_ib_hca"))
    assert time.monotonic() - t0 < 60  # the 3 s timeout killed it (a hang never returns)
    by_id = {c.id: c for c in res.checks}
    hung = by_id["env.nccl_ib_hca"]
    assert res.ended == "timeout" and hung.status == "fail"
    assert hung.reason == "phase 'env' timed out after 3 s (killed); hung in env.nccl_ib_hca"
    assert by_id["env.ray_debug"].status == "pass"
    later = by_id["env.hf_cache"]
    assert later.status == "skip" and later.reason.startswith("not run: phase 'env' timed out")


def test_a_crash_at_exit_after_every_record_fails_the_phase(ctx: str, tmp_path: Path) -> None:
    """The worker's exit skips the collector's passes (gc.freeze) but still runs atexit
    handlers and native teardown: a library crashing there fails the phase."""
    res = runner.run_phase("env", ctx, 30, str(tmp_path), python=sys.executable,
                           env=phase_env("crash:exit"))
    assert res.ended == "error" and len(res.checks) == 8
    assert all(c.status == "pass" for c in res.checks[:7])
    assert res.checks[7].id == "env.exit" and res.checks[7].status == "fail"
    assert res.checks[7].reason.startswith("phase 'env' worker killed by SIGABRT after finishing")


def test_crash_before_plan(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"manifest": {}, "options": {}}))
    res = runner.run_phase("env", str(bad), 30, str(tmp_path), python=sys.executable,
                           env=phase_env())
    assert [c.id for c in res.checks] == ["env.error"]
    assert res.checks[0].status == "fail" and "KeyError" in res.checks[0].reason


def test_detect_without_torch_is_a_failure(ctx: str, tmp_path: Path) -> None:
    """If torch cannot even say how many GPUs there are, that is a failed check (and the
    CLI then keeps GPU checks required), never a silent 'no GPU'."""
    res = runner.run_phase("detect", ctx, 30, str(tmp_path), python=sys.executable,
                           env=phase_env())
    if res.checks and res.checks[0].status == "pass":
        pytest.skip("this interpreter has torch")
    assert [c.id for c in res.checks] == ["gpu.detect"]
    assert res.checks[0].status == "fail" and "torch" in res.checks[0].reason
    assert "detect.gpu_count" not in res.facts


def test_phases_sharing_a_worker_report_as_if_alone(ctx: str, tmp_path: Path) -> None:
    """Two phases in one worker (as imports and cpu run in a gate): each phase gets its own
    checks and facts, in one attempt."""
    res = runner.run_worker(["preflight", "env"], ctx, {"preflight": 30, "env": 30},
                            str(tmp_path), python=sys.executable, env=phase_env())
    assert set(res) == {"preflight", "env"} and len(list(tmp_path.glob("*.log"))) == 1
    assert res["env"].ended == "ok" and res["env"].attempts == 1 and len(res["env"].checks) == 7
    assert {c.phase for c in res["env"].checks} == {"env"}
    assert res["preflight"].checks and {c.phase for c in res["preflight"].checks} == \
        {"preflight"}
    assert res["preflight"].facts and not res["env"].facts


def test_a_hang_in_a_shared_worker_names_its_phase_and_the_next_phase_runs(
        ctx: str, tmp_path: Path) -> None:
    """The hung phase is killed on its own budget and named; the phase after it runs in a new
    worker, with a budget of its own."""
    res = runner.run_worker(["env", "preflight"], ctx, {"env": 3, "preflight": 30},
                            str(tmp_path), python=sys.executable,
                            env=phase_env("hang:env.nccl_ib_hca"))
    env = {c.id: c for c in res["env"].checks}
    assert res["env"].ended == "timeout"
    assert env["env.nccl_ib_hca"].reason == \
        "phase 'env' timed out after 3 s (killed); hung in env.nccl_ib_hca"
    assert env["env.hf_cache"].reason.startswith("not run: phase 'env' timed out")
    assert res["preflight"].ended == "ok" and res["preflight"].attempts == 2
    assert res["preflight"].checks and all(not (c.reason or "").startswith("not run")
                                           for c in res["preflight"].checks)


def test_a_hang_in_the_second_phase_of_a_worker_is_its_own(ctx: str, tmp_path: Path) -> None:
    """The second phase's clock starts with its steps: the first one's time is not charged to
    it, and the first phase's records stand."""
    res = runner.run_worker(["preflight", "env"], ctx, {"preflight": 30, "env": 3},
                            str(tmp_path), python=sys.executable,
                            env=phase_env("hang:env.hf_cache"))
    assert res["preflight"].ended == "ok" and all(
        not (c.reason or "").startswith("not run") for c in res["preflight"].checks)
    hung = next(c for c in res["env"].checks if c.id == "env.hf_cache")
    assert hung.phase == "env" and hung.reason == \
        "phase 'env' timed out after 3 s (killed); hung in env.hf_cache"


def test_a_crash_in_a_shared_worker_resumes_both_phases(ctx: str, tmp_path: Path) -> None:
    res = runner.run_worker(["env", "preflight"], ctx, {"env": 30, "preflight": 30},
                            str(tmp_path), python=sys.executable,
                            env=phase_env("crash:env.ray_debug"))
    env = {c.id: c for c in res["env"].checks}
    assert "phase 'env' worker killed by SIGABRT while running it" in env["env.ray_debug"].reason
    assert env["env.hf_cache"].status == "pass" and len(env) == 7
    assert res["env"].ended == "crash" and res["preflight"].ended == "ok"
    assert res["preflight"].checks and all(not (c.reason or "").startswith("not run")
                                           for c in res["preflight"].checks)


def test_the_cpu_phase_shares_the_imports_worker_only_when_both_run() -> None:
    from builder.selftest.cli import worker_units

    assert worker_units(["preflight", "imports", "abi", "cpu", "ray"]) == \
        [["preflight"], ["imports", "cpu"], ["abi"], ["ray"]]
    assert worker_units(["cpu", "ray"]) == [["cpu"], ["ray"]]
    assert worker_units(["imports"]) == [["imports"]]
