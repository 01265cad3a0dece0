"""The squashfuse mount the SIF's self-test ran on is always unmounted (builder/sif/checks.py).

In a whole CI run (2026-12-01) the first ``umount`` found the mount busy, the mount stayed, and
the scratch directory's removal walked into the image's read-only tree: ``sif: .exec: Function
not implemented`` (ENOSYS from the FUSE file system, naming the image's ``/.exec`` symlink).
The first three use a stand-in ``umount`` (how long a mount stays busy is not something to ask
a real one for); the last holds a real squashfuse mount busy with an open file."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from builder.sif import checks


@pytest.fixture
def umount(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A stand-in for the umount command: busy the first ``busy`` times, then unmounted."""
    calls: list[list[str]] = []
    state = {"busy": 0, "mounted": True}

    def run(cmd: list[str], timeout: float = 120, **kw: object) -> subprocess.CompletedProcess:
        calls.append(cmd)
        if "--lazy" in cmd or state["busy"] == 0:
            state["mounted"] = False
            return subprocess.CompletedProcess(cmd, 0, "", "")
        state["busy"] -= 1
        return subprocess.CompletedProcess(cmd, 32, "", f"umount: {cmd[-1]}: target is busy.")

    monkeypatch.setattr(checks, "_run", run)
    monkeypatch.setattr(checks.os.path, "ismount", lambda p: state["mounted"])
    monkeypatch.setattr(checks.time, "sleep", lambda s: None)
    return calls, state


def test_a_mount_busy_for_a_moment_is_unmounted_when_it_is_free(umount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    calls, state = umount
    state["busy"] = 3
    checks.unmount(tmp_path)
    assert calls == [["umount", str(tmp_path)]] * 4 and not state["mounted"]


def test_a_mount_that_stays_busy_is_detached(umount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    calls, state = umount
    state["busy"] = 1000
    checks.unmount(tmp_path)
    assert calls[:-1] == [["umount", str(tmp_path)]] * checks.UNMOUNT_TRIES
    assert calls[-1] == ["umount", "--lazy", str(tmp_path)] and not state["mounted"]


def test_a_free_mount_is_unmounted_once(umount, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    calls, state = umount
    checks.unmount(tmp_path)
    assert calls == [["umount", str(tmp_path)]]


def test_a_real_mount_held_by_a_process_is_detached_and_the_scratch_removed(
        tmp_path: Path) -> None:
    """The real squashfuse: a process that keeps a file of the image open past the run holds
    the mount busy; the scratch directory is still removed whole and the mount is gone."""
    import os
    import shutil
    import sys

    if os.geteuid() != 0 or not (shutil.which("squashfuse") and shutil.which("mksquashfs")
                                 and Path("/dev/fuse").exists()):
        pytest.skip("needs root, squashfuse, mksquashfs and /dev/fuse")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "file").write_text("held open\n")
    os.symlink("file", tree / ".exec")
    image = tmp_path / "image.sqfs"
    subprocess.run(["mksquashfs", str(tree), str(image), "-quiet", "-no-progress"], check=True)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    holder = None
    try:
        with checks.squashfs_root(image, 0, image.stat().st_size, scratch) as root:
            assert root == scratch / "root" and os.path.ismount(root)
            holder = subprocess.Popen(
                [sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); "
                 "print(f.read(), end='', flush=True); time.sleep(120)", str(root / "file")],
                stdout=subprocess.PIPE, text=True, cwd=root)
            assert holder.stdout is not None and holder.stdout.readline() == "held open\n"
        assert not os.path.ismount(scratch / "root") and not (scratch / "root").exists()
        shutil.rmtree(scratch)  # nothing of the image below it: no ENOSYS
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
