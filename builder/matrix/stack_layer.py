"""Stack layers: a stack a target switches on with a matrix key of the layer's name
(``megatron: {...}``), as the catalogue describes it (``layers:`` in
builder/catalog/packages.yaml; docs/catalog.md).

The catalogue says what a layer is: verl's extra it follows (and the extras it refuses, with the
reason), the keys its matrix entry takes, and the distributions it adds to the target's own (a
package the target pins itself wins, so a site can move one pin or give it ``prebuilt:``
wheels), each with the module the gate imports. This module holds only the mechanics, and names
no package.

Pure data in, data out: :mod:`builder.matrix.spec` parses what :func:`packages` returns with its
own rules, so every error still names file:line:key.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from builder import catalog
from builder.catalog import StackLayer


class LayerError(ValueError):
    """A bad layer entry: ``key`` is the sub-key under the layer's key ('' for itself)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def kind(name: str) -> StackLayer:
    """The catalogue's layer called ``name`` (the matrix key that switches it on)."""
    found = catalog.shipped().layers.get(name)
    if found is None:
        raise LayerError("", f"no stack layer {name!r} in the catalogue")
    return found


def names() -> tuple[str, ...]:
    """The matrix keys that switch a layer on."""
    return tuple(catalog.shipped().layers)


@dataclass(frozen=True)
class Layer:
    """The layer as the matrix states it (the canonical form ``list --json`` shows)."""

    value: dict[str, Any]
    name: str = ""  # the layer's key (its catalogue entry)

    @property
    def extra(self) -> str:
        return str(self.value["extra"])

    def summary(self) -> str:
        """One line for listings: what the layer pins."""
        spec = kind(self.name)
        parts = [f"verl[{self.extra}]"]
        for key, label in spec.summary.items():
            v = self.value.get(key)
            if key in spec.versions:
                parts.append(f"{label} {v}")
            elif isinstance(v, dict) and v.get("enabled", True):
                parts.append(label)
        return ", ".join(parts)


def _version(value: Any, key: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str) or not value.strip():
        raise LayerError(key, "write the version as a quoted string")
    return value


def _mapping(value: Any, key: str, allowed: Iterable[str]) -> dict[str, Any]:
    allowed = sorted(allowed)
    if not isinstance(value, dict):
        got = "an empty value" if value is None else repr(value)
        raise LayerError(key, f"expected a mapping ({', '.join(allowed)}), got {got}")
    for k in value:
        if k not in allowed:
            raise LayerError(f"{key}.{k}" if key else str(k),
                             f"unknown key {k!r} (allowed: {', '.join(allowed)})")
    return value


def parse(value: Any, name: str) -> Layer:
    """Check the layer's own shape (the packages it makes are checked by the spec)."""
    spec = kind(name)
    layer = _mapping(value, "", spec.keys)
    extra = layer.get("extra", spec.extras[0])
    if extra in spec.refused_extras:
        raise LayerError("extra", spec.refused_extras[extra])
    if extra not in spec.extras:
        raise LayerError("extra", f"must be one of {', '.join(spec.extras)} (verl's extra the "
                         "layer follows)")
    for req in spec.versions:
        if req not in layer:
            raise LayerError("", f"missing key {req!r}")
        _version(layer[req], req)
    for key, option in spec.options.items():
        if key in layer:
            entry = _mapping(layer[key], key, option.keys)
            if any(r not in entry for r in option.required):
                raise LayerError(key, option.refusal or "missing key "
                                 f"{next(r for r in option.required if r not in entry)!r}")
    return Layer({"extra": extra, **{k: v for k, v in layer.items() if k != "extra"}}, name)


def cuda_major(cuda: str | None, name: str) -> str:
    """The CUDA major version a per-major wheel is named after (cu12, cu13)."""
    spec = kind(name)
    if not cuda:
        raise LayerError("", f"the {spec.title} layer is for cuda targets: {spec.needs_cuda}")
    return cuda.split(".")[0]


def packages(layer: Layer, cuda: str | None) -> dict[str, tuple[str, Any]]:
    """The packages the layer adds: name -> (the layer key it comes from, the value as the
    matrix writes a package under ``packages:``)."""
    spec, v = kind(layer.name), layer.value
    major = cuda_major(cuda, layer.name) if spec.needs_cuda else ""
    known = catalog.shipped()
    out: dict[str, tuple[str, Any]] = {}
    for p in spec.packages:
        if p.optional and p.source not in v:
            continue
        given = v.get(p.source, {})
        entry: dict[str, Any] = dict(given) if isinstance(given, dict) else {"version": given}
        if p.version_from:
            entry["version"] = v[p.version_from]
        if p.build:
            entry["build"] = p.build
        if p.imported:
            entry["import"] = known.import_name(p.name)
        name = p.name.format(cuda_major=major)
        out[name] = (p.source, entry["version"] if list(entry) == ["version"] else entry)
    return out


def imported(name: str) -> frozenset[str]:
    """The distributions of layer ``name`` the gate imports."""
    return frozenset(p.name for p in kind(name).packages if p.imported)


def imports(packages: Iterable[Any], name: str) -> dict[str, str]:
    """What the gate imports of the layer's packages (distribution -> module; ``packages``: the
    target's enabled :class:`builder.matrix.spec.Package` objects)."""
    wanted = imported(name)
    return {p.name: p.module for p in packages if p.name in wanted}


def verl_value(value: Any, extra: str) -> Any:
    """verl's entry with the layer's extra added to its extras."""
    entry = dict(value) if isinstance(value, dict) else {"version": value}
    extras = entry.get("extras", [])
    if isinstance(extras, list) and extra not in extras:
        entry["extras"] = [*extras, extra]
    return entry
