"""A cached host virtualenv with real torch (CPU), tensordict and Ray, for tests that run the
self-test or start Ray on this machine (no container).

torch comes from the CPU wheel that this kind of machine keeps in PIP_FIND_LINKS (/opt/wheels);
the rest from the package index. The venv is built once per content key and reused; a file lock
makes concurrent test sessions wait for each other instead of racing.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGES = ["tensordict==0.10.0", "ray[default]==2.60.0", "packaging"]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "verl-env"


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
    reason when it cannot be built (no local torch wheel, index unreachable)."""
    wheel = find_torch_wheel()
    if wheel is None:
        raise RuntimeError("no local CPU torch wheel for this python in PIP_FIND_LINKS")
    key = hashlib.sha256("\n".join([sys.version, str(wheel), *PACKAGES]).encode()).hexdigest()[:12]
    venv = CACHE / f"hostenv-{key}"
    python = venv / "bin" / "python"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"hostenv-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / ".complete").exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        proc = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", str(wheel), *PACKAGES],
            capture_output=True, text=True,
        )
        if proc.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            raise RuntimeError(f"could not build the host test venv: {proc.stderr[-2000:]}")
        (venv / ".complete").write_text(key)
    return python
