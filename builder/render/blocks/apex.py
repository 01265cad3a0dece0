"""NVIDIA apex from a commit-pinned source (the Megatron layer's optional ``apex``): its C++ and
CUDA extensions switched on through apex's build variables (``pip wheel`` passes no
``--cpp_ext``/``--cuda_ext`` options; without them apex builds Python only, and verl's
``fused_rms_norm_affine`` would fail at run time), for the target's gpus (the common
``TORCH_CUDA_ARCH_LIST``), with as many jobs as the build host's memory allows. Not built on this
project's machines (GitHub, where apex lives, is unreachable here): docs/megatron.md."""

from __future__ import annotations

from builder.render.blocks.base import Block, Env, register
from builder.matrix.spec import Target

NOTES = (
    "apex: its C++ and CUDA extensions (APEX_CPP_EXT, APEX_CUDA_EXT), for the target's gpus,",
    "with as many jobs as the build host's memory allows (about 4 GB each).")
# one compile job per 4 GiB (4194304 KiB) of available memory, at least one
MAX_JOBS = ('"${MAX_JOBS:-$(awk \'/MemAvailable/ {n = int($2 / 4194304); '
            'print (n > 0 ? n : 1)}\' /proc/meminfo)}"')


def env(target: Target) -> Env:
    return [("APEX_CPP_EXT", "1"), ("APEX_CUDA_EXT", "1"), ("MAX_JOBS", MAX_JOBS)]


BLOCK = register(Block("apex", env=env, notes=NOTES))
