"""tests/support/cpuacct.py: a group's CPU charged test by test from a cgroup of its own (the
processes a test starts included), and scripts/slowest.py writing the costliest beside the
slowest. The figures are measurements for docs/testing.md; what is asserted here is that the
accounting counts what ran, not how fast anything is."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import cpuacct

REPO = Path(__file__).resolve().parents[2]

CHILD_CONFTEST = """
from tests.support import cpuacct

def pytest_configure(config):
    cpuacct.configure(config)
"""

CHILD_TESTS = """
import os, subprocess, sys

BURN = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1.0: pass"

def test_burns_a_second_in_a_child():
    subprocess.run([sys.executable, "-c", BURN], check=True)

def test_idles():
    import time
    time.sleep(0.3)

def test_the_parent_is_exported():
    assert os.environ["VERL_ENV_TEST_CGROUP_PARENT"].endswith("/docker")
"""


def _slowest():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("slowest", REPO / "scripts" / "slowest.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_child_process_cpu_is_charged_to_its_test(tmp_path: Path) -> None:
    if os.geteuid() != 0 or cpuacct._hierarchy() is None:
        pytest.skip("no cgroup can be made here (not root, or no cpuacct hierarchy)")
    (tmp_path / "conftest.py").write_text(CHILD_CONFTEST)
    (tmp_path / "test_child.py").write_text(CHILD_TESTS)
    out = tmp_path / "cpu"
    env = {**os.environ, "PYTHONPATH": str(REPO), cpuacct.CPU_ENV: str(out)}
    env.pop(cpuacct.PARENT_ENV, None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"--basetemp={tmp_path / 'bt' / 'mygroup'}", "test_child.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((out / "mygroup.json").read_text())
    assert data["group"] == "mygroup" and data["cgroup"].startswith("/verl-env-test/mygroup-")
    calls = {r["nodeid"].split("::")[1]: r for r in data["tests"] if r["when"] == "call"}
    # the child's second of CPU is the test's (its own process counted nothing of it)
    assert calls["test_burns_a_second_in_a_child"]["cpu_s"] >= 0.9, data
    assert calls.get("test_idles", {"cpu_s": 0})["cpu_s"] < 0.5, data
    assert data["cpu_s"] >= calls["test_burns_a_second_in_a_child"]["cpu_s"]
    # the group's cgroup is gone with the session, in every hierarchy
    found = cpuacct._hierarchy()
    assert found is not None
    assert not (found[0] / data["cgroup"].lstrip("/")).exists()


def test_slowest_writes_the_costliest_beside_the_slowest(tmp_path: Path) -> None:
    slowest = _slowest()
    rows = [{"nodeid": f"t.py::t{i}", "when": "call", "cpu_s": float(i), "wall_s": 2.0 * i}
            for i in range(20)]
    (tmp_path / "main.json").write_text(json.dumps({"group": "main", "cpu_s": 190.0,
                                                    "wall_s": 400.0, "tests": rows}))
    log = "===== slowest 15 durations =====\n3.00s call     t.py::t3\n===== 1 passed in 4.00s ====="
    text = slowest.render([("main", log), ("core", log)], "abc1234", tmp_path)
    section = text.split("**core**")[0]
    assert "CPU: 190 s in 400 s of wall" in section
    costly = [ln for ln in section.splitlines() if "cpu-s" in ln]
    assert len(costly) == 15 and costly[0].split()[0] == "19.0" and costly[-1].endswith("t.py::t5")
    assert "(no CPU figures for this group" in text.split("**core**")[1]
    assert "cpu-s" not in slowest.render([("main", log)], "abc1234")  # no --cpu: as before
