"""The Megatron layer: verl's ``mcore`` stack as matrix data a CUDA target switches on.

A target that says ``megatron: {...}`` gets these packages added to its own (a package the
target pins itself wins, so a site can move one pin or give it ``prebuilt:`` wheels):

- ``megatron-core`` (imported as ``megatron.core``) and ``mbridge``, as verl 0.9.1's ``mcore``
  extra takes them (verl's ``megatron`` extra cannot be resolved from the index: it pins
  ``megatron-bridge==0.5.2``, which is not published there; docs/megatron.md);
- TransformerEngine in its three distributions: ``transformer-engine`` (the Python package,
  imported as ``transformer_engine.pytorch``), its core library wheel
  ``transformer-engine-cu<CUDA major>`` (the GPU kernels, held to the target's ``gpus`` by the
  coverage phase) and its torch extension ``transformer-engine-torch``, an sdist only, built
  from source against the image's torch (:mod:`builder.render.blocks.transformer_engine`) or
  taken from hashed ``prebuilt:`` wheels (:mod:`builder.resolve.prebuilt`);
- ``apex`` from a commit-pinned source, only when the layer names one (verl uses apex's fused
  RMSNorm in its legacy Megatron model code only).

Pure data in, data out: :mod:`builder.matrix.spec` parses what :func:`packages` returns with its own
rules, so every error still names file:line:key.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# verl's extras this layer can follow; ``megatron`` is refused with the reason (above).
EXTRAS = ("mcore",)
LAYER_KEYS = {"extra", "megatron-core", "mbridge", "transformer-engine",
              "transformer-engine-torch", "apex"}
# what the gate imports per distribution (the manifest's ``imports``)
IMPORTS = {"megatron-core": "megatron.core", "mbridge": "mbridge",
           "transformer-engine": "transformer_engine.pytorch",
           "transformer-engine-torch": "transformer_engine_torch", "apex": "apex"}
# keys of the torch extension's entry (a mapping merged into its package)
EXTENSION_KEYS = {"prebuilt", "enabled", "source"}
APEX_KEYS = {"version", "source", "enabled"}


class LayerError(ValueError):
    """A bad ``megatron:`` entry: ``key`` is the sub-key under ``megatron`` ('' for itself)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Layer:
    """The layer as the matrix states it (the canonical form ``list --json`` shows)."""

    value: dict[str, Any]

    @property
    def extra(self) -> str:
        return str(self.value.get("extra", "mcore"))

    def summary(self) -> str:
        """One line for listings: what the layer pins."""
        v = self.value
        parts = [f"verl[{self.extra}]", f"megatron-core {v['megatron-core']}",
                 f"mbridge {v['mbridge']}", f"TransformerEngine {v['transformer-engine']}"]
        apex = v.get("apex")
        if isinstance(apex, dict) and apex.get("enabled", True):
            parts.append("apex")
        return ", ".join(parts)


def _version(value: Any, key: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str) or not value.strip():
        raise LayerError(key, "write the version as a quoted string")
    return value


def _mapping(value: Any, key: str, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise LayerError(key, f"expected a mapping ({', '.join(sorted(allowed))})")
    for k in value:
        if k not in allowed:
            raise LayerError(f"{key}.{k}" if key else str(k),
                             f"unknown key {k!r} (allowed: {', '.join(sorted(allowed))})")
    return value


def parse(value: Any) -> Layer:
    """Check the layer's own shape (the packages it makes are checked by the spec)."""
    layer = _mapping(value, "", LAYER_KEYS)
    extra = layer.get("extra", "mcore")
    if extra == "megatron":
        raise LayerError("extra", "verl 0.9.1's megatron extra cannot be resolved from the "
                         "index (it pins megatron-bridge==0.5.2, which is not published "
                         "there): follow its mcore extra (docs/megatron.md)")
    if extra not in EXTRAS:
        raise LayerError("extra", f"must be one of {', '.join(EXTRAS)} (verl's extra the "
                         "layer follows)")
    for req in ("megatron-core", "mbridge", "transformer-engine"):
        if req not in layer:
            raise LayerError("", f"missing key {req!r}")
        _version(layer[req], req)
    if "transformer-engine-torch" in layer:
        _mapping(layer["transformer-engine-torch"], "transformer-engine-torch", EXTENSION_KEYS)
    if "apex" in layer:
        apex = _mapping(layer["apex"], "apex", APEX_KEYS)
        if "source" not in apex or "version" not in apex:
            raise LayerError("apex", "apex is built from a commit-pinned source: give its "
                             "version and source (git+https://HOST/apex@COMMIT, a path or "
                             "{url, sha256}); the index's 'apex' is another project")
    return Layer({"extra": extra, **{k: v for k, v in layer.items() if k != "extra"}})


def cuda_major(cuda: str | None) -> str:
    """TransformerEngine's core wheel is per CUDA major version (cu12, cu13)."""
    if not cuda:
        raise LayerError("", "the Megatron layer is for cuda targets: TransformerEngine's core "
                         "wheels are built per CUDA major version")
    return cuda.split(".")[0]


def packages(layer: Layer, cuda: str | None) -> dict[str, tuple[str, Any]]:
    """The packages the layer adds: name -> (the layer key it comes from, the value as the
    matrix writes a package under ``packages:``)."""
    v = layer.value
    te = v["transformer-engine"]
    out: dict[str, tuple[str, Any]] = {
        "megatron-core": ("megatron-core", {"version": v["megatron-core"],
                                            "import": IMPORTS["megatron-core"]}),
        "mbridge": ("mbridge", {"version": v["mbridge"], "import": IMPORTS["mbridge"]}),
        "transformer-engine": ("transformer-engine", {
            "version": te, "import": IMPORTS["transformer-engine"]}),
        f"transformer-engine-cu{cuda_major(cuda)}": ("transformer-engine", te),
        "transformer-engine-torch": ("transformer-engine-torch", {
            **v.get("transformer-engine-torch", {}), "version": te, "build": "source",
            "import": IMPORTS["transformer-engine-torch"]}),
    }
    if "apex" in v:
        out["apex"] = ("apex", {**v["apex"], "build": "source", "import": IMPORTS["apex"]})
    return out


def imports(packages: Iterable[Any]) -> dict[str, str]:
    """What the gate imports of the layer's packages (distribution -> module; ``packages``: the
    target's enabled :class:`builder.matrix.spec.Package` objects)."""
    return {p.name: p.module for p in packages if p.name in IMPORTS}


def verl_value(value: Any, extra: str) -> Any:
    """verl's entry with the layer's extra added to its extras."""
    entry = dict(value) if isinstance(value, dict) else {"version": value}
    extras = entry.get("extras", [])
    if isinstance(extras, list) and extra not in extras:
        entry["extras"] = [*extras, extra]
    return entry
