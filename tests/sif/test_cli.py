"""``build-env sif`` argument handling that needs no Docker Engine."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from builder import sif as sif_mod
from builder.errors import SifError
from tests.conftest import REPO, run_build_env


def test_unknown_target_is_a_usage_error(tmp_path: Path) -> None:
    proc = run_build_env("sif", "--target", "nope", "--matrix", str(REPO / "tests/fixtures/cpu.yaml"),
                         "--output", str(tmp_path / "x.sif"))
    assert proc.returncode == 2 and "nope" in proc.stderr
    assert not (tmp_path / "x.sif").exists()


def test_needs_shutil_tools_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SifError, match="mksquashfs not found"):
        sif_mod.pick_backend("auto")
    with pytest.raises(SifError, match="neither apptainer nor singularity"):
        sif_mod.pick_backend("apptainer")
