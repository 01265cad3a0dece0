"""``build-env sif`` argument handling that needs no Docker Engine."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest

from builder import sif as sif_mod
from builder.errors import BuildEnvError, SifError
from tests.conftest import FIXTURE, run_build_env


def test_unknown_target_is_a_usage_error(tmp_path: Path) -> None:
    proc = run_build_env("sif", "--target", "nope", "--matrix", str(FIXTURE),
                         "--output", str(tmp_path / "x.sif"))
    assert proc.returncode == 2 and "nope" in proc.stderr
    assert not (tmp_path / "x.sif").exists()


def test_needs_shutil_tools_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SifError, match="mksquashfs not found"):
        sif_mod.pick_backend("auto")
    with pytest.raises(SifError, match="neither apptainer nor singularity"):
        sif_mod.pick_backend("apptainer")


def test_an_uncompressed_sif_is_the_native_backends(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    """``--compression none`` with ``--backend apptainer`` is refused before any engine is
    asked (exit 2, the flags named, nothing written); ``auto`` picks the native backend for it
    even where apptainer is installed, and keeps apptainer for gzip."""
    out = tmp_path / "x.sif"
    proc = run_build_env("sif", "--image", "verl-env-test/none:0", "--backend", "apptainer",
                         "--compression", "none", "--output", str(out),
                         env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == ("error: usage: --compression none needs the native backend: "
                                   "apptainer's build always compresses with gzip (pass "
                                   "--backend native or auto)")
    assert list(tmp_path.iterdir()) == []
    # builder.sif.convert the module (the package's ``convert`` is the function)
    monkeypatch.setattr(importlib.import_module("builder.sif.convert"), "apptainer_binary",
                        lambda: "/usr/bin/apptainer")
    assert sif_mod.pick_backend("auto", compression="none") == "native"
    assert sif_mod.pick_backend("auto") == "apptainer"
    with pytest.raises(BuildEnvError, match="needs the native backend") as err:
        sif_mod.pick_backend("apptainer", "cpu-x86_64", "none")
    assert err.value.exit_code == 2 and err.value.target == "cpu-x86_64"
