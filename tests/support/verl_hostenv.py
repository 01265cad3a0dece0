"""Cached host virtualenvs with the real verl 0.9.1, for tests that run verl's own code on this
machine (no container): the train check's checker, tests/support/tiny_verl.py.

Two kinds, both from the CPU fixture's lock (tests/fixtures/locks/cpu-x86_64.txt, hashes
required; torch is the CPU wheel in PIP_FIND_LINKS):

- ``core``: exactly the lock, i.e. what the CPU fixture image holds: verl with the four packages
  of its ``[verl-core]`` extra that main_ppo imports at start (:data:`CORE_ONLY`; the CUDA
  images get the whole extra through ``verl[vllm]``);
- ``plain``: the same without those four: verl 0.9.1 pinned without its extra.

Each venv is built once per content key and reused; a file lock makes concurrent sessions wait.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from uv import find_uv_bin

from tests.support.hostenv import CACHE, cached_venv

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "tests" / "fixtures" / "locks" / "cpu-x86_64.txt"
KINDS = ("plain", "core")


# what verl 0.9.1's [verl-core] extra adds that main_ppo imports when it starts
CORE_ONLY = ("transferqueue", "cachetools", "fastapi", "uvicorn")


def _install(uv: str, python: Path, kind: str) -> subprocess.CompletedProcess[str]:
    links = os.environ.get("PIP_FIND_LINKS", "/opt/wheels").split()
    find = [a for d in links if os.path.isdir(d) for a in ("--find-links", d)]
    # bytecode compiled once here: every process that imports verl (torch, transformers) would
    # otherwise compile them again where PYTHONDONTWRITEBYTECODE is set (about 15 CPU-s each)
    proc = subprocess.run([uv, "pip", "install", "-q", "--compile-bytecode", "--python",
                           str(python), *find,
                           "--require-hashes", "-r", str(LOCK)], capture_output=True, text=True)
    if proc.returncode or kind == "core":
        return proc
    return subprocess.run([uv, "pip", "uninstall", "-q", "--python", str(python), *CORE_ONLY],
                          capture_output=True, text=True)


def verl_hostenv(kind: str = "core") -> Path:
    """The venv's python, building it on first use. RuntimeError with the reason when it
    cannot be built (no local torch wheel, index unreachable)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    uv = find_uv_bin()
    key = hashlib.sha256("\n".join([sys.version, kind, "bytecode", *CORE_ONLY, LOCK.read_text()])
                         .encode()).hexdigest()

    def make(venv: Path) -> subprocess.CompletedProcess[str]:
        made = subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)],
                              capture_output=True, text=True)
        return made if made.returncode else _install(uv, venv / "bin" / "python", kind)

    return cached_venv(CACHE / f"verlenv-{kind}-{key[:12]}", f"the {kind} verl venv", make)
