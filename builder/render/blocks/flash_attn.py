"""flash-attn from source: forced (its setup.py would download an unhashed prebuilt wheel), for
the target's GPUs in flash-attn's own architecture names, with as many compile jobs as the build
host's memory allows."""

from __future__ import annotations

from builder.render.blocks.base import Block, Env, register
from builder.spec import Target

NOTES = (
    "flash-attn: FLASH_ATTENTION_FORCE_BUILD (its setup.py would otherwise download an unhashed",
    "prebuilt wheel), for the target's gpus, with as many jobs as the build host's memory allows",
    "(about 9 GB each).")
# one job per 9 GiB (9437184 KiB) of available memory, at least one
MAX_JOBS = ('"${MAX_JOBS:-$(awk \'/MemAvailable/ {n = int($2 / 9437184); '
            'print (n > 0 ? n : 1)}\' /proc/meminfo)}"')


def flash_attn_cuda_archs(gpus: tuple[str, ...]) -> str:
    """``sm_80, sm_100, sm_103`` -> ``80;100`` (FLASH_ATTN_CUDA_ARCHS). flash-attn 2.8's setup.py
    knows 80, 90, 100, 110 and 120 and builds Blackwell per family (``compute_100f``: sm_100
    and sm_103 alike), so a Blackwell GPU names its family; other values it would ignore."""
    out = []
    for g in gpus:
        digits = g[3:].rstrip("af")
        out.append(digits[:-1] + "0" if int(digits) >= 100 else digits)
    return ";".join(dict.fromkeys(out))


def env(target: Target) -> Env:
    return [("FLASH_ATTENTION_FORCE_BUILD", "TRUE"),
            ("FLASH_ATTN_CUDA_ARCHS", f'"{flash_attn_cuda_archs(target.gpus)}"'),
            ("MAX_JOBS", MAX_JOBS)]


BLOCK = register(Block("flash-attn", env=env, notes=NOTES))
