"""TransformerEngine's torch extension (``transformer-engine-torch``, an sdist only) from
source, against the torch of the lock.

- ``NVTE_PYTORCH_FORCE_BUILD``: its setup.py would otherwise download an unhashed prebuilt
  wheel from the project's release page.
- ``NVTE_BUILD_USE_NVIDIA_WHEELS``: CUDA, cuDNN and NCCL headers from the image's own nvidia
  wheels (the very libraries the extension loads at run time), never a toolkit's that may be
  another release; ``CUDA_HOME`` is the nvcc wheel's tree (its setup asks nvcc for the CUDA
  version; the target's ``build_tools`` pin ``nvidia-cuda-nvcc`` and ``nvidia-cudnn-frontend``).
- ``NVTE_WITH_NCCL_EP``: its NCCL expert-parallel bindings need Hopper or newer; on only when
  the target's ``gpus`` include one (TransformerEngine 2.20's own rule).

The extension is host code (C++ only, no CUDA sources): its GPU kernels are in the core wheel's
``libtransformer_engine.so``, which the coverage phase holds to the target's ``gpus``.
"""

from __future__ import annotations

from builder.matrix import families
from builder.render.blocks.base import Block, Env, register, venv_site
from builder.matrix.spec import Target

NOTES = (
    "transformer-engine-torch: NVTE_PYTORCH_FORCE_BUILD (its setup.py would otherwise download",
    "an unhashed prebuilt wheel); CUDA/cuDNN/NCCL headers from the image's own nvidia wheels;",
    "host C++ only: its GPU kernels are the core wheel's, held to the gpus by the gate.")
# one compile job per 3 GiB (3145728 KiB) of available memory, at least one
MAX_JOBS = ('"${MAX_JOBS:-$(awk \'/MemAvailable/ {n = int($2 / 3145728); '
            'print (n > 0 ? n : 1)}\' /proc/meminfo)}"')


def nccl_ep(gpus: tuple[str, ...]) -> bool:
    """Whether any GPU is Hopper (sm_90) or newer."""
    return any(families.sm_number(g) >= 90 for g in gpus)


def env(target: Target) -> Env:
    major = (target.cuda or "13").split(".")[0]
    return [("NVTE_PYTORCH_FORCE_BUILD", "TRUE"), ("NVTE_FRAMEWORK", "pytorch"),
            ("NVTE_BUILD_USE_NVIDIA_WHEELS", "1"),
            ("NVTE_WITH_NCCL_EP", "1" if nccl_ep(target.gpus) else "0"),
            ("CUDA_HOME", f"{venv_site(target)}/nvidia/cu{major}"),
            ("MAX_JOBS", MAX_JOBS)]


BLOCK = register(Block("transformer-engine-torch", env=env, notes=NOTES))
