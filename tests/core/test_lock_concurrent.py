"""Two ``build-env lock`` of one target at once (a row in docs/reliability.md): the second waits
for the first (the run lock on the lock file's path), then starts from the first one's lock and
finds it unchanged; whenever the lock file exists it is whole (polled throughout)."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest

from builder import exclusive as runlock
from builder.resolve.lock import parse_lock
from tests.conftest import FIXTURE
from tests.support.runs import end, polling, start, wait_for

pytestmark = [pytest.mark.network, pytest.mark.fault]


def test_two_locks_of_one_target(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(FIXTURE, site / "matrix.yaml")
    shutil.copytree(FIXTURE.parent / "metadata", site / "metadata")
    lock = site / "locks" / "cpu-x86_64.txt"
    # the run lock's file, as the runs (same XDG_STATE_HOME) name it
    holder_file = runlock._file_for(runlock.key_for_path(lock))
    texts: set[str] = set()
    torn: list[str] = []

    def poll() -> None:
        try:
            text = lock.read_text()
        except FileNotFoundError:
            return
        if not text.startswith("# ") or not text.endswith("\n") or "verl==0.9.1" not in text:
            torn.append(text[-200:])
        texts.add(text)

    args = ["lock", "--target", "cpu-x86_64"]
    first = second = None
    with polling(poll):
        try:
            first = start(args, tmp_path / "first.log", cwd=site)
            wait_for("the first run to hold the run lock",
                     lambda: holder_file.is_file() and holder_file.read_text().startswith(
                         f"pid {first.pid}: lock of cpu-x86_64"), timeout=300)
            first.send_signal(signal.SIGSTOP)
            second = start(args, tmp_path / "second.log", cwd=site)
            wait_for("the second run to wait",
                     lambda: f"waiting for pid {first.pid}: lock of cpu-x86_64"
                     in (tmp_path / "second.log").read_text(), timeout=300)
            first.send_signal(signal.SIGCONT)
            assert first.wait(600) == 0, (tmp_path / "first.log").read_text()
            assert second.wait(600) == 0, (tmp_path / "second.log").read_text()
        finally:
            end(first, second)
    assert torn == []
    final = lock.read_text()
    assert texts == {final}  # one lock ever seen: the first one's, kept by the second
    assert "unchanged" in (tmp_path / "second.log").read_text()
    assert "--hash=sha256:" in final and "verl" in parse_lock(final)
    assert sorted(p.name for p in lock.parent.iterdir()) == ["cpu-x86_64.txt"]
