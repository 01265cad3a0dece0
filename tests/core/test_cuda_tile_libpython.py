"""cuda/tile fixed at its cause (issue 37 item 6): cuda.tile's extension links the interpreter's
shared libpython, which Ubuntu's statically linked python3.X does not need; every target whose
lock installs cuda-tile installs that library from its apt list, and no ABI allowance excuses
cuda.tile (it would be reported stale by the gate)."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.matrix.spec import load_matrix
from builder.resolve.lock import lock_path, parse_lock

REPO = Path(__file__).resolve().parents[2]
MATRIX = load_matrix(REPO / "matrix.yaml")
WITH_TILE = [n for n, t in MATRIX.targets.items()
             if lock_path(REPO / "matrix.yaml", t).is_file()
             and "cuda-tile" in parse_lock(lock_path(REPO / "matrix.yaml", t).read_text())]


def test_the_shipped_cuda_stacks_install_cuda_tile() -> None:
    assert {"cuda-x86_64", "cuda-arm64", "cuda-x86_64-megatron",
            "cuda-arm64-megatron"} <= set(WITH_TILE)


@pytest.mark.parametrize("name", WITH_TILE)
def test_a_target_with_cuda_tile_ships_the_shared_libpython(name: str) -> None:
    t = MATRIX.targets[name]
    # Ubuntu 24.04 names the package after the 64-bit time_t transition
    assert f"libpython{t.python}t64" in t.apt or f"libpython{t.python}" in t.apt, t.apt
    assert not [g for g, _ in t.abi_allow if g.startswith("cuda/tile/")], t.abi_allow
