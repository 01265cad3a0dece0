"""flash-attn from source: forced (its setup.py would download an unhashed prebuilt wheel), for
the target's GPUs in flash-attn's own architecture names (the data: builder.matrix.families'
``SOURCE_ARCHS``), with as many compile jobs as the build host's memory allows."""

from __future__ import annotations

from builder.matrix.families import SOURCE_ARCHS
from builder.render.blocks.base import Block, Env, register
from builder.matrix.spec import Target

NOTES = (
    "flash-attn: FLASH_ATTENTION_FORCE_BUILD (its setup.py would otherwise download an unhashed",
    "prebuilt wheel), for the target's gpus, with as many jobs as the build host's memory allows",
    "(about 9 GB each).")
# one job per 9 GiB (9437184 KiB) of available memory, at least one
MAX_JOBS = ('"${MAX_JOBS:-$(awk \'/MemAvailable/ {n = int($2 / 9437184); '
            'print (n > 0 ? n : 1)}\' /proc/meminfo)}"')
ARCHS = SOURCE_ARCHS["flash-attn"]


def flash_attn_cuda_archs(gpus: tuple[str, ...]) -> str:
    """``sm_80, sm_89, sm_100, sm_103`` -> ``80;100`` (FLASH_ATTN_CUDA_ARCHS): each GPU's
    generation as flash-attn's setup names it. A GPU it builds nothing for is refused (``check``
    says so first, naming file:line:key)."""
    return ARCHS.arch_list(gpus)


def env(target: Target) -> Env:
    return [("FLASH_ATTENTION_FORCE_BUILD", "TRUE"),
            (ARCHS.variable, f'"{flash_attn_cuda_archs(target.gpus)}"'),
            ("MAX_JOBS", MAX_JOBS)]


BLOCK = register(Block("flash-attn", env=env, notes=NOTES))
