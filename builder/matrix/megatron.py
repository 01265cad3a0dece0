"""The matrix's ``megatron:`` key: the stack layer of that name (the catalogue's
``layers: megatron:``; docs/megatron.md), through the generic mechanics of
:mod:`builder.matrix.layers`. Kept for :mod:`builder.matrix.spec` and
:mod:`builder.render.baked`, which call ``megatron.parse/packages/imports/verl_value``; once
they ask :mod:`builder.matrix.layers` by the layer's key this module can go."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from builder.matrix.layers import Layer, LayerError, verl_value
from builder.matrix import layers

# this module is the layer whose matrix key is its own name
NAME = __name__.rpartition(".")[2]

__all__ = ["NAME", "Layer", "LayerError", "cuda_major", "imports", "packages", "parse",
           "verl_value"]


def parse(value: Any) -> Layer:
    return layers.parse(value, NAME)


def cuda_major(cuda: str | None) -> str:
    return layers.cuda_major(cuda, NAME)


def packages(layer: Layer, cuda: str | None) -> dict[str, tuple[str, Any]]:
    return layers.packages(layer, cuda)


def imports(packages: Iterable[Any]) -> dict[str, str]:
    return layers.imports(packages, NAME)
