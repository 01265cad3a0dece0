"""The extras' packages through the imports phase (issue 37 item 1): the manifest a shipped
target bakes imports cupy (verl's fsdp/megatron extras, from the lock); an import of it that
stops at the GPU driver (cupy_backends links libcuda.so.1) is a skip naming the driver where no
GPU is expected and a failure where GPUs are. The module is a real file on a real sys.path
raising the loader's own error text."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from builder.matrix.spec import load_matrix
from builder.render.baked import manifest
from builder.resolve.lock import lock_path, parse_lock
from builder.selftest.manifest import GpuExpectation
from builder.selftest.phase import Run
from builder.selftest.phases import imports

REPO = Path(__file__).resolve().parents[2]
LOADER = ("ImportError('libcuda.so.1: cannot open shared object file: No such file or "
          "directory')")


@pytest.fixture
def baked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    t = load_matrix(REPO / "matrix.yaml").target("cuda-x86_64")
    locked = parse_lock(lock_path(REPO / "matrix.yaml", t).read_text())
    wanted = manifest(t, "m", "l", installed=tuple(locked))["imports"]
    module = wanted["cupy-cuda13x"]
    (tmp_path / module).mkdir()
    (tmp_path / module / "__init__.py").write_text(f"raise {LOADER}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    return {"cupy-cuda13x": module}


def _check(expected: bool, imports_map: dict[str, str]):
    expect = GpuExpectation(expected, 8 if expected else 0, True,
                            None if expected else "no GPU expected")
    run = Run(ctx={"manifest": {"imports": imports_map}, "expect": expect.to_dict()})
    return {s.id: s.fn(run) for s in imports.plan(run)}["imports.cupy-cuda13x"]


def test_cupy_without_a_driver_is_a_skip_naming_it(baked: dict[str, str]) -> None:
    c = _check(False, baked)
    assert c.status == "skip" and c.required is False
    assert "libcuda.so" in c.reason and "cupy" in c.reason


def test_cupy_without_a_driver_fails_where_gpus_are_expected(baked: dict[str, str]) -> None:
    c = _check(True, baked)
    assert c.status == "fail" and "libcuda.so.1" in c.reason
