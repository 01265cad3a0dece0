"""A cached host virtualenv with real torch (CPU), tensordict and Ray, for tests that run the
self-test or start Ray on this machine (no container).

torch comes from the CPU wheel that this kind of machine keeps in PIP_FIND_LINKS (/opt/wheels);
the rest from the package index. The venv is built once per content key and reused; a file lock
makes concurrent test sessions wait for each other instead of racing.

On a host with a GPU, :func:`gpu_hostenv` makes the same venv with the index's CUDA torch (the
Linux wheels on the package index are CUDA builds) for the GPU tests.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

PACKAGES = ["tensordict==0.10.0", "ray[default]==2.60.0", "packaging"]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "verl-env"


class NoTorchWheel(RuntimeError):
    """This machine keeps no CPU torch wheel for this python (the venv is not attempted)."""


def find_torch_wheel() -> Path | None:
    """The local CPU torch wheel for this interpreter, if the machine has one."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    dirs = [d for d in os.environ.get("PIP_FIND_LINKS", "/opt/wheels").split() if os.path.isdir(d)]
    for d in dirs:
        hits = sorted(glob.glob(os.path.join(d, f"torch-*+cpu-{tag}-{tag}-*.whl")))
        if hits:
            return Path(hits[-1])
    return None


def hostenv() -> Path:
    """Return the venv's python, building the venv on first use. Raises RuntimeError with the
    reason when it cannot be built (:class:`NoTorchWheel`: no local torch wheel; else the build
    failed, e.g. the index is unreachable)."""
    wheel = find_torch_wheel()
    if wheel is None:
        raise NoTorchWheel("no local CPU torch wheel for this python in PIP_FIND_LINKS")
    return _venv("hostenv", [str(wheel), *PACKAGES])


def gpu_hostenv() -> Path:
    """The python of a cached venv with the index's CUDA torch at the CPU wheel's version (the
    latest when this machine keeps none), tensordict and Ray, for the GPU tests on a host that
    has a GPU. Raises RuntimeError with the reason when it cannot be built."""
    python = _venv("gpuenv", gpu_requirements(), isolated=True)
    proc = subprocess.run([str(python), "-c", "import torch; print(torch.version.cuda or '')"],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"{python}: its torch is not a CUDA build ({proc.stderr.strip()[-300:]}"
                           f"); set VERL_ENV_SELFTEST_PYTHON to a python with a CUDA torch")
    return python


def gpu_requirements() -> list[str]:
    """What :func:`gpu_hostenv` installs."""
    wheel = find_torch_wheel()
    torch = f"torch=={wheel.name.split('-')[1].split('+')[0]}" if wheel else "torch"
    return [torch, *PACKAGES]


def venv_dir(prefix: str, requirements: list[str]) -> Path:
    """Where the venv of ``requirements`` is cached (one directory per content key)."""
    key = hashlib.sha256("\n".join([sys.version, *requirements]).encode()).hexdigest()[:12]
    return CACHE / f"{prefix}-{key}"


def cached_venv(venv: Path, what: str,
                make: Callable[[Path], subprocess.CompletedProcess[str]]) -> Path:
    """``venv``'s python, made once by ``make(venv)`` under a lock beside it (concurrent
    sessions wait); a failed ``make`` leaves nothing and raises RuntimeError naming ``what``."""
    python = venv / "bin" / "python"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / ".complete").exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)
        proc = make(venv)
        if proc.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            raise RuntimeError(f"could not build {what}: {proc.stderr[-2000:]}")
        (venv / ".complete").write_text(venv.name.rsplit("-", 1)[1])
    return python


def _venv(prefix: str, requirements: list[str], isolated: bool = False) -> Path:
    """A venv under CACHE holding ``requirements``, made once per content key (under a lock).
    ``isolated``: pip reads no config file and no PIP_FIND_LINKS (a local CPU wheel must not
    stand in for the index's); an index given by PIP_INDEX_URL is still used."""
    def make(venv: Path) -> subprocess.CompletedProcess[str]:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        env = dict(os.environ)
        if isolated:
            env.pop("PIP_FIND_LINKS", None)
            env["PIP_CONFIG_FILE"] = os.devnull
        return subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                               *requirements], capture_output=True, text=True, env=env)

    venv = venv_dir(prefix, requirements)
    return cached_venv(venv, f"the host test venv {venv.name}", make)
