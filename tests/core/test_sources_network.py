"""Git sources reach the network only when asked, and always bounded (issue 29, item 3).

cuda-arm64 builds tensordict from a git tag. Here its remote is a black hole on this machine: a
TCP listener that accepts every connection and never answers (what a firewall that drops
traffic looks like to git, minus the wait for the connect timeout). The offline `check` must not
connect at all; `lock` and `render` must give up within the bound with one line naming the URL
(its credentials redacted) and the way out, exit 3, and leave the site as it was."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.resolve import sources
from builder.resolve.lock import lock_path
from builder.matrix.spec import load_matrix
from builder.resolve.targets import init_site
from tests.conftest import REPO

SECRET = "s3cret-token"
UPSTREAM = "git+https://github.com/pytorch/tensordict@v0.10.0"


class BlackHole:
    """Accepts TCP connections on a free local port, records them, never sends a byte."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def hole() -> Iterator[BlackHole]:
    h = BlackHole()
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def site(tmp_path: Path, hole: BlackHole) -> Path:
    """A copy of the reference site whose tensordict comes from the black hole (the lock's
    sources record names it too, so the lock is current and only the remote is unreachable)."""
    root = tmp_path / "site"
    init_site(root)
    remote = f"git+https://user:{SECRET}@127.0.0.1:{hole.port}/tensordict@v0.10.0"
    for name in ("matrix.yaml", "locks/cuda-arm64.sources.json"):
        path = root / name
        assert UPSTREAM in path.read_text()
        path.write_text(path.read_text().replace(UPSTREAM, remote))
    return root


def _run(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "VERL_ENV_NETWORK_TIMEOUT": "2"}
    # a generous bound that catches a hang (today's git wait was 120 s), not a speed claim
    return subprocess.run([sys.executable, "-m", "builder", *args], cwd=site, env=env,
                          capture_output=True, text=True, timeout=90)


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _one_error(proc: subprocess.CompletedProcess[str], port: int) -> str:
    assert "Traceback" not in proc.stderr and "TimeoutExpired" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert f"127.0.0.1:{port}" in errors[0] and SECRET not in proc.stderr + proc.stdout, errors
    assert "--no-fetch" in errors[0], errors[0]
    return errors[0]


def test_the_offline_check_asks_no_git_remote(site: Path, hole: BlackHole) -> None:
    proc = _run(site, "check", "--target", "cuda-arm64")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cuda-arm64: ok" in proc.stdout
    assert hole.accepted == [], "the offline check connected to the git remote"


def test_lock_gives_up_on_a_silent_git_remote_in_one_line(site: Path, hole: BlackHole) -> None:
    before = _digest(site)
    # an unchanged lock is kept without asking the remote (issue 38: resolved only when asked)
    proc = _run(site, "lock", "--target", "cuda-arm64")
    assert proc.returncode == 0 and "unchanged" in proc.stdout, proc.stdout + proc.stderr
    assert hole.accepted == [], "an unchanged lock connected to the git remote"
    proc = _run(site, "lock", "--target", "cuda-arm64", "--refresh")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    line = _one_error(proc, hole.port)
    assert re.search(r"no answer within 2 s", line), line
    assert hole.accepted, "lock never asked the remote"
    assert _digest(site) == before


def test_render_gives_up_on_a_silent_git_remote_in_one_line(
        site: Path, hole: BlackHole, tmp_path: Path) -> None:
    out = tmp_path / "ctx"
    proc = _run(site, "render", "--target", "cuda-arm64", "--output", str(out))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    line = _one_error(proc, hole.port)
    assert "no answer within 2 s" in line, line  # one bound, not the fetch's longer one
    assert not out.exists()
    proc = _run(site, "render", "--target", "cuda-arm64", "--output", str(out), "--no-fetch")
    assert proc.returncode == 0, proc.stderr


def test_check_online_warns_in_one_line_when_the_remote_is_silent(
        site: Path, hole: BlackHole, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_ENV_NETWORK_TIMEOUT", "2")
    t = load_matrix(site / "matrix.yaml").target("cuda-arm64")
    errors, warnings = sources.moved_refs(t, lock_path(site / "matrix.yaml", t))
    assert errors == [] and len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert f"127.0.0.1:{hole.port}" in warnings[0] and SECRET not in warnings[0]
