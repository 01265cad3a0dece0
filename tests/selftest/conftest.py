"""Fixtures for the self-test's tests.

Real runs use the host venv (CPU torch, tensordict, Ray) from ``tests/support/hostenv.py``
and import the package the way an image does: ``verl_env_selftest`` on PYTHONPATH, here a
temp dir holding a symlink to ``builder/selftest``. A machine without the CPU torch wheel skips
them visibly; a host venv that fails to build is an error of each, never a skip.

The GPU tests (``-m gpu``, ``test_gpu.py``) use ``$VERL_ENV_SELFTEST_PYTHON``. On a host that
shows a GPU and leaves it unset, they get a venv with the index's CUDA torch
(:func:`tests.support.hostenv.gpu_hostenv`), never the CPU host venv, whose torch sees no GPU;
when that venv cannot be made, they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.support import hostenv as hostenv_mod
from tests.support.skips import host_gpus

from .helpers import PACKAGE, Result, clean_env

GPU_PYTHON = "VERL_ENV_SELFTEST_PYTHON"
_GPU_VENV: list[str] = []  # the GPU venv's python, or the reason it could not be made


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before a GPU test's fixtures, on a host with a GPU: ``$VERL_ENV_SELFTEST_PYTHON`` names
    a python with a CUDA torch (made once per session when unset)."""
    if item.get_closest_marker("gpu") is None or os.environ.get(GPU_PYTHON) or not host_gpus():
        return
    if not _GPU_VENV:
        try:
            _GPU_VENV.append(str(hostenv_mod.gpu_hostenv()))
        except Exception as exc:  # noqa: BLE001 - any failure fails the GPU tests, by name
            _GPU_VENV.append(f"error: {exc}")
    if _GPU_VENV[0].startswith("error: "):
        pytest.fail(f"this host has {host_gpus()} GPU(s) but no python with a CUDA torch for "
                    f"the GPU tests ({GPU_PYTHON} unset): {_GPU_VENV[0][7:]}", pytrace=False)
    os.environ[GPU_PYTHON] = _GPU_VENV[0]


@pytest.fixture(scope="session")
def hostpy() -> str:
    """Python of the cached host venv (real CPU torch 2.13, tensordict 0.10.0, Ray 2.60)."""
    try:
        return str(hostenv_mod.hostenv())
    except hostenv_mod.NoTorchWheel as e:  # absent here: skip visibly (test.sh fails on it)
        pytest.skip(f"host venv unavailable: {e}")
    except Exception as e:  # noqa: BLE001 - present but broken: an error, never a skip
        failed = str(e)
    pytest.fail(f"host venv failed to build: {failed}", pytrace=False)


@pytest.fixture(scope="session")
def st_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PYTHONPATH dir where ``verl_env_selftest`` → builder/selftest (as in an image)."""
    d = tmp_path_factory.mktemp("st-path")
    (d / "verl_env_selftest").symlink_to(PACKAGE)
    return d


@pytest.fixture(scope="session")
def installed(hostpy: str) -> dict[str, str]:
    """Installed versions in the host venv."""
    code = ("import importlib.metadata as m, json;"
            "print(json.dumps({n: m.version(n) for n in ['torch','tensordict','ray']}))")
    return json.loads(subprocess.run([hostpy, "-c", code], check=True, capture_output=True,
                                     text=True).stdout)


RunSelftest = Callable[..., Result]


def runner_for(python: str, st_path: Path, tmp_path: Path) -> RunSelftest:
    """A function running ``python -m verl_env_selftest ARGS``; returns a Result."""

    def run(*args: str, manifest: dict[str, Any], env: dict[str, str] | None = None,
            timeout: float = 150, prefix: list[str] | None = None) -> Result:
        mpath = tmp_path / "manifest.json"
        mpath.write_text(json.dumps(manifest))
        report = tmp_path / "report.json"
        report.unlink(missing_ok=True)
        cmd = (prefix or [python, "-m"]) + ["verl_env_selftest", "--manifest", str(mpath),
                                            "--json", str(report), *args]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=clean_env(PYTHONPATH=str(st_path), **(env or {})),
                              cwd=tmp_path)
        data = json.loads(report.read_text()) if report.exists() else None
        return Result(proc.returncode, proc.stdout, proc.stderr, data, time.monotonic() - t0)

    return run


@pytest.fixture
def selftest(hostpy: str, st_path: Path, tmp_path: Path) -> RunSelftest:
    """Run the self-test with the host venv."""
    return runner_for(hostpy, st_path, tmp_path)
