"""Cached host virtualenvs with the real verl 0.9.1, for tests that run verl's own code on this
machine (no container): the train check's checker, tests/support/tiny_verl.py.

Two kinds, both from the CPU fixture's lock (tests/fixtures/locks/cpu-x86_64.txt, hashes
required; torch is the CPU wheel in PIP_FIND_LINKS):

- ``core``: exactly the lock, i.e. what the CPU fixture image holds: verl with the four packages
  of its ``[verl-core]`` extra that main_ppo imports at start (:data:`CORE_ONLY`; the CUDA
  images get the whole extra through ``verl[vllm]``);
- ``plain``: the same without those four: verl 0.9.1 pinned without its extra (a hard-linked
  copy of ``core`` less the four, :func:`_plain_from`).

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


def _install(uv: str, python: Path) -> subprocess.CompletedProcess[str]:
    links = os.environ.get("PIP_FIND_LINKS", "/opt/wheels").split()
    find = [a for d in links if os.path.isdir(d) for a in ("--find-links", d)]
    # bytecode compiled once here: every process that imports verl (torch, transformers) would
    # otherwise compile them again where PYTHONDONTWRITEBYTECODE is set (about 15 CPU-s each)
    return subprocess.run([uv, "pip", "install", "-q", "--compile-bytecode", "--python",
                           str(python), *find,
                           "--require-hashes", "-r", str(LOCK)], capture_output=True, text=True)


def _plain_from(core: Path, venv: Path, uv: str) -> subprocess.CompletedProcess[str]:
    """``venv`` as a hard-linked copy of the finished ``core`` venv less :data:`CORE_ONLY`: the
    same files without installing and byte-compiling the lock a second time (35 CPU-s on
    a fresh machine). The copy's scripts are rewritten to name its own interpreter (a rewrite
    breaks the link, so ``core`` keeps its own); a compiled module names its source where it is
    imported from, so the shared ``.pyc`` files serve both."""
    copied = subprocess.run(["cp", "-al", str(core), str(venv)], capture_output=True, text=True)
    if copied.returncode:
        return copied
    # core's marker, linked: cached_venv writes the copy's own, and must not write through it
    (venv / ".complete").unlink(missing_ok=True)
    old, new = f"#!{core}/bin/".encode(), f"#!{venv}/bin/".encode()
    for script in (venv / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        if data.startswith(old):
            mode = script.stat().st_mode
            script.unlink()  # a new file, not a write through the link into core's
            script.write_bytes(new + data[len(old):])
            script.chmod(mode)
    return subprocess.run([uv, "pip", "uninstall", "-q", "--python", str(venv / "bin" / "python"),
                           *CORE_ONLY], capture_output=True, text=True)


def verl_hostenv(kind: str = "core") -> Path:
    """The venv's python, building it on first use. RuntimeError with the reason when it
    cannot be built (no local torch wheel, index unreachable)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    uv = find_uv_bin()
    key = hashlib.sha256("\n".join([sys.version, kind, "bytecode", *CORE_ONLY, LOCK.read_text()])
                         .encode()).hexdigest()

    def make(venv: Path) -> subprocess.CompletedProcess[str]:
        if kind == "plain":
            return _plain_from(verl_hostenv("core").parent.parent, venv, uv)
        made = subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)],
                              capture_output=True, text=True)
        return made if made.returncode else _install(uv, venv / "bin" / "python")

    return cached_venv(CACHE / f"verlenv-{kind}-{key[:12]}", f"the {kind} verl venv", make)
