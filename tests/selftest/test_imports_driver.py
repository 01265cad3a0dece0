"""The imports phase at the GPU driver boundary (builder/selftest/phases/imports.py): a manifest
import whose top-level module loads a GPU extension (``import sgl_kernel`` needs
``libcuda.so.1``) is a skip naming that library where no GPU is expected, and a failure where
GPUs are expected; any other import error stays a failure. The modules are real files on a
real ``sys.path`` that raise the loader's own error text."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from builder.selftest.phases import imports
from builder.selftest.manifest import GpuExpectation
from builder.selftest.phase import Run

LOADER = ("ImportError('libcuda.so.1: cannot open shared object file: No such file or "
          "directory')")


def _run(expected: bool, imports_map: dict[str, str],
         extensions: dict[str, list[list[str]]] | None = None) -> Run:
    expect = GpuExpectation(expected, 8 if expected else 0, True,
                            None if expected else "no GPU expected")
    return Run(ctx={"manifest": {"imports": imports_map, "extensions": extensions or {}},
                    "expect": expect.to_dict()})


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "drvkern_x").mkdir()
    (tmp_path / "drvkern_x" / "__init__.py").write_text(f"raise {LOADER}\n")
    (tmp_path / "brokenkern_x.py").write_text(
        "raise ImportError('libfoo.so.3: cannot open shared object file')\n")
    (tmp_path / "vllm_drv_x").mkdir()
    (tmp_path / "vllm_drv_x" / "__init__.py").write_text(f"raise {LOADER}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("drvkern_x", "brokenkern_x", "vllm_drv_x"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def _checks(run: Run) -> dict[str, object]:
    return {s.id: s.fn(run) for s in imports.plan(run)}


def test_a_manifest_import_that_needs_the_driver_is_a_skip_without_gpus(site: Path) -> None:
    c = _checks(_run(False, {"sglang-kernel": "drvkern_x"}))["imports.sglang-kernel"]
    assert c.status == "skip" and c.required is False
    assert "libcuda.so" in c.reason and "drvkern_x" in c.reason


def test_the_same_import_fails_where_gpus_are_expected(site: Path) -> None:
    c = _checks(_run(True, {"sglang-kernel": "drvkern_x"}))["imports.sglang-kernel"]
    assert c.status == "fail"
    assert "libcuda.so.1" in c.reason


def test_any_other_missing_library_still_fails(site: Path) -> None:
    c = _checks(_run(False, {"broken": "brokenkern_x"}))["imports.broken"]
    assert c.status == "fail" and "libfoo.so.3" in c.reason


def test_the_extension_after_a_driver_skip_is_skipped_not_required(
        site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checks = _checks(_run(False, {"vdrv": "vllm_drv_x"},
                          extensions={"vdrv": [["vllm_drv_x._C"]]}))
    assert checks["imports.vdrv"].status == "skip"
    sub = checks["imports.vllm_drv_x._C"]
    assert sub.status == "skip" and sub.required is False and "GPU driver" in sub.reason
