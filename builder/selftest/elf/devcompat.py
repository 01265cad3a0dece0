"""Which GPU a library's device code runs on: native code, JIT from portable code, or nothing.

CUDA rules (NVIDIA CUDA C++ Programming Guide, "Binary Compatibility" and "PTX Compatibility";
NVIDIA technical blog "NVIDIA Blackwell and NVIDIA CUDA 12.9 Introduce Family-Specific
Architecture Features", 2025; LLVM ``NVPTX.td``: "Arch-specific targets. PTX for these is not
compatible with any other architectures", family targets compared within the family; GCC's
nvptx ``-march-map`` change for sm_110: "'a' = ISA for that specific arch only, 'f' ... implies
compatibility with only subsequent targets in the same family"):

* SASS (a cubin) for ``sm_XY`` runs on a GPU of compute capability ``X.Z`` with ``Z >= Y``: same
  major, equal or newer minor (sm_80 SASS runs on sm_86/sm_89, never on sm_90).
* ``sm_XYa`` (arch-specific, "architecture-accelerated features") runs only on ``X.Y`` itself.
* ``sm_XYf`` (family-specific) runs on the family members ``X.Z`` with ``Z >= Y`` (sm_100f on
  sm_100 and sm_103; sm_103f only on sm_103).
* PTX for ``compute_XY`` is JIT-compiled by the driver for any GPU of compute capability
  ``>= X.Y``; ``compute_XYa`` PTX only for ``X.Y``; ``compute_XYf`` PTX only within the family
  (same major, minor ``>= Y``). JIT needs a driver whose PTX ISA is at least the entry's.

ROCm rules (LLVM AMDGPUUsage, "Target IDs" and "Generic processors"; HIP runtime code object
selection): a code object for processor ``gfxNNN`` runs only on that processor. A target feature
in the code object's id (``xnack-``, ``sramecc+``) must equal the GPU's setting; a feature the
code object leaves out runs either way. A declared GPU that leaves a feature out runs in either
mode, so code built for any one setting counts. A generic target (``gfx9-4-generic``) runs on the
processors it lists. ``amdgcnspirv`` code is JIT-compiled for any AMD GPU by the runtime.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from .devcode import CudaImage, HipImage

NATIVE, PTX_JIT, SPIRV_JIT, NONE = "native", "ptx-jit", "spirv-jit", "none"
RANK = {NATIVE: 0, PTX_JIT: 1, SPIRV_JIT: 1, NONE: 2}

CUDA_GPU = re.compile(r"^sm_(\d{2,3})([af]?)$")
ROCM_GPU = re.compile(r"^(gfx[0-9a-f]{3,4})((?::(?:xnack|sramecc)[+-])*)$")

# LLVM AMDGPUUsage "Generic processors" table: the processors each generic target runs on.
GENERIC = {
    "gfx9-generic": {"gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c"},
    "gfx9-4-generic": {"gfx940", "gfx941", "gfx942", "gfx950"},
    "gfx10-1-generic": {"gfx1010", "gfx1011", "gfx1012", "gfx1013"},
    "gfx10-3-generic": {"gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035",
                        "gfx1036"},
    "gfx11-generic": {"gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151",
                      "gfx1152", "gfx1153"},
    "gfx12-generic": {"gfx1200", "gfx1201"},
}


@dataclass(frozen=True)
class Decision:
    """How one library runs on one GPU, and which of its images decided it."""

    status: str  # native | ptx-jit | spirv-jit | none
    by: str | None = None  # e.g. sm_90, compute_80, gfx942:xnack-


def cuda_gpu(gpu: str) -> tuple[int, int]:
    """``sm_103`` → (10, 3). A declared ``sm_90a`` is the same GPU as ``sm_90``."""
    m = CUDA_GPU.match(gpu)
    if not m:
        raise ValueError(f"not a CUDA GPU id (sm_XY): {gpu!r}")
    arch = int(m.group(1))
    return arch // 10, arch % 10


def sass_runs(img: CudaImage, gpu: tuple[int, int]) -> bool:
    """Whether SASS ``img`` runs on a GPU of compute capability ``gpu``."""
    major, minor = divmod(img.arch, 10)
    if img.variant == "a":
        return (major, minor) == gpu
    return major == gpu[0] and minor <= gpu[1]


def ptx_jits(img: CudaImage, gpu: tuple[int, int]) -> bool:
    """Whether PTX ``img`` can be JIT-compiled for a GPU of compute capability ``gpu``."""
    cc = divmod(img.arch, 10)
    if img.variant == "a":
        return cc == gpu
    if img.variant == "f":
        return cc[0] == gpu[0] and cc[1] <= gpu[1]
    return cc <= gpu


def decide_cuda(images: Iterable[CudaImage], gpu: str) -> Decision:
    """Native if any SASS runs on ``gpu``; else JIT if any PTX compiles for it; else none.
    The newest matching image is named."""
    cc = cuda_gpu(gpu)
    imgs = sorted(set(images), key=lambda i: (i.arch, i.variant), reverse=True)
    for img in imgs:
        if img.kind == "sass" and sass_runs(img, cc):
            return Decision(NATIVE, img.name)
    for img in imgs:
        if img.kind == "ptx" and ptx_jits(img, cc):
            return Decision(PTX_JIT, img.name)
    return Decision(NONE)


def split_target(target: str) -> tuple[str, dict[str, str]]:
    """``gfx942:sramecc+:xnack-`` → ("gfx942", {"sramecc": "+", "xnack": "-"})."""
    proc, *feats = target.split(":")
    return proc, {f[:-1]: f[-1] for f in feats if f and f[-1] in "+-"}


def rocm_gpu(gpu: str) -> tuple[str, dict[str, str]]:
    """A declared AMD GPU (``gfx942``, ``gfx942:xnack+``), validated."""
    if not ROCM_GPU.match(gpu):
        raise ValueError(f"not an AMD GPU target id (gfxNNN[:xnack±][:sramecc±]): {gpu!r}")
    return split_target(gpu)


def hip_runs(img: HipImage, gpu: tuple[str, dict[str, str]]) -> bool:
    """Whether a code object runs natively on the declared GPU."""
    proc, feats = split_target(img.target)
    gproc, gfeats = gpu
    if proc != gproc and gproc not in GENERIC.get(proc, ()):
        return False
    return all(gfeats.get(k, v) == v for k, v in feats.items())


def decide_rocm(images: Iterable[HipImage], gpu: str) -> Decision:
    """Native if a code object runs on ``gpu`` (exact processor first); else SPIR-V JIT; else
    none."""
    g = rocm_gpu(gpu)
    imgs = sorted(set(images), key=lambda i: ("generic" in i.target, i.target))
    for img in imgs:
        if img.target != "amdgcnspirv" and hip_runs(img, g):
            return Decision(NATIVE, img.target)
    if any(i.target == "amdgcnspirv" for i in imgs):
        return Decision(SPIRV_JIT, "amdgcnspirv")
    return Decision(NONE)


def worst(decisions: Iterable[str]) -> str:
    """The least capable of several decisions (a distribution runs only as well as its worst
    library)."""
    return max(decisions, key=lambda d: RANK[d], default=NATIVE)
