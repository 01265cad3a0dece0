"""The exit-code contract of docs/commands.md, held for each command through the installed
``build-env``: 0 pass, 1 a gate or check failed, 2 bad input, 3 an infrastructure or network
error, 130 Ctrl-C, 143 SIGTERM, 141 (and silence) when the reader of stdout goes away; no
traceback for any bad input; an unknown command named with the nearest real one."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.commands import BY_NAME
from tests.conftest import OUTSIDE, installed_build_env, run_build_env

COMMANDS = sorted(BY_NAME)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_exits_2_for_an_unknown_option_and_0_for_help(command: str) -> None:
    bad = run_build_env(command, "--no-such-option", timeout=120)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "error:" in bad.stderr and "Traceback" not in bad.stderr
    helped = run_build_env(command, "--help", timeout=120)
    assert helped.returncode == 0 and "usage: build-env" in helped.stdout, helped.stderr


def test_an_unknown_command_is_named_with_the_nearest_real_one() -> None:
    proc = run_build_env("chekc", timeout=120)
    assert proc.returncode == 2
    assert "unknown command 'chekc'" in proc.stderr and "build-env check" in proc.stderr
    assert "--target --all is required" not in proc.stderr  # not read as `build` options
    far = run_build_env("zzzzzz", timeout=120)
    assert far.returncode == 2 and "unknown command 'zzzzzz'" in far.stderr
    assert "did you mean" not in far.stderr


def test_options_first_is_still_the_build() -> None:
    proc = run_build_env("--target", "no-such-target", timeout=120)
    assert proc.returncode == 2 and "unknown target 'no-such-target'" in proc.stderr, proc.stderr


# (argv, what stderr names): an empty argument names nothing, refused before anything runs
EMPTY = [
    (["verify", ""], "IMAGE_OR_SIF is empty"),
    (["verify", "  "], "IMAGE_OR_SIF is empty"),
    (["status", "", "--key", "k.pub"], "SIF_OR_REF is empty"),
    (["init", " "], "DIR is empty"),
]


@pytest.mark.parametrize("argv,says", EMPTY, ids=[" ".join(a[:1]) + repr(a[1]) for a, _ in EMPTY])
def test_an_empty_argument_is_bad_input_without_a_traceback(tmp_path: Path, argv: list[str],
                                                            says: str) -> None:
    # no engine either: bad input is found before the engine is asked
    proc = run_build_env(*argv, cwd=tmp_path, env={"DOCKER_HOST": f"unix://{tmp_path}/no.sock"},
                         timeout=120)
    assert proc.returncode == 2 and says in proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == [], "nothing may be written"


def test_a_closed_stdout_is_quiet() -> None:
    """`build-env list | head -0`: the reader is gone before the first line."""
    env = {**os.environ}
    env.pop("PYTHONPATH", None)
    proc = subprocess.Popen([str(installed_build_env()), "list"], cwd=OUTSIDE, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert err == "", err


class SilentEngine:
    def __init__(self, host: str) -> None:
        self.host = host
        self.asked = threading.Event()  # a client connected


@pytest.fixture
def silent_engine(tmp_path: Path) -> Iterator[SilentEngine]:
    """A unix socket that accepts and never answers: an engine that hangs."""
    path = tmp_path / "hang.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()
    engine = SilentEngine(f"unix://{path}")

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
                engine.asked.set()
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield engine
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


@pytest.mark.parametrize("signum,code,says", [(signal.SIGTERM, 143, "terminated"),
                                              (signal.SIGINT, 130, "interrupted")])
def test_a_signal_while_waiting_on_the_engine(silent_engine: SilentEngine, signum: int,
                                              code: int, says: str) -> None:
    env = {**os.environ, "DOCKER_HOST": silent_engine.host}
    env.pop("PYTHONPATH", None)
    proc = subprocess.Popen([str(installed_build_env()), "verify", "some/image:tag"],
                            cwd=OUTSIDE, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    # connected, and waiting for an answer that never comes
    assert silent_engine.asked.wait(120), proc.communicate(timeout=60)
    time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()
    os.kill(proc.pid, signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code and says in err, (proc.returncode, err)
    assert "Traceback" not in err


def test_an_engine_that_is_not_there_is_an_infrastructure_error(tmp_path: Path) -> None:
    proc = run_build_env("verify", "some/image:tag",
                         env={"DOCKER_HOST": f"unix://{tmp_path}/nothing.sock"}, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "cannot reach the Docker Engine" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
