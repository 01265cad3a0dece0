"""Forked CPU ranks (builder/selftest/launch/forked.py): what ``spawn_local`` asks of a
``subprocess.Popen``, on real forked children of this test process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder.selftest.launch.forked import ForkedRank
from builder.selftest.launch.ranks import spawn_local


def ok(argv: list[str]) -> int:
    print("rank args", argv, os.environ.get("RANK_ENV"))
    Path(argv[0]).write_text(str(os.getpid()))
    return int(argv[1])


def raises(argv: list[str]) -> int:
    raise RuntimeError("rank blew up")


def exits(argv: list[str]) -> int:
    sys.exit(7)


def sleeps(argv: list[str]) -> int:
    time.sleep(60)
    return 0


def test_the_child_runs_main_with_its_own_environment_and_log(tmp_path: Path) -> None:
    out, log = tmp_path / "out", tmp_path / "rank0.log"
    child = ForkedRank(ok, [str(out), "3"], str(log), {"RANK_ENV": "given"})
    assert child.wait(timeout=30) == 3 and child.returncode == 3 and child.poll() == 3
    assert int(out.read_text()) == child.pid != os.getpid()
    assert "rank args" in log.read_text() and "given" in log.read_text()
    assert os.environ.get("RANK_ENV") is None  # the parent's environment is untouched


@pytest.mark.parametrize("main, code, text", [(raises, 1, "RuntimeError: rank blew up"),
                                              (exits, 7, "")])
def test_an_exception_or_exit_is_the_childs_exit_code(tmp_path: Path, main, code: int,
                                                      text: str) -> None:
    log = tmp_path / "rank.log"
    assert ForkedRank(main, [], str(log), dict(os.environ)).wait(timeout=30) == code
    assert text in log.read_text()


def test_a_hung_child_times_out_and_is_killed(tmp_path: Path) -> None:
    child = ForkedRank(sleeps, [], str(tmp_path / "rank.log"), dict(os.environ))
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    child.kill()
    assert child.wait() == -9
    child.kill()  # reaped already: nothing to signal, no error


def test_spawn_local_reports_a_forked_rank_that_fails_to_start(tmp_path: Path) -> None:
    """A rank whose backend cannot start (no torch in this interpreter, or a bad backend for
    it) is judged as a spawned one: no result, its exit code and log tail kept."""
    res = spawn_local("gloo", 1, ["cpu"], 64, 0, iters=1, warmup=0, timeout=30,
                      workdir=str(tmp_path), fork=True, env_extra={"VERL_ENV_SELFTEST_FAULT": ""})
    if res.results[0] is not None:  # this interpreter has torch: the rank really ran
        assert res.rcs == [0] and res.results[0]["wrong"] == 0
    else:
        assert res.rcs[0] not in (0, None) and res.tails[0]
