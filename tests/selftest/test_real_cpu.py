"""The self-test run for real on this CPU machine with the host venv (torch 2.13 CPU,
tensordict 0.10.0, Ray 2.60): every phase, gloo with 1/2/4 ranks, torchrun, srun-style
ranks, hung collectives. Timings are printed (``pytest -s``) for the record."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from .conftest import RunSelftest
from .helpers import clean_env, manifest_for

CONTRACT = ("id", "phase", "required", "status", "value", "unit", "threshold", "reason",
            "duration_s")


def test_full_cpu_run_all_phases(selftest: RunSelftest, installed: dict[str, str]) -> None:
    r = selftest(manifest=manifest_for(installed))
    print(f"\nfull CPU-only run (all phases): {r.report and r.report['duration_s']:.1f} s "
          f"in-report, {r.wall_s:.1f} s wall")
    assert r.rc == 0, r.stdout + r.stderr
    rep = r.report
    assert rep is not None and rep["overall"] == "pass" and rep["schema"] == "verl-env/selftest/v1"
    assert rep["duration_s"] < 140, "a hang, not speed: ~10 s measured; 150 s kills the run"
    for c in rep["checks"]:
        assert tuple(c) == CONTRACT
        assert c["status"] != "skip" or c["reason"], c        # every skip says why
    assert rep["summary"]["fail"] == 0
    for cid in ("cpu.tensordict_membership", "cpu.gloo_allreduce", "ray.local_start",
                "imports.torch", "imports.tensordict", "imports.ray", "versions.pin.torch",
                "versions.ray_min", "preflight.shm", "env.hf_cache"):
        assert r.check(cid)["status"] == "pass", r.check(cid)
    assert not any(i.startswith("imports.verl") for i in r.ids())   # verl not in manifest
    gpu = r.check("gpu.kernel")
    assert gpu["status"] == "skip" and not gpu["required"]
    assert rep["transport"] == "gloo/tcp" and rep["world_size"] == 2
    gloo = r.check("cpu.gloo_allreduce")
    assert gloo["reason"].startswith("2 ranks over gloo/tcp")
    print(f"gloo 2 ranks (in the full run): {gloo['duration_s']:.1f} s; {gloo['reason']}")
    assert rep["versions"]["torch"] == installed["torch"]
    assert "overall: PASS" in r.stdout and "cpu.gloo_allreduce" in r.stdout


def test_pinned_verl_missing_fails(selftest: RunSelftest, installed: dict[str, str]) -> None:
    m = manifest_for(installed, names=("torch",), extra_pins={"verl": "0.9.1"})
    r = selftest("--phases", "imports,versions", manifest=m)
    assert r.rc == 1 and r.report and r.report["overall"] == "fail"
    assert r.check("imports.verl")["status"] == "fail"
    assert "No module named 'verl'" in r.check("imports.verl")["reason"]
    sub = r.check("imports.verl.single_controller")
    assert sub["status"] == "skip" and sub["required"]
    assert r.check("versions.pin.verl")["status"] == "fail"
    req = r.check("versions.verl_requires")
    assert req["status"] == "skip" and req["required"] and req["reason"] == "verl is not installed"


def test_gpu_target_on_cpu_build_host(selftest: RunSelftest, installed: dict[str, str]) -> None:
    m = manifest_for(installed, accelerator="cuda", names=("torch",))
    r = selftest("--phases", "gpu,collective", manifest=m)
    assert r.rc == 0, r.stdout + r.stderr
    for cid in ("gpu.device_count", "gpu.arch", "gpu.kernel", "collective.nccl_allreduce",
                "collective.busbw"):
        c = r.check(cid)
        assert c["status"] == "skip" and not c["required"]
        assert c["reason"] == "no GPU visible (build host)"
    assert "GPUs not expected: no GPU visible (build host)" in r.stdout
    strict = selftest("--phases", "gpu,collective", "--strict", manifest=m)
    assert strict.rc == 2 and strict.report and strict.report["overall"] == "incomplete"
    assert strict.check("gpu.kernel")["required"]


@pytest.mark.parametrize("ranks", [1, 4])   # 2 ranks: the default, in the full run above
def test_gloo_allreduce_ranks(selftest: RunSelftest, installed: dict[str, str],
                              ranks: int) -> None:
    r = selftest("--phases", "cpu", "--gloo-ranks", str(ranks),
                 manifest=manifest_for(installed, names=("torch",)))
    c = r.check("cpu.gloo_allreduce")
    print(f"\ngloo {ranks} rank(s): phase {c['duration_s']:.1f} s, run {r.wall_s:.1f} s wall; "
          f"{c['reason']}")
    assert r.rc == 0 and c["status"] == "pass" and c["value"] == 0
    assert c["reason"].startswith(f"{ranks} rank{'s' if ranks > 1 else ''} over gloo/tcp")
    assert r.report and r.report["world_size"] == ranks


def _logs(tmp_path: Path) -> list[str]:
    """torchrun's logs in the test's directory (by default it leaves a ``torchelastic_*``
    directory in /tmp for every run)."""
    return ["--log-dir", str(tmp_path / "torchrun-logs")]


def test_torchrun_two_ranks(selftest: RunSelftest, installed: dict[str, str],
                            hostpy: str, tmp_path: Path) -> None:
    torchrun = str(Path(hostpy).parent / "torchrun")
    r = selftest(manifest=manifest_for(installed, names=("torch",)),
                 prefix=[torchrun, *_logs(tmp_path), "--standalone", "--nproc-per-node", "2",
                         "-m"])
    print(f"\ntorchrun 2 ranks: {r.wall_s:.1f} s wall")
    assert r.rc == 0, r.stdout + r.stderr
    rep = r.report
    assert rep and rep["launcher"] == "torchrun" and rep["world_size"] == 2
    assert rep["transport"] == "gloo/tcp" and rep["hosts"] == [socket.gethostname()]
    assert r.check("collective.gloo_allreduce")["status"] == "pass"
    bw = r.check("collective.busbw")
    assert bw["status"] == "skip" and bw["value"] > 0 and bw["reason"].startswith("no reference")
    assert "rank 1/2: PASS" in r.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def srun_ranks(hostpy: str, st_path: Path, tmp_path: Path, manifest: dict[str, object],
               local_ids: tuple[int, int], per_rank_env: dict[int, dict[str, str]] | None = None,
               ) -> tuple[list[int], list[str], dict[str, object] | None]:
    """Start two ranks the way an srun step does (SLURM_* variables, MASTER_ADDR/PORT)."""
    mpath, report = tmp_path / "m.json", tmp_path / "r.json"
    mpath.write_text(json.dumps(manifest))
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = clean_env(PYTHONPATH=str(st_path), SLURM_PROCID=str(rank), SLURM_NTASKS="2",
                        SLURM_LOCALID=str(local_ids[rank]), SLURM_STEP_ID="0",
                        SLURM_JOB_ID="42", SLURM_NODELIST="localhost",
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                        **(per_rank_env or {}).get(rank, {}))
        procs.append(subprocess.Popen(
            [hostpy, "-m", "verl_env_selftest", "--manifest", str(mpath), "--json", str(report),
             "--phases", "preflight,env,collective"], env=env, cwd=tmp_path,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs, rcs = [], []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120)[0])
        finally:
            if p.poll() is None:
                p.kill()
        rcs.append(p.returncode)
    return rcs, outs, json.loads(report.read_text()) if report.exists() else None


def test_ranks_agree_on_one_verdict(hostpy: str, st_path: Path, tmp_path: Path,
                                    installed: dict[str, str]) -> None:
    """srun-style ranks (SLURM_* + MASTER_ADDR/PORT) as two "nodes" (both local rank 0,
    so both run the node-local phases); only rank 1's environment is broken: rank 0 must
    report fail too, and its JSON must hold rank 1's failing record."""
    bad = {1: {"RAY_DEBUG": "legacy", "RAY_DEBUG_POST_MORTEM": "1"}}
    rcs, outs, rep = srun_ranks(hostpy, st_path, tmp_path,
                                manifest_for(installed, names=("torch",)), (0, 0), bad)
    assert rcs == [1, 1], outs
    assert rep and rep["overall"] == "fail" and rep["launcher"] == "slurm"
    assert rep["world_size"] == 2 and rep["transport"] == "gloo/tcp"
    assert [c["status"] for c in rep["checks"] if c["id"] == "collective.gloo_allreduce"] == \
        ["pass"]
    assert [c["id"] for c in rep["checks"]].count("preflight.shm") == 2   # one per "node"
    ray_debug = [c for c in rep["checks"] if c["id"].startswith("env.ray_debug")]
    assert sorted(c["status"] for c in ray_debug) == ["fail", "pass"]
    assert "rank 1/2: FAIL" in outs[1]


def test_hung_rank_is_killed_and_reported(selftest: RunSelftest,
                                          installed: dict[str, str]) -> None:
    # the ranks' deadline is 5 s (rank_timeout's floor) and the phase's 10 s later: the phase
    # imports torch before its ranks start, which took over 6 s at load 12 (CI 2026-12-01, with
    # --timeout 11 the phase's own deadline came first)
    r = selftest("--phases", "cpu", "--timeout", "15",
                 manifest=manifest_for(installed, names=("torch",)),
                 env={"VERL_ENV_SELFTEST_FAULT": "hang-rank:1"})
    c = r.check("cpu.gloo_allreduce")
    assert r.rc == 1 and c["status"] == "fail"
    assert "did not finish within 5 s (killed; hung collective)" in c["reason"]


def test_hung_phase_is_killed_and_named(selftest: RunSelftest,
                                        installed: dict[str, str]) -> None:
    r = selftest("--phases", "preflight,cpu", "--timeout", "4",
                 manifest=manifest_for(installed, names=("torch",)),
                 env={"VERL_ENV_SELFTEST_FAULT": "hang:cpu.gloo_allreduce"})
    c = r.check("cpu.gloo_allreduce")
    assert r.rc == 1 and r.report and r.report["overall"] == "fail"
    assert c["status"] == "fail" and c["phase"] == "cpu"
    assert c["reason"] == "phase 'cpu' timed out after 4 s (killed); hung in cpu.gloo_allreduce"
    assert r.check("preflight.shm")["status"] == "pass"


def test_hung_collective_under_torchrun(selftest: RunSelftest, installed: dict[str, str],
                                        hostpy: str, tmp_path: Path) -> None:
    torchrun = str(Path(hostpy).parent / "torchrun")
    r = selftest("--phases", "collective", "--timeout", "2",
                 manifest=manifest_for(installed, names=("torch",)),
                 env={"VERL_ENV_SELFTEST_FAULT": "hang-rank:1"},
                 prefix=[torchrun, *_logs(tmp_path), "--standalone", "--nproc-per-node", "2",
                         "-m"])
    print(f"\ntorchrun hung collective: {r.wall_s:.1f} s wall")
    assert r.rc != 0
    rep = r.report
    assert rep and rep["overall"] == "fail" and rep["world_size"] == 2
    fail = r.check("collective.allreduce")
    assert fail["status"] == "fail" and "collective" in fail["reason"]


def test_self_test_error_exit_3(selftest: RunSelftest, installed: dict[str, str],
                                tmp_path: Path) -> None:
    r = selftest("--phases", "nonsense", manifest=manifest_for(installed))
    assert r.rc == 3 and "unknown phase" in r.stderr
    assert r.report and r.report["overall"] == "error"
    bad = tmp_path / "ref.json"
    bad.write_text("[{}]")
    r = selftest("--bw-ref", str(bad), manifest=manifest_for(installed))
    assert r.rc == 3 and "match" in r.stderr


def test_no_stray_processes_left(hostpy: str) -> None:
    """Nothing this module started (phase workers, ranks, our private Ray) survives it.
    Other sessions may run their own Ray from the same venv: only ours is matched, and only in
    this PID namespace (an image's self-test in a container names its Ray dir alike)."""
    venv = os.path.dirname(os.path.dirname(hostpy))
    ours = os.readlink("/proc/self/ns/pid")
    stray = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            # containers (an image's own self-test, e.g. the emulated group's) are not ours
            if os.readlink(f"/proc/{pid}/ns/pid") != ours:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "vst-ray-" in cmd or (cmd.startswith(venv) and "verl_env_selftest" in cmd):
            stray.append(f"{pid}: {cmd[:200]}")
    assert stray == [], stray


def test_expected_gpus_are_counted_without_the_gpu_phase(selftest: RunSelftest,
                                                         installed: dict[str, str]) -> None:
    """``--expect-gpus N`` fails closed even when the gpu phase is not selected."""
    r = selftest("--phases", "preflight", "--expect-gpus", "1",
                 manifest=manifest_for(installed))
    assert r.rc == 1 and r.report and r.report["overall"] == "fail", r.stdout + r.stderr
    count = r.check("gpu.device_count")
    assert count["status"] == "fail" and count["value"] == 0 and "1 expected" in count["reason"]
    assert r.report["platform"]["gpu_count"] == 0
    # the control: without an expectation the same narrowed run passes
    r = selftest("--phases", "preflight", manifest=manifest_for(installed))
    assert r.rc == 0 and "gpu.device_count" not in r.ids(), r.stdout + r.stderr
