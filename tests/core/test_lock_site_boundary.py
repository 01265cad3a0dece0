"""Nothing outside a site is written (issue 29, item 2).

The installed `build-env` run from an empty directory: every subcommand, with the arguments that
would write (a lock, the snapshot, a proposal applied, a site), leaves every file of the
installed package as it was; the commands that write into a site refuse with "no site here: run
build-env init" and exit 2, before any work (no resolution, no network: the index they would ask
refuses every connection). Read-only commands still read the shipped reference.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import installed_build_env, run_build_env

NO_SITE = "no site here: run build-env init"


def _package() -> Path:
    venv = installed_build_env().parent.parent
    return next(venv.glob("lib/python3*/site-packages")) / "builder"


def _digest(root: Path) -> dict[str, str]:
    """Every file of the package but byte code (Python writes that on first import)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A local port nothing listens on: an index or engine there refuses at once."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    yield port


def _env(port: int) -> dict[str, str]:
    index = f"http://127.0.0.1:{port}/simple"
    return {"VERL_ENV_INDEX_URL": index, "UV_DEFAULT_INDEX": index, "PIP_INDEX_URL": index,
            "UV_OFFLINE": "1", "VERL_ENV_NETWORK_TIMEOUT": "5",
            "DOCKER_HOST": f"tcp://127.0.0.1:{port}"}


def _writing(reference: Path, tmp: Path) -> list[list[str]]:
    """Commands that write into a site; each must refuse outside one."""
    ref = str(reference / "matrix.yaml")
    return [["lock", "--target", "rocm-mi300", "--upgrade"], ["lock"],
            ["lock", "--target", "cuda-x86_64", "--matrix", ref],
            ["check", "--online"], ["check", "--online", "--matrix", ref],
            ["propose", "--apply", str(tmp / "proposal")],
            ["propose", "--apply", str(tmp / "proposal"), "--matrix", ref]]


def _others(tmp: Path) -> list[list[str]]:
    """Every other subcommand, with what would write where it can: they may fail (no engine,
    no registry, no cluster here) but never by touching the package."""
    return [["list"], ["check"], ["check", "--locked"],
            ["render", "--target", "cuda-x86_64", "--no-fetch", "--output", str(tmp / "ctx")],
            ["build", "--target", "cuda-x86_64", "--print"],
            ["build", "--target", "cuda-x86_64", "--workdir", str(tmp / "work")],
            ["propose", "--target", "cuda-x86_64", "--no-lock", "--output", str(tmp / "prop")],
            ["verify", "verl-env:cuda-x86_64"], ["sif", "--target", "cuda-x86_64"],
            ["sqsh", "--target", "cuda-x86_64"],
            ["publish", "--target", "cuda-x86_64", "--registry", "127.0.0.1:1/x"],
            ["slurm", "--help"], ["doctor", "--target", "cuda-x86_64"],
            ["trust", "keygen", str(tmp / "keys")], ["cluster", "--help"],
            ["status", str(tmp / "none.sif"), "--key", str(tmp / "none.pub")],
            ["completion", "bash"]]


def test_no_command_writes_the_installed_package_and_site_writers_refuse(
        tmp_path: Path, closed_port: int) -> None:
    package = _package()
    before = _digest(package)
    assert "reference/locks/rocm-mi300.txt" in before
    empty = tmp_path / "empty"
    empty.mkdir()
    env = _env(closed_port)
    for args in _writing(package / "reference", tmp_path):
        proc = run_build_env(*args, cwd=empty, env=env, timeout=300)
        assert proc.returncode == 2, f"{args}: {proc.returncode}\n{proc.stdout}{proc.stderr}"
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and NO_SITE in errors[0], f"{args}: {proc.stderr}"
        assert list(empty.iterdir()) == [], f"{args} wrote {list(empty.iterdir())}"
    for args in _others(tmp_path):
        proc = run_build_env(*args, cwd=empty, env=env, timeout=300)
        assert "Traceback" not in proc.stderr, f"{args}: {proc.stderr}"
    assert _digest(package) == before, "a command changed the installed package"


@pytest.mark.parametrize("name", ["", " "])
def test_init_with_an_empty_directory_name_writes_nothing(tmp_path: Path, name: str) -> None:
    proc = run_build_env("init", name, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "DIR is empty" in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []
    proc = run_build_env("init", ".", cwd=tmp_path)  # named on purpose: the working directory
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "matrix.yaml").is_file()
