"""GPU code paths for real (NVIDIA or AMD). Skipped visibly where torch sees no GPU.

The python used is ``$VERL_ENV_SELFTEST_PYTHON`` (e.g. an image's /opt/venv/bin/python or a
CUDA/ROCm torch venv) or else the host venv. Run on a GPU machine with
``python -m pytest tests/selftest -m gpu -s``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .conftest import RunSelftest, runner_for

pytestmark = pytest.mark.gpu

PROBE = """
import json, importlib.metadata as m, torch
def v(n):
    try:
        return m.version(n)
    except m.PackageNotFoundError:
        return None
print(json.dumps({"available": torch.cuda.is_available(),
                  "count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
                  "hip": torch.version.hip, "cuda": torch.version.cuda,
                  "torch": v("torch"), "ray": v("ray")}))
"""


@pytest.fixture(scope="module")
def gpu_python(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """A python whose torch sees GPUs, and what it sees."""
    python = os.environ.get("VERL_ENV_SELFTEST_PYTHON")
    if not python:
        python = request.getfixturevalue("hostpy")
    out = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        pytest.skip(f"no torch in {python}: {out.stderr.strip()[-200:]}")
    info = json.loads(out.stdout.strip().splitlines()[-1])
    if not info["available"]:
        pytest.skip(f"torch.cuda.is_available() is false for {python} (no GPU here)")
    return python, info


@pytest.fixture
def gpu_run(gpu_python: tuple[str, dict[str, Any]], st_path: Path,
            tmp_path: Path) -> RunSelftest:
    return runner_for(gpu_python[0], st_path, tmp_path)


def gpu_manifest(info: dict[str, Any]) -> dict[str, Any]:
    acc = "rocm" if info["hip"] else "cuda"
    pins = {"torch": info["torch"]}
    if info["ray"]:
        pins["ray"] = info["ray"]
    return {"schema": "verl-env/manifest/v1", "target": f"gpu-test-{acc}", "accelerator": acc,
            "cuda": info["cuda"], "rocm": None, "pins": pins, "provided": {},
            "imports": {n: n for n in pins}}


def test_gpu_phase(gpu_run: RunSelftest, gpu_python: tuple[str, dict[str, Any]]) -> None:
    info = gpu_python[1]
    r = gpu_run("--phases", "gpu", manifest=gpu_manifest(info))
    print("\n" + r.stdout)
    count = r.check("gpu.device_count")
    assert count["status"] == "pass" and count["required"] and count["value"] == info["count"]
    for i in range(info["count"]):
        assert r.check(f"gpu.arch.{i}")["status"] == "pass"
        assert r.check(f"gpu.kernel.{i}")["status"] == "pass"
    lib = r.check("gpu.nccl_library")
    assert lib["status"] == "pass", lib
    assert r.check("gpu.driver")["status"] in ("pass", "warn", "skip")
    assert r.report and r.report["platform"]["gpu_count"] == info["count"]


def test_expecting_more_gpus_than_visible_fails(gpu_run: RunSelftest,
                                                gpu_python: tuple[str, dict[str, Any]]) -> None:
    info = gpu_python[1]
    r = gpu_run("--phases", "gpu", "--expect-gpus", str(info["count"] + 1),
                manifest=gpu_manifest(info))
    assert r.rc == 1 and r.check("gpu.device_count")["status"] == "fail"


def test_nccl_collective_standalone(gpu_run: RunSelftest,
                                    gpu_python: tuple[str, dict[str, Any]]) -> None:
    info = gpu_python[1]
    r = gpu_run("--phases", "collective", "--bw-size", "256M", manifest=gpu_manifest(info))
    print("\n" + r.stdout)
    c = r.check("collective.nccl_allreduce")
    assert c["status"] == "pass" and c["value"] == 0 and c["required"], c
    bw = r.check("collective.busbw")
    if info["count"] == 1:
        assert bw["status"] == "skip" and "1 rank" in bw["reason"]
    else:
        assert bw["value"] and bw["value"] > 0
        assert bw["status"] in ("pass", "warn", "skip"), bw   # skip only for "no reference"
    transport = r.check("collective.transport")
    assert transport["value"].startswith("intra-node") or info["count"] == 1
    assert r.report and r.report["world_size"] == info["count"]


def test_torchrun_nccl(gpu_python: tuple[str, dict[str, Any]], gpu_run: RunSelftest) -> None:
    python, info = gpu_python
    if info["count"] < 2:
        pytest.skip("needs 2 GPUs for a multi-rank NCCL run")
    torchrun = str(Path(python).parent / "torchrun")
    r = gpu_run("--bw-size", "256M", manifest=gpu_manifest(info),
                prefix=[torchrun, "--standalone", "--nproc-per-node", str(info["count"]), "-m"])
    print("\n" + r.stdout)
    assert r.rc in (0, 2), r.stdout + r.stderr
    assert r.check("collective.nccl_allreduce")["status"] == "pass"
    assert r.report and r.report["world_size"] == info["count"]


def test_ray_gpu_task(gpu_run: RunSelftest, gpu_python: tuple[str, dict[str, Any]]) -> None:
    info = gpu_python[1]
    if not info["ray"]:
        pytest.skip("ray is not installed in this python")
    r = gpu_run("--phases", "ray", manifest=gpu_manifest(info))
    assert r.check("ray.local_start")["status"] == "pass"
    assert r.check("ray.gpu_task")["status"] == "pass", r.check("ray.gpu_task")
