"""The upstream catalogue: what verl-env knows about each distribution it installs (import
modules, native code, source-build parameters, GPU-arch mapping, ABI loader rules, SBOM
prominence, notes), the rollout engines and the stack layers, as reviewed data
(``packages.yaml`` beside this module, checked against ``catalog.schema.json``).

A site extends or corrects it with ``catalog.yaml`` beside its matrix (same shape): entries are
merged per distribution and engine, the site's keys winning. This module is the one reader; code
elsewhere asks it, and names no package itself.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from builder import yamldoc
from builder.errors import CatalogError

HERE = Path(__file__).resolve().parent
SHIPPED = HERE / "packages.yaml"
SCHEMA = HERE / "catalog.schema.json"
SITE_FILE = "catalog.yaml"


@dataclass(frozen=True)
class Archs:
    """How a source build's architecture variable is spelled from the target's GPUs: one value
    per GPU generation (``sm_90`` -> generation 9)."""

    family: str
    version: str
    variable: str
    generations: Mapping[int, str]


@dataclass(frozen=True)
class Distribution:
    name: str
    module: str  # what ``import`` takes (the first of ``import``)
    native: bool = False
    sbom: str = "normal"
    block: str | None = None  # its source-build block (builder.render.blocks.<block>)
    extensions: tuple[tuple[str, ...], ...] = ()  # imported explicitly, first that exists
    archs: Archs | None = None
    abi: Mapping[str, Any] = field(default_factory=dict)  # loader rules (the self-test's model)
    notes: str = ""
    # what the gate runs of it in the image: check name -> {"code": Python that raises when the
    # package misbehaves, "pass": the reason recorded when it does not}
    checks: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    imported: bool = False  # the entry names its ``import``: the gate imports it when pinned
    # ``locked: true``: imported wherever the target's lock installs it, pinned or not (the
    # packages verl's extras declare: builder.resolve.extras)
    when_locked: bool = False


@dataclass(frozen=True)
class Engine:
    """A rollout engine verl drives: ``name`` is verl's ``rollout.name``."""

    name: str
    distribution: str
    module: str
    default: bool = False
    installable: bool = True
    # verl trainer overrides per accelerator family (appended to the Slurm job's command)
    trainer_overrides: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class LayerOption:
    """An optional mapping key of a stack layer: its allowed sub-keys, those it must have, and
    what to say when one is missing."""

    keys: tuple[str, ...]
    required: tuple[str, ...] = ()
    refusal: str = ""


@dataclass(frozen=True)
class LayerPackage:
    """A distribution a stack layer adds to its target's packages."""

    name: str  # may hold ``{cuda_major}`` (a wheel per CUDA major version)
    source: str  # the layer key its value comes from (a version string or a mapping)
    version_from: str | None = None  # the layer key whose version it takes instead
    build: str | None = None  # ``source``: built from source (its block)
    imported: bool = True  # the gate imports it (its catalogue ``import:``)
    optional: bool = False  # added only when the layer has its key


@dataclass(frozen=True)
class StackLayer:
    """A stack a target switches on with a matrix key of the layer's name (``megatron:``)."""

    name: str
    title: str
    extras: tuple[str, ...]  # verl's extras the layer can follow; the first is the default
    refused_extras: Mapping[str, str]  # extra -> why it is refused
    versions: tuple[str, ...]  # required keys, each a quoted version string
    options: Mapping[str, LayerOption]
    packages: tuple[LayerPackage, ...]
    summary: Mapping[str, str]  # layer key -> its label in listings
    needs_cuda: str = ""  # why the layer is for cuda targets only ('' : any target)

    @property
    def keys(self) -> frozenset[str]:
        """Every key the layer's matrix entry may have."""
        return frozenset({"extra", *self.versions, *self.options})


@dataclass(frozen=True)
class Catalog:
    required: tuple[str, ...]
    distributions: Mapping[str, Distribution]
    engines: Mapping[str, Engine]
    layers: Mapping[str, StackLayer]
    sources: tuple[str, ...]  # the files read, shipped first

    def get(self, name: str) -> Distribution | None:
        return self.distributions.get(name)

    def import_name(self, name: str) -> str:
        """The module a distribution is imported as (its name with ``-`` as ``_`` when the
        catalogue does not say)."""
        d = self.distributions.get(name)
        return d.module if d else name.replace("-", "_")

    def imported(self, name: str) -> bool:
        """Whether the gate imports the distribution when a target pins or provides it (its
        entry names an ``import``; an entry kept only for its ABI rules does not)."""
        d = self.distributions.get(name)
        return d is not None and d.imported

    def imported_when_locked(self, name: str) -> bool:
        """Whether the gate imports the distribution wherever the lock installs it."""
        d = self.distributions.get(name)
        return d is not None and d.when_locked

    def checks(self, names: Iterable[str]) -> dict[str, dict[str, dict[str, str]]]:
        """The gate's checks of the distributions ``names`` that have any, as the image
        manifest's ``checks`` section (distribution -> check name -> code and pass reason)."""
        return {n: {c: dict(v) for c, v in sorted(d.checks.items())}
                for n in sorted(set(names)) if (d := self.get(n)) is not None and d.checks}

    def prominent(self) -> frozenset[str]:
        """The distributions an SBOM summary shows first."""
        return frozenset(n for n, d in self.distributions.items() if d.sbom == "prominent")

    def abi_loader(self, names: Iterable[str] | None = None) -> dict[str, Any]:
        """The ABI loader rules of the distributions ``names`` (None: every one), merged as
        the image manifest's ``abi_loader`` section: ``loads`` (object glob -> libraries
        loaded first), ``alternatives`` (each with its ``package``) and torch's ``preload``
        names; {} when none has rules."""
        loads: dict[str, list[dict[str, Any]]] = {}
        alternatives: list[dict[str, Any]] = []
        preload: dict[str, str] = {}
        for name in sorted(set(self.distributions if names is None else names)):
            d = self.get(name)
            if d is None or not d.abi:
                continue
            for pattern, libs in d.abi.get("loads", {}).items():
                loads.setdefault(pattern, []).extend(
                    {"lib": [lib["lib"]] if isinstance(lib["lib"], str) else list(lib["lib"]),
                     "global": lib["global"]} for lib in libs)
            alternatives += [{"package": name, **alt} for alt in d.abi.get("alternatives", ())]
            preload.update(d.abi.get("preload", {}))
        return {**({"loads": loads} if loads else {}),
                **({"alternatives": alternatives} if alternatives else {}),
                **({"preload": preload} if preload else {})}

    def engine_names(self) -> tuple[str, ...]:
        return tuple(n for n, e in self.engines.items() if e.installable)

    def default_engine(self) -> Engine:
        return next(e for e in self.engines.values() if e.default)

    def trainer_overrides(self, family: str) -> tuple[str, ...]:
        """The verl trainer overrides the engines ask for on ``family`` (all engines: the
        command is the family's, whichever engine a target has)."""
        return tuple(o for e in self.engines.values() for o in e.trainer_overrides.get(family, ()))

    def engine_of(self, distributions: set[str] | frozenset[str]) -> Engine | None:
        """The installable engine whose distribution is among ``distributions``."""
        return next((e for e in self.engines.values()
                     if e.installable and e.distribution in distributions), None)


def _schema() -> dict[str, Any]:
    return json.loads(SCHEMA.read_text(encoding="utf-8"))


def _read(path: Path) -> dict[str, Any]:
    doc = yamldoc.read(path, "catalogue", CatalogError)
    yamldoc.validate(doc, _schema(), CatalogError)
    _compile_checks(doc)
    return doc.data


def _compile_checks(doc: yamldoc.Doc) -> None:
    """A gate check's code must at least be Python: refused with the file, not in an image."""
    for name, e in doc.data.get("distributions", {}).items():
        for check, entry in e.get("checks", {}).items():
            key = f"distributions.{name}.checks.{check}.code"
            try:
                compile(entry["code"], f"<catalogue {name}.{check}>", "exec")
            except SyntaxError as err:
                raise CatalogError(f"not Python: {err.msg} (line {err.lineno} of the code)",
                                   file=doc.file, line=doc.line(key), key=key) from None


def _merge(base: dict[str, Any], site: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key in ("distributions", "engines", "layers"):
        merged = {k: dict(v) if isinstance(v, dict) else v for k, v in base.get(key, {}).items()}
        for name, entry in site.get(key, {}).items():
            merged[name] = {**merged.get(name, {}), **entry}
        out[key] = merged
    if "required" in site:
        out["required"] = site["required"]
    return out


def _distribution(name: str, e: dict[str, Any]) -> Distribution:
    a = e.get("archs")
    archs = Archs(a["family"], a["version"], a["variable"],
                  MappingProxyType({int(k): v for k, v in a["generations"].items()})) if a else None
    return Distribution(
        name=name, module=e.get("import", name.replace("-", "_")), native=e.get("native", False),
        sbom=e.get("sbom", "normal"), block=e.get("block"),
        extensions=tuple(tuple(x) for x in e.get("extensions", ())), archs=archs,
        abi=MappingProxyType(dict(e.get("abi", {}))), notes=e.get("notes", ""),
        checks=MappingProxyType({k: MappingProxyType(dict(v))
                                 for k, v in e.get("checks", {}).items()}),
        imported="import" in e, when_locked=bool(e.get("locked", False)) and "import" in e)


def _engine(name: str, e: dict[str, Any]) -> Engine:
    overrides = {f: tuple(v) for f, v in e.get("trainer_overrides", {}).items()}
    return Engine(name=name, **{k: v for k, v in e.items() if k != "trainer_overrides"},
                  trainer_overrides=MappingProxyType(overrides))


def _layer(name: str, e: dict[str, Any]) -> StackLayer:
    options = {k: LayerOption(tuple(o["keys"]), tuple(o.get("required", ())),
                              o.get("refusal", "")) for k, o in e.get("options", {}).items()}
    packages = tuple(LayerPackage(
        name=n, source=p.get("from", n), version_from=p.get("version"), build=p.get("build"),
        imported=p.get("import", True), optional=p.get("optional", False))
        for n, p in e.get("packages", {}).items())
    return StackLayer(
        name=name, title=e.get("title", name), extras=tuple(e["extras"]),
        refused_extras=MappingProxyType(dict(e.get("refused_extras", {}))),
        versions=tuple(e.get("versions", ())), options=MappingProxyType(options),
        packages=packages, summary=MappingProxyType(dict(e.get("summary", {}))),
        needs_cuda=e.get("needs_cuda", ""))


def build(data: dict[str, Any], sources: tuple[str, ...]) -> Catalog:
    engines = {n: _engine(n, e) for n, e in data.get("engines", {}).items()}
    defaults = [n for n, e in engines.items() if e.default]
    if len(defaults) != 1:
        raise CatalogError(f"exactly one engine must be the default (found: "
                           f"{', '.join(defaults) or 'none'})", file=sources[-1], key="engines")
    return Catalog(
        required=tuple(data.get("required", ())),
        distributions=MappingProxyType({n: _distribution(n, e)
                                        for n, e in data.get("distributions", {}).items()}),
        engines=MappingProxyType(engines),
        layers=MappingProxyType({n: _layer(n, e) for n, e in data.get("layers", {}).items()}),
        sources=sources)


@functools.lru_cache(maxsize=8)
def load(site_dir: Path | None = None) -> Catalog:
    """The shipped catalogue, extended by ``site_dir/catalog.yaml`` when there is one."""
    data = _read(SHIPPED)
    sources = (str(SHIPPED),)
    site = site_dir / SITE_FILE if site_dir is not None else None
    if site is not None and site.is_file():
        data = _merge(data, _read(site))
        sources += (str(site),)
    return build(data, sources)


def shipped() -> Catalog:
    """The catalogue as shipped (no site extension)."""
    return load(None)
