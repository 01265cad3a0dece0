"""Fixtures for the self-test's tests.

Real runs use the host venv (CPU torch, tensordict, Ray) from ``tests/support/hostenv.py``
and import the package the way an image does: ``verl_env_selftest`` on PYTHONPATH, here a
temp dir holding a symlink to ``builder/selftest``.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from .helpers import PACKAGE, Result, clean_env


@pytest.fixture(scope="session")
def hostpy() -> str:
    """Python of the cached host venv (real CPU torch 2.13, tensordict 0.10.0, Ray 2.60)."""
    from tests.support.hostenv import hostenv

    try:
        return str(hostenv())
    except Exception as e:  # noqa: BLE001 - no wheel / no index here: skip visibly
        pytest.skip(f"host venv unavailable: {e}")


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
