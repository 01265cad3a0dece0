"""On a host that shows a GPU the GPU tests get a python with a CUDA torch, never the CPU host
venv, and fail when none can be made (tests/selftest/conftest.py).

The host is a device tree of our own (``$VERL_ENV_HOST_DEV``, as the gate reads it); each case
is a real pytest session using the suite's own hook.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import hostenv

REPO = Path(__file__).resolve().parents[2]
CONFTEST = "from tests.selftest.conftest import pytest_runtest_setup  # noqa: F401\n"
TEST = """
import os
import pytest

@pytest.mark.gpu
def test_gpu():
    print("python:", os.environ.get("VERL_ENV_SELFTEST_PYTHON"))

def test_cpu():
    pass
"""


def run(tmp_path: Path, gpus: int, **env: str) -> subprocess.CompletedProcess[str]:
    dev = tmp_path / "dev"
    dev.mkdir(exist_ok=True)
    (dev / "nvidiactl").touch()
    for i in range(gpus):
        (dev / f"nvidia{i}").touch()
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers = gpu: a GPU test\n")
    (tmp_path / "test_g.py").write_text(TEST)
    wheels = tmp_path / "no-wheels"
    wheels.mkdir(exist_ok=True)
    environ = {k: v for k, v in os.environ.items() if k != "VERL_ENV_SELFTEST_PYTHON"}
    environ.update(PYTHONPATH=str(REPO), VERL_ENV_HOST_DEV=str(dev), PIP_NO_INDEX="1",
                   PIP_FIND_LINKS=str(wheels), XDG_CACHE_HOME=str(tmp_path / "cache"), **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                           str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=environ)


def test_a_gpu_host_without_a_cuda_torch_fails_the_gpu_tests(tmp_path: Path) -> None:
    proc = run(tmp_path, gpus=2)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 passed, 1 error" in proc.stdout, proc.stdout  # the GPU test's setup errs
    assert ("this host has 2 GPU(s) but no python with a CUDA torch for the GPU tests "
            "(VERL_ENV_SELFTEST_PYTHON unset): could not build the host test venv gpuenv-"
            in proc.stdout), proc.stdout


def test_a_gpu_host_runs_the_gpu_tests_with_the_cuda_venv(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cached CUDA venv (here a stand-in python that reports CUDA 13.0) is the one used."""
    cache = tmp_path / "cache" / "verl-env"
    # the cache key as the session computes it: same interpreter, no local CPU torch wheel
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-wheels"))
    name = hostenv.venv_dir("gpuenv", hostenv.gpu_requirements()).name
    python = cache / name / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\necho 13.0\n")
    python.chmod(0o755)
    (cache / name / ".complete").write_text("stand-in")
    proc = run(tmp_path, gpus=1)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"python: {python}" in proc.stdout, proc.stdout


def test_a_host_without_a_gpu_or_with_a_python_given_is_left_alone(tmp_path: Path) -> None:
    proc = run(tmp_path, gpus=0)
    assert proc.returncode == 0 and "python: None" in proc.stdout, proc.stdout
    proc = run(tmp_path, gpus=1, VERL_ENV_SELFTEST_PYTHON="/opt/cuda-venv/bin/python")
    assert proc.returncode == 0 and "python: /opt/cuda-venv/bin/python" in proc.stdout
