"""Faults during ``build-env sif`` / ``sqsh`` on the real engine and real file systems (each a
row in docs/reliability.md): the output or the scratch directory on a small tmpfs that fills,
``build-env sif`` SIGKILLed mid-conversion, and two runs writing one path at once. After each
fault the same command is run again and completes.

The image is the 4 MB test image plus 32 MiB of random bytes (incompressible: the SIF is as big
as the image, and the conversion takes long enough to be caught in the middle).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.sif import format as sif_format
from builder.sif.placement import mib
from tests.conftest import run_build_env
from tests.support.runs import end, polling, start, wait_for
from tests.sif.conftest import need_tools
from tests.sif.images import MINI, build_image

pytestmark = [pytest.mark.docker, pytest.mark.fault, pytest.mark.heavy]

BLOB_TAG = "verl-env-test/sif-blob:1"
BLOB = "FROM {base} AS blob\nRUN head -c 32M /dev/urandom > /blob\n" + MINI + \
    "COPY --from=blob /blob /data/blob\n"
MiB = 1 << 20


@pytest.fixture(scope="module")
def blob(docker_client: Any, debian_base: str) -> Any:
    need_tools("mksquashfs", "unsquashfs", "siftool")
    return build_image(docker_client, BLOB.format(base=debian_base), BLOB_TAG)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str, int], Path]]:
    """``mount(name, mib)``: a tmpfs of that size at tmp_path/name (mounted again with the new
    size when already mounted); every mount is unmounted at teardown."""
    mounted: list[Path] = []

    def mount(name: str, size_mib: int) -> Path:
        where = tmp_path / name
        if where in mounted:
            subprocess.run(["mount", "-o", f"remount,size={size_mib}m", str(where)], check=True)
            return where
        where.mkdir(exist_ok=True)
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs",
                               str(where)], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs (needs root): {proc.stderr.strip()}")
        mounted.append(where)
        return where

    try:
        yield mount
    finally:
        for where in reversed(mounted):
            subprocess.run(["umount", "-l", str(where)], check=False)


def sif_args(out: Path, *extra: str) -> list[str]:
    return ["sif", "--image", BLOB_TAG, "--force", "--no-run", "--backend", "native",
            "--output", str(out), *extra]


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def growing_partial(directory: Path, name: str, at_least: int) -> Path | None:
    for p in directory.glob(f".{name}.partial-*"):
        try:
            if p.stat().st_size >= at_least:
                return p
        except FileNotFoundError:
            pass
    return None


def assert_sif(path: Path) -> None:
    assert sif_format.is_sif(path), path
    subprocess.run(["siftool", "list", str(path)], check=True, capture_output=True)


def test_output_disk_full(blob: Any, tmpfs: Callable[[str, int], Path]) -> None:
    """Output on a tmpfs: too small for even the smallest SIF (refused before anything is
    written), then big enough to start but filling mid-write (mksquashfs's ENOSPC), then big
    enough: the same command completes."""
    out = tmpfs("out", 2) / "blob.sif"
    proc = run_build_env(*sif_args(out), timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert f"not enough space on the file system of {out.parent}" in proc.stderr
    assert "needs at least" in proc.stderr and "nothing was written" in proc.stderr
    assert listing(out.parent) == []

    tmpfs("out", 12)
    proc = run_build_env(*sif_args(out), timeout=300)
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith(f"error: sif: no space left on device in the output directory "
                          f"{out.parent} (12.0 MiB were free when the conversion started)"), err
    size = mib(blob.attrs["Size"])
    assert f"the SIF (a gzip squashfs of a {size} image) needs up to about {size}" in err
    assert "Traceback" not in proc.stderr
    assert listing(out.parent) == []  # no .sif, no partial file, no scratch directory

    tmpfs("out", 96)
    proc = run_build_env(*sif_args(out, "--report", str(out.parent / "r.json")), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert listing(out.parent) == ["blob.sif", "r.json"]
    assert_sif(out)


def test_scratch_disk_full(blob: Any, layered_sif: Path, tmp_path: Path,
                           tmpfs: Callable[[str, int], Path]) -> None:
    """The apptainer backend's scratch (--tmpdir) on a tmpfs that fills while the image's
    archive is written: the scratch directory is named, nothing is left in either place; with
    room, the same command completes (the stand-in apptainer places a known SIF)."""
    from tests.sif.test_apptainer_backend import STANDIN

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "apptainer").write_text(STANDIN)
    (bindir / "apptainer").chmod(0o755)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_SINGULARITY_LOG":
           str(tmp_path / "apptainer.log"), "FAKE_SINGULARITY_SIF": str(layered_sif)}
    scratch = tmpfs("scratch", 24)
    outdir = tmp_path / "out"
    args = ["sif", "--image", BLOB_TAG, "--force", "--no-run", "--backend", "apptainer",
            "--output", str(outdir / "blob.sif"), "--tmpdir", str(scratch)]
    proc = run_build_env(*args, timeout=300, env=env)
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith(f"error: sif: no space left on device in the scratch directory {scratch} "
                          "(24.0 MiB were free when the conversion started)"), err
    assert "choose another --tmpdir" in err and "scratch" in err
    assert listing(scratch) == [] and listing(outdir) == []
    assert not (tmp_path / "apptainer.log").exists()  # apptainer was never reached

    tmpfs("scratch", 96)
    proc = run_build_env(*args, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert listing(scratch) == [] and listing(outdir) == ["blob.sif"]
    assert_sif(outdir / "blob.sif")


def test_sqsh_disk_full(blob: Any, tmpfs: Callable[[str, int], Path]) -> None:
    out = tmpfs("out", 12) / "blob.sqsh"
    args = ["sqsh", "--image", BLOB_TAG, "--force", "--output", str(out)]
    proc = run_build_env(*args, timeout=300)
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith(f"error: sif: no space left on device in the output directory "
                          f"{out.parent} (12.0 MiB were free"), err
    assert f"the squashfs (gzip) of a {mib(blob.attrs['Size'])} image" in err
    assert listing(out.parent) == []
    tmpfs("out", 96)
    proc = run_build_env(*args, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert listing(out.parent) == ["blob.sqsh"]
    subprocess.run(["unsquashfs", "-s", str(out)], check=True, capture_output=True)


def _mksquashfs_writing(path: Path) -> list[str]:
    ps = subprocess.run(["pgrep", "-f", f"mksquashfs - {path}"], capture_output=True, text=True)
    return ps.stdout.split()


def test_sif_sigkilled_then_rerun(blob: Any, docker_client: Any, tmp_path: Path) -> None:
    """SIGKILL to the run's process group (what scancel, systemd or a killed job step do) in the
    middle of the stream, the partial file growing: the killed run leaves its partial file and
    scratch directory; the same command removes them, converts, and places the SIF."""
    outdir = tmp_path / "out"
    out = outdir / "blob.sif"
    killed = start(sif_args(out), tmp_path / "killed.log", session=True)
    try:
        partial = wait_for("the partial SIF to grow",
                           lambda: growing_partial(outdir, out.name, 2 * MiB))
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
    assert killed.returncode == -signal.SIGKILL
    assert partial.name == f".blob.sif.partial-{killed.pid}"
    wait_for("the killed mksquashfs to be gone", lambda: not _mksquashfs_writing(partial), 60)
    left = listing(outdir)
    assert "blob.sif" not in left and partial.name in left, left
    [scratch] = [n for n in left if n.startswith(".build-env-sif-blob.sif-")]
    killed_exports = docker_client.containers.list(all=True, filters={"name": "verl-env-export-"})
    assert len(killed_exports) == 1, [c.name for c in killed_exports]

    proc = run_build_env(*sif_args(out), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "removed what an interrupted run left" in proc.stderr
    assert str(partial) in proc.stderr and scratch in proc.stderr
    assert listing(outdir) == ["blob.sif"]
    assert_sif(out)
    # the killed run's export container (never started, labelled with its dead pid) was
    # removed by the re-run's export
    stale = docker_client.containers.list(all=True, filters={"name": "verl-env-export-"})
    assert stale == [], [c.name for c in stale]


def test_two_sif_runs_to_one_path(blob: Any, tmp_path: Path) -> None:
    """Two `build-env sif` of one image to one path: the first is caught (SIGSTOP) holding the
    run lock mid-conversion; the second says it waits for the first's pid; both complete, and
    whenever the path exists it holds a whole SIF (polled throughout)."""
    outdir = tmp_path / "out"
    out = outdir / "blob.sif"
    torn: list[str] = []
    seen: list[int] = []

    def poll() -> None:
        try:
            size = out.stat().st_size
            if not sif_format.is_sif(out) or size < 30 * MiB:
                torn.append(f"{size} bytes")
            seen.append(out.stat().st_ino)
        except (FileNotFoundError, OSError):
            pass

    first = second = None
    with polling(poll):
        try:
            first = start(sif_args(out), tmp_path / "first.log")
            wait_for("the first run's partial SIF",
                     lambda: growing_partial(outdir, out.name, 1))
            first.send_signal(signal.SIGSTOP)
            second = start(sif_args(out), tmp_path / "second.log")
            wait_for("the second run to wait",
                     lambda: f"waiting for pid {first.pid}: sif of {BLOB_TAG} to {out}"
                     in (tmp_path / "second.log").read_text())
            assert not out.exists()
            first.send_signal(signal.SIGCONT)
            assert first.wait(300) == 0, (tmp_path / "first.log").read_text()
            assert second.wait(300) == 0, (tmp_path / "second.log").read_text()
        finally:
            end(first, second)
    assert torn == []
    assert len(set(seen)) == 2  # the first's SIF, then the second's, each placed whole
    assert "removed what an interrupted run left" not in (tmp_path / "second.log").read_text()
    assert listing(outdir) == ["blob.sif"]
    assert_sif(out)


def test_report_disk_full(layered: Any, tmp_path: Path,
                          tmpfs: Callable[[str, int], Path]) -> None:
    """``--report`` on a full file system: the SIF (already verified and placed) stays, the
    error says so, and no temporary report file is left; with room, the same command completes."""
    from tests.sif.images import LAYERED_TAG

    need_tools("mksquashfs", "siftool", "unsquashfs")
    full = tmpfs("report", 1)
    with open(full / "filler", "wb") as f:  # fill it
        with pytest.raises(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()
    out = tmp_path / "out" / "x.sif"
    args = ["sif", "--image", LAYERED_TAG, "--force", "--no-run", "--output", str(out),
            "--report", str(full / "r.json")]
    proc = run_build_env(*args, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: sif: {full / 'r.json'}: cannot write the report (No space left on device); "
        f"the SIF at {out} is complete and verified")
    assert listing(full) == ["filler"] and listing(out.parent) == ["x.sif"]
    assert_sif(out)
    (full / "filler").unlink()
    proc = run_build_env(*args, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert listing(full) == ["r.json"] and listing(out.parent) == ["x.sif"]
