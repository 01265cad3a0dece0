"""The SGLang target's reviewed ``abi_allow`` (matrix.yaml, docs/acceptance-sglang.md): the
objects the merged gate's ABI phase found unloadable in the real image, each confirmed there by
a dlopen after ``import torch`` and by ``ldd -r`` (scripts/abi-crosscheck.py), are allowed with
a reason, and nothing the stack does load is: torch-memory-saver's ``_cu13`` builds (what it
loads on this CUDA 13 torch), torchcodec's Python package, and the two objects the phase's
model misjudges (scipy's vendored libgfortran, deep_gemm's ``_C.so``: they load in the image)."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

from builder.render.baked import manifest
from builder.matrix.spec import load_matrix

REPO = Path(__file__).resolve().parents[2]

# the unloadable objects of the acceptance image (site-packages-relative), from the crosscheck
UNLOADABLE = [
    *(f"nvidia/nvshmem/lib/nvshmem_{n}.so.3" for n in (
        "bootstrap_mpi", "bootstrap_pmix", "bootstrap_shmem", "transport_libfabric",
        "transport_ucx")),
    *(f"torchcodec/libtorchcodec_{kind}{v}.so" for kind in ("core", "custom_ops", "pybind_ops")
      for v in range(4, 9)),
    *(f"torch_memory_saver_hook_mode_{m}{s}.abi3.so" for m in ("preload", "torch")
      for s in ("", "_cu12")),
    # the re-locked stack (verl's extras, issue 37; docs/acceptance-sglang.md run 7)
    "cupy_backends/cuda/libs/cutensor.cpython-311-x86_64-linux-gnu.so",
]
LOADS = [
    "torch_memory_saver_hook_mode_preload_cu13.abi3.so",
    "torch_memory_saver_hook_mode_torch_cu13.abi3.so",
    "torchcodec/_core/ops.py", "torchcodec/libtorchcodec_heic.so",
    "nvidia/nvshmem/lib/nvshmem_transport_ibrc.so.3", "nvidia/nvshmem/lib/libnvshmem_host.so.3",
    "scipy.libs/libgfortran-8f1e9814.so.5.0.0", "deep_gemm/_C.so",
    "cuda/tile/_cext.cpython-311-x86_64-linux-gnu.so",
    "cupy_backends/cuda/libs/nccl.cpython-311-x86_64-linux-gnu.so",
    "cupy/_core/core.cpython-311-x86_64-linux-gnu.so",
]


@pytest.fixture(scope="module")
def allow() -> dict[str, str]:
    t = load_matrix(REPO / "matrix.yaml").target("cuda-x86_64-sglang")
    m = manifest(t, "sha256:" + "0" * 64, "sha256:" + "0" * 64)
    return m.get("abi_allow", {})


def _reason(path: str, allow: dict[str, str]) -> str | None:
    return next((why for pat, why in sorted(allow.items()) if fnmatch.fnmatchcase(path, pat)),
                None)


@pytest.mark.parametrize("path", UNLOADABLE)
def test_each_verified_unloadable_object_is_allowed_with_its_reason(
        path: str, allow: dict[str, str]) -> None:
    why = _reason(path, allow)
    assert why is not None, f"{path} is not in cuda-x86_64-sglang's abi_allow"
    lib = ("libcudart.so.12" if "memory_saver" in path else "FFmpeg" if "torchcodec" in path
           else "libcutensor.so.2" if "cutensor" in path else "the site's")
    assert lib in why


@pytest.mark.parametrize("path", LOADS)
def test_nothing_the_stack_loads_is_allowed(path: str, allow: dict[str, str]) -> None:
    assert _reason(path, allow) is None


def test_every_glob_names_an_object_found_unloadable(allow: dict[str, str]) -> None:
    assert allow, "cuda-x86_64-sglang has no abi_allow"
    for pattern in allow:
        assert any(fnmatch.fnmatchcase(p, pattern) for p in UNLOADABLE), pattern
