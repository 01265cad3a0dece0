"""Source-build blocks, one module per package that needs more than the common variables
(:mod:`builder.render.blocks.base`). A new source package is a new module here, listed below,
plus its data in the matrix; the render code names no package."""

from __future__ import annotations

from builder.render.blocks import apex, flash_attn, tensordict, transformer_engine
from builder.render.blocks.base import REGISTRY, Block, block_for, common_env, register

__all__ = ["REGISTRY", "Block", "apex", "block_for", "common_env", "flash_attn", "register",
           "tensordict", "transformer_engine"]
