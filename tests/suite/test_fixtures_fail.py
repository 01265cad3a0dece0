"""A fixture that sets up a real part and fails is an error of the tests that need it, never
a skip: a broken environment cannot hide behind a green run.

Each case is a real pytest session in a directory of its own, using the suite's own fixture
(imported from tests/conftest.py, tests/selftest/conftest.py) with its real part broken.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, conftest: str, test: str, env: dict[str, str]
        ) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_part.py").write_text(test)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(REPO), **env})


def outcome(stdout: str) -> str:
    return stdout.strip().splitlines()[-1]


def test_a_failing_debian_base_is_an_error_not_a_skip(tmp_path: Path) -> None:
    """``scripts/debian-base.sh`` failing (here: debootstrap asked for a suite that does not
    exist, with an empty tarball cache; the engine socket is not there either) errors."""
    conftest = ("import pytest\nfrom tests.conftest import debian_base  # noqa: F401\n\n"
                "@pytest.fixture(scope='session')\ndef docker_host():\n"
                f"    return 'unix://{tmp_path}/no-engine.sock'\n")
    test = "def test_needs_the_base(debian_base):\n    pass\n"
    proc = run(tmp_path, conftest, test, {"DEBIAN_SUITE": "verl-env-no-such-suite",
                                          "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.fullmatch(r"=* ?1 error in .*", outcome(proc.stdout)), proc.stdout
    assert "no debootstrap base image: debian-base.sh failed" in proc.stdout


def test_a_failing_host_venv_is_an_error_not_a_skip(tmp_path: Path) -> None:
    """The host venv of the real CPU self-test tests failing to build (here: the local torch
    wheel is not a wheel) errors; only a machine with no torch wheel skips."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    (wheels / f"torch-2.13.0+cpu-{tag}-{tag}-manylinux_2_28_x86_64.whl").write_text("no zip")
    conftest = "from tests.selftest.conftest import hostpy  # noqa: F401\n"
    test = "def test_needs_the_venv(hostpy):\n    pass\n"
    env = {"PIP_FIND_LINKS": str(wheels), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}
    proc = run(tmp_path, conftest, test, env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.fullmatch(r"=* ?1 error in .*", outcome(proc.stdout)), proc.stdout
    assert "host venv failed to build: could not build the host test venv" in proc.stdout
    # the control: no torch wheel at all is an absent part, a visible skip
    (wheels / f"torch-2.13.0+cpu-{tag}-{tag}-manylinux_2_28_x86_64.whl").unlink()
    proc = run(tmp_path, conftest, test, env)
    assert proc.returncode == 0 and "1 skipped" in outcome(proc.stdout), proc.stdout
    assert "host venv unavailable: no local CPU torch wheel" in proc.stdout
