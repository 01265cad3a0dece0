"""The frame of a conversion (builder/sif/placement.py) without an engine: what a killed run left
is swept for its own output only, the up-front space check refuses below the floor and warns
below the estimate (adding up the needs of one file system), a failure that filled a file system
becomes the disk-full error, and the partial file and scratch directory go either way."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from builder.errors import SifError
from builder.sif import placement
from builder.sif.placement import Need


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def test_sweep_takes_only_this_outputs_leftovers(tmp_path: Path) -> None:
    out = tmp_path / "a[1].sif"
    mine = [tmp_path / ".a[1].sif.partial-12", tmp_path / f"{placement._tag(out)}x"]
    others = [tmp_path / ".a1.sif.partial-3", tmp_path / ".b.sif.partial-4",
              tmp_path / f"{placement._tag(tmp_path / 'b.sif')}y"]
    for p in mine + others:
        p.mkdir() if p.name.startswith(".build-env") else p.write_text("x")
    assert sorted(placement.sweep(out, None)) == sorted(mine)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "state") == \
        sorted(p.name for p in others)


def test_preflight_floor_estimate_and_one_file_system(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "x.sif"
    monkeypatch.setattr(placement, "free_bytes", lambda p: 100 << 20)
    sif = Need("output", 40 << 20, 200 << 20, "the SIF")
    scratch = Need("scratch", 70 << 20, 300 << 20, "the archive")
    assert placement.preflight(out, tmp_path, [Need("output", 1, 2, "x")], None) == []
    [warning] = placement.preflight(out, tmp_path, [sif], None)
    assert warning == f"warning: {tmp_path} has 100.0 MiB free; the SIF may need up to 200.0 MiB"
    # scratch beside the output: 40 + 70 MiB > 100 MiB free
    with pytest.raises(SifError, match=r"not enough space on the file system of .*: 100.0 MiB "
                       r"free, and the SIF together with the archive needs at least 110.0 MiB "
                       r"\(up to about 500.0 MiB\); nothing was written"):
        placement.preflight(out, tmp_path, [sif, scratch], "t")


def test_placing_removes_its_files_and_names_a_full_disk(tmp_path: Path) -> None:
    out = tmp_path / "o" / "x.sif"
    need = [Need("output", 0, 5 << 20, "the SIF")]
    with pytest.raises(SifError, match=r"^sif: \[t\] no space left on device in the output "
                       rf"directory {tmp_path / 'o'} \(.* MiB were free when the conversion "
                       r"started\); the SIF needs up to about 5.0 MiB\. Nothing was left at "):
        with placement.placing(out, None, what="test", needs=need, target="t") as work:
            work.partial.write_bytes(b"half")
            (work.scratch / "log").write_text("x")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert os.listdir(out.parent) == []
    # any other failure passes through unchanged, and is cleaned up the same way
    with pytest.raises(RuntimeError, match="other"):
        with placement.placing(out, None, what="test", needs=need, target="t") as work:
            work.partial.write_bytes(b"half")
            raise RuntimeError("other")
    assert os.listdir(out.parent) == []
    with placement.placing(out, None, what="test", needs=need, target="t") as work:
        work.partial.write_bytes(b"whole")
        os.replace(work.partial, out)
    assert os.listdir(out.parent) == ["x.sif"] and out.read_bytes() == b"whole"
