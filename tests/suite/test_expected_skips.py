"""The suite's own honesty: a run's skips are held against tests/expected-skips.txt.

Each run here is a real pytest session in a directory of its own, with the checker wired in
exactly as ``tests/conftest.py`` wires it (``--expected-skips FILE``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import skips

REPO = Path(__file__).resolve().parents[2]
CONFTEST = """
from tests.support import skips

def pytest_addoption(parser):
    skips.add_option(parser)

def pytest_configure(config):
    skips.configure(config)
"""
TESTS = """
import pytest

def test_runs():
    pass

def test_skipped_inside():
    pytest.skip("no frobnicator here")

@pytest.mark.skipif(True, reason="not on this kernel")
def test_skipped_by_mark():
    pass

@pytest.mark.xfail(reason="known bug")
def test_xfail():
    assert False
"""


def run(tmp_path: Path, expected: str | None, tests: str = TESTS,
        extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_a.py").write_text(tests)
    for name, text in (extra or {}).items():
        (tmp_path / name).write_text(text)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    if expected is not None:
        (tmp_path / "expected.txt").write_text(expected)
        args += ["--expected-skips", str(tmp_path / "expected.txt")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=300)


def test_an_unexpected_skip_fails_the_run_naming_it(tmp_path: Path) -> None:
    proc = run(tmp_path, "always | test_a.py::test_skipped_inside | ^no frobnicator here$\n")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ("unexpected skip: test_a.py::test_skipped_by_mark: not on this kernel"
            in proc.stdout), proc.stdout
    named = [line for line in proc.stdout.splitlines() if line.startswith("unexpected skip:")]
    assert len(named) == 1, proc.stdout  # not the expected one, and an xfail is no skip
    assert f"1 skip(s) not in {tmp_path / 'expected.txt'}" in proc.stdout


def test_expected_skips_pass(tmp_path: Path) -> None:
    proc = run(tmp_path, "# reviewed\n"
                         "always | test_a.py::test_skipped_* | ^no frobnicator here$\n"
                         "always | test_a.py::test_skipped_by_mark | kernel\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "unexpected skip" not in proc.stdout
    assert "2 skipped" in proc.stdout


def test_the_reason_must_match_not_only_the_test(tmp_path: Path) -> None:
    proc = run(tmp_path, "always | test_a.py::* | ^no frobnicator here$\n")
    assert proc.returncode == 1
    assert "unexpected skip: test_a.py::test_skipped_by_mark: not on this kernel" in proc.stdout


def test_without_the_option_skips_pass_as_before(tmp_path: Path) -> None:
    proc = run(tmp_path, None)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_module_skipped_at_collection_is_a_skip_too(tmp_path: Path) -> None:
    module = "import pytest\npytest.importorskip('verl_env_no_such_module')\n"
    proc = run(tmp_path, "always | test_a.py::* | .\n", extra={"test_b.py": module})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "unexpected skip: test_b.py: could not import 'verl_env_no_such_module'" in proc.stdout


def test_a_run_that_collects_only_skips_fails(tmp_path: Path) -> None:
    proc = run(tmp_path, "always | nothing | x\n", tests="import pytest\n\n"
               "def test_x():\n    pytest.skip('gone')\n")
    assert proc.returncode == 1 and "unexpected skip: test_a.py::test_x: gone" in proc.stdout


def test_a_failed_run_keeps_its_exit_status(tmp_path: Path) -> None:
    proc = run(tmp_path, "always | x | y\n", tests="def test_x():\n    assert False\n")
    assert proc.returncode == 1 and "1 failed" in proc.stdout


@pytest.mark.parametrize("line, says", [
    ("always | tests/x.py::*\n", "want 'WHEN | TEST | REASON'"),
    ("sometimes | tests/x.py::* | y\n", "unknown WHEN 'sometimes'"),
    ("always | tests/x.py::* | (\n", "REASON is not a regular expression"),
])
def test_a_bad_list_is_a_usage_error_naming_file_and_line(tmp_path: Path, line: str,
                                                          says: str) -> None:
    proc = run(tmp_path, "# header\n" + line)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert f"{tmp_path / 'expected.txt'}:2: {says}" in proc.stderr, proc.stderr


def test_the_reviewed_list_parses_and_names_only_gpu_apptainer_and_the_fallback() -> None:
    entries = skips.parse(REPO / "tests" / "expected-skips.txt")
    assert {e.test.split("::")[0] for e in entries} == {
        "tests/selftest/test_gpu.py", "tests/sif/test_apptainer_backend.py",
        "tests/pipeline/test_arm64.py", "tests/multiarch/test_index_publish.py"}
    gpu = [e for e in entries if e.test.startswith("tests/selftest/test_gpu.py")]
    assert {e.when for e in gpu} == {"no-gpu", "fewer-than-2-gpus"}
    reason = "torch.cuda.is_available() is false for /x/bin/python (no GPU here)"
    assert any(e.covers("tests/selftest/test_gpu.py::test_gpu_phase", reason) for e in gpu)


def test_an_entry_covers_nothing_where_its_condition_does_not_hold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a host with a GPU the GPU entries are void: a GPU test that skips fails the run."""
    path = tmp_path / "expected.txt"
    path.write_text("no-gpu | t.py::* | no GPU\nalways | t.py::test_b | other\n")
    entries = skips.parse(path)
    found = [skips.Skip("t.py::test_a", "no GPU here"), skips.Skip("t.py::test_b", "other")]
    monkeypatch.setitem(skips.CONDITIONS, "no-gpu", lambda: True)
    assert skips.unexpected(found, skips.holding(entries)) == []
    monkeypatch.setitem(skips.CONDITIONS, "no-gpu", lambda: False)
    assert skips.unexpected(found, skips.holding(entries)) == found[:1]


def test_host_gpus_counts_device_nodes(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-modeset"):
        (dev / name).touch()
    assert skips.host_gpus(dev) == 0
    (dev / "nvidia0").touch()
    (dev / "nvidia1").touch()
    assert skips.host_gpus(dev) == 2
    amd = tmp_path / "amd"
    (amd / "dri").mkdir(parents=True)
    (amd / "dri" / "renderD128").touch()
    (amd / "dri" / "card0").touch()
    assert skips.host_gpus(amd) == 0  # render nodes without the compute driver
    (amd / "kfd").touch()
    assert skips.host_gpus(amd) == 1
    assert skips.host_gpus(tmp_path / "absent") == 0
