"""The registry of source-build blocks (hpccm's building blocks): what one package's build from
source needs beyond what every source build gets (:func:`common_env`), found by package name.

A block is data plus small functions of the target: the variables its build reads and the
comment lines the Dockerfile carries above its stage. A package without a block builds with the
common variables alone.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from builder.matrix import families, grammar
from builder.matrix.spec import Package, Target

Env = list[tuple[str, str]]  # (variable, value as the Dockerfile writes it)


def venv_site(target: Target) -> str:
    """The image venv's site-packages (the templates create the venv at /opt/venv)."""
    return f"/opt/venv/lib/python{target.python}/site-packages"


def _no_env(target: Target) -> Env:
    return []


@dataclass(frozen=True)
class Block:
    """How the package ``name`` is built from source."""

    name: str
    env: Callable[[Target], Env] = _no_env  # variables after the common ones, in this order
    notes: tuple[str, ...] = ()  # comment lines above the package's stage


REGISTRY: dict[str, Block] = {}


def register(block: Block) -> Block:
    """Add ``block`` to the registry (one block per package name)."""
    if block.name in REGISTRY:
        raise ValueError(f"a source-build block for {block.name} is registered already")
    REGISTRY[block.name] = block
    return block


def block_for(package: str) -> Block:
    """The registered block of ``package``, or a block that adds nothing."""
    return REGISTRY.get(package) or Block(package)


def torch_cuda_arch_list(gpus: tuple[str, ...]) -> str:
    """``sm_80, sm_103, sm_90a`` -> ``8.0;10.3;9.0a`` (torch's cpp_extension reads it)."""
    return ";".join(families.torch_arch(g) for g in gpus)


def gpu_env(target: Target) -> Env:
    """What a source build compiles GPU code for, all from the one ``gpus:`` list."""
    if target.accelerator == "cuda":
        return [("TORCH_CUDA_ARCH_LIST", f'"{torch_cuda_arch_list(target.gpus)}"')]
    if target.accelerator == "rocm":
        return [("PYTORCH_ROCM_ARCH", f'"{";".join(target.gpus)}"')]
    return []


def common_env(target: Target, package: Package) -> Env:
    """What every source build gets: CMake finds pybind11 through its own cmake dir, GPU code for
    the target's gpus, and setuptools-scm told the version (sources carry no .git)."""
    scm = grammar.env_name("SETUPTOOLS_SCM_PRETEND_VERSION_FOR_"
                           + re.sub(r"[-_.]+", "_", package.name).upper())
    return [("pybind11_DIR", '"$(/opt/venv/bin/python -m pybind11 --cmakedir)"'),
            *gpu_env(target), (scm, shlex.quote(package.version))]
