"""Source-build blocks, one module per package that needs more than the common variables
(:mod:`builder.render.blocks.base`). A new source package is a new module here (it registers
itself; the catalogue's ``block:`` names it) plus its data in the matrix; every module of this
package is imported here, so the render code names no package."""

from __future__ import annotations

import importlib
import pkgutil

from builder.render.blocks.base import REGISTRY, Block, block_for, common_env, register


def _load_all() -> tuple[str, ...]:
    """Import every block module of this package (each registers its block)."""
    names = tuple(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base")
    for name in names:
        importlib.import_module(f"{__name__}.{name}")
    return names


MODULES = _load_all()

__all__ = ["MODULES", "REGISTRY", "Block", "block_for", "common_env", "register"]
