"""tensordict from source: a C++ extension built with CMake against the torch of the lock. The
common variables are all it needs (pybind11's cmake dir, the GPU list, its version for
setuptools-scm); the block says so, and is where anything of its own would go."""

from __future__ import annotations

from builder.render.blocks.base import Block, register

BLOCK = register(Block("tensordict"))
