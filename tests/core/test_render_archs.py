"""What the rendered Dockerfile says about GPUs and the base: each source build's architecture list
comes from what that package's build supports (builder.matrix.families.SOURCE_ARCHS), and the base is
said to be pinned by digest only when it is."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from builder.errors import RenderError
from builder.matrix.families import SOURCE_ARCHS
from builder.resolve.lock import lock_path
from builder.resolve.metadata import load_snapshot
from builder.render import render_context
from builder.render.blocks.flash_attn import flash_attn_cuda_archs
from builder.matrix.spec import apply_overrides, load_matrix

REPO = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32


def _render(target, out: Path, name: str = "cuda-x86_64") -> str:
    m = load_matrix(REPO / "matrix.yaml")
    snap = load_snapshot(REPO / "metadata" / "pypi-snapshot.json")
    lock = lock_path(m.path, m.target(name))
    return render_context(target, lock.read_text(), snap, out, lock_file=lock,
                          fetch_sources=False).dockerfile


def _target(name: str = "cuda-x86_64"):
    return load_matrix(REPO / "matrix.yaml").target(name)


@pytest.mark.parametrize("gpus,archs", [
    (("sm_80",), "80"), (("sm_86",), "80"), (("sm_89",), "80"), (("sm_86", "sm_89"), "80"),
    (("sm_90",), "90"), (("sm_90a",), "90"), (("sm_100",), "100"), (("sm_103",), "100"),
    (("sm_100f", "sm_103a"), "100"), (("sm_120",), "120"), (("sm_121",), "120"),
    (("sm_80", "sm_90", "sm_100", "sm_103", "sm_120"), "80;90;100;120"),
])
def test_flash_attn_arch_list_is_its_setups_generation(gpus: tuple[str, ...], archs: str) -> None:
    assert flash_attn_cuda_archs(gpus) == archs


@pytest.mark.parametrize("gpu", ["sm_75", "sm_70", "sm_110"])
def test_a_gpu_flash_attn_has_no_code_for_is_refused(gpu: str) -> None:
    with pytest.raises(ValueError, match=f"flash-attn 2.8.3 builds no code for {gpu}"):
        flash_attn_cuda_archs(("sm_90", gpu))


def test_the_matrix_pins_the_flash_attn_the_table_was_read_from() -> None:
    """A new flash-attn pin is a review of SOURCE_ARCHS (its setup's arch list may change)."""
    m = load_matrix(REPO / "matrix.yaml")
    for t in m.targets.values():
        p = t.package("flash-attn")
        if p is not None and p.build == "source":
            assert p.version == SOURCE_ARCHS["flash-attn"].version, t.name


def test_sm_89_renders_flash_attns_own_arch(tmp_path: Path) -> None:
    """The issue's case: `gpus: [sm_89]` rendered FLASH_ATTN_CUDA_ARCHS="89", which flash-attn
    2.8.3's setup ignores (no kernels, hours of compile, a failed gate)."""
    t = apply_overrides(_target(), ["gpus=sm_89"])
    df = _render(t, tmp_path / "ctx")
    assert 'FLASH_ATTN_CUDA_ARCHS="80"' in df
    assert 'TORCH_CUDA_ARCH_LIST="8.9"' in df  # torch's own list keeps the exact GPU


def test_render_refuses_a_gpu_flash_attn_builds_nothing_for(tmp_path: Path) -> None:
    t = apply_overrides(_target(), ["gpus=sm_90,sm_110"])
    with pytest.raises(RenderError, match="builds no code for sm_110"):
        _render(t, tmp_path / "ctx")
    assert not (tmp_path / "ctx").exists()


def test_a_tag_only_base_is_not_said_to_be_pinned_by_digest(tmp_path: Path) -> None:
    t = _target()
    assert t.base.pinned_digest is None
    df = _render(t, tmp_path / "ctx")
    assert "pinned by digest" not in df
    assert "(the base is pinned by tag only" in df


@pytest.mark.parametrize("how", ["digest field", "in the reference"])
def test_a_base_pinned_by_digest_says_so(tmp_path: Path, how: str) -> None:
    t = _target()
    base = (replace(t.base, digest=DIGEST, source_image=f"{t.base.source_image}@{DIGEST}")
            if how == "digest field" else
            replace(t.base, image=f"{t.base.image}@{DIGEST}",
                    source_image=f"{t.base.source_image}@{DIGEST}"))
    t = replace(t, base=base)
    assert t.base.pinned_digest == DIGEST
    df = _render(t, tmp_path / "ctx")
    assert f"FROM nvidia/cuda:13.0.2-base-ubuntu24.04@{DIGEST} AS runtime" in df
    assert "pinned by tag only" not in df
    assert df.count("(the base is pinned by digest)") == 2  # the source stage and the runtime
