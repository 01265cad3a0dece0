"""The matrix model: a tree of frozen dataclasses (a target, its base, its pinned packages and
their sources), what :mod:`builder.matrix.spec` returns for a valid ``matrix.yaml``.

Package names that carry meaning (the rollout engines, a distribution's import module) come from
the upstream catalogue (:mod:`builder.catalog`), never from here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from builder import catalog, yamldoc
from builder.errors import SpecError
from builder.matrix import grammar
from builder.matrix import stack_layer
from builder.matrix.stack_layer import Layer
from builder.matrix.overrides import Override

ARCHES = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}


def engine_distributions() -> tuple[str, ...]:
    """The distributions of the rollout engines a target can install (the catalogue's)."""
    return tuple(e.distribution for e in catalog.shipped().engines.values() if e.installable)


@dataclass(frozen=True)
class Source:
    """Where a source build gets its code: a git URL (``git+https://HOST/REPO@TAG``, pinned to
    a commit by ``lock``: builder.resolve.sources), a local
    directory or archive (``path``, relative to the matrix file; firewalled build hosts), or an
    archive ``url`` with its ``sha256``. Local and URL sources are copied into the build context."""

    kind: str  # git | path | url
    location: str  # a path source: resolved, absolute
    sha256: str = ""
    #: a path source as the matrix wrote it (relative to the matrix file, or as given to --set):
    #: what the canonical entry and its hash carry, so that they do not depend on where the
    #: checkout lies (the files themselves reach the content tag through the build context)
    written: str = field(default="", compare=False)

    def to_value(self) -> Any:
        if self.kind == "git":
            return self.location
        where = self.written or self.location if self.kind == "path" else self.location
        return {self.kind: where, **({"sha256": self.sha256} if self.sha256 else {})}


@dataclass(frozen=True)
class Package:
    """One pinned distribution. ``build='source'`` builds it from its sdist inside the image."""

    name: str
    version: str
    extras: tuple[str, ...] = ()
    build: str = "wheel"
    enabled: bool = True
    import_name: str = ""
    line: int | None = None
    source: Source | None = None  # where a source build gets its code; default: the sdist
    # hashed wheels tried before a source build (builder.resolve.prebuilt): {url, sha256, python, arch}
    # or {wheelhouse: DIR_OR_INDEX_URL}
    prebuilt: tuple[dict[str, str], ...] = ()

    @property
    def requirement(self) -> str:
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        return f"{self.name}{extras}=={self.version}"

    @property
    def module(self) -> str:
        return self.import_name or catalog.shipped().import_name(self.name)


@dataclass(frozen=True)
class Base:
    image: str
    digest: str | None = None
    glibc: str | None = None
    source_image: str | None = None  # a -devel variant for source builds (nvcc, headers)
    vendor: str | None = None  # probe | declared: the base provides packages (builder.resolve.vendor)
    interpreter: str | None = None  # declared vendor bases: the base's python (else probed)
    sources: tuple[str, ...] = ()  # declared vendor bases: where the declared facts come from
    # an image for the build machine's platform whose python byte-compiles the image's modules
    # natively (dockerfiles/native_bytecode.py), not emulated in a cross-build
    bytecode_image: str | None = None

    @property
    def pinned_digest(self) -> str | None:
        """The digest the base is pinned by: ``digest:``, or the one in ``image``
        (``name:tag@sha256:...``); None when the base is pinned by tag only."""
        return self.digest or grammar.parse_oci_reference(self.image).digest

    @property
    def ref(self) -> str:
        """The reference to build FROM: pinned by digest when one is declared."""
        if self.digest:
            return f"{self.image.split('@')[0]}@{self.digest}"
        return self.image


@dataclass(frozen=True)
class Target:
    name: str
    accelerator: str
    arch: str
    base: Base
    python: str
    packages: tuple[Package, ...]
    provided: tuple[Package, ...] = ()
    cuda: str | None = None
    rocm: str | None = None
    description: str = ""
    find_links: tuple[str, ...] = ()
    apt: tuple[str, ...] = ()
    file: str = "matrix.yaml"
    lines: dict[str, int] = field(default_factory=dict, compare=False, hash=False)
    override: bool = False
    # The GPUs the image must run on (sm_90, gfx942 ...): drive source builds' arch lists and
    # the gate's device-code coverage. Empty for cpu targets.
    gpus: tuple[str, ...] = ()
    # Extra requirements of the source-build stage (an nvcc from the index where the base has
    # none), locked with the build tools; never in the final image.
    build_tools: tuple[str, ...] = ()
    # Reviewed exceptions to the device-code coverage: a library path glob (relative to the
    # site directory, e.g. vllm/_flashmla_C*.so) -> why it may lack code for some declared GPUs
    # (arch-specific kernels the package loads only where they were built for).
    coverage_allow: tuple[tuple[str, str], ...] = ()
    # Reviewed exceptions to the gate's symbol-level ABI phase: a shared-object path glob
    # (relative to the site directory) -> what is lost without the library it cannot load
    # (a system library the image does not ship, for an optional path of the package).
    abi_allow: tuple[tuple[str, str], ...] = ()
    # The interpreter's shared library (libpython3.X.so.1.0) installed beside a statically
    # linked python3.X, under whichever name the base's suite gives the package
    # (libpython3.12t64 on Ubuntu 24.04, libpython3.11 on Debian 12): extensions that link it
    # (cuda.tile) load only with it. Follows ``python`` (and ``--set python=``).
    shared_libpython: bool = False
    # Reviewed exceptions to the gate's one-owner-per-file check (abi.records): a path glob
    # (relative to the site directory) two distributions' RECORDs may both claim -> why.
    record_shared: tuple[tuple[str, str], ...] = ()
    # Reviewed dependency overrides (builder.matrix.overrides): a version forced over what other
    # packages declare, each with its reason; uv's --override in `build-env lock`.
    overrides: tuple[Override, ...] = ()
    # Reviewed exceptions to the extras the target's packages ask for (verl[vllm,fsdp] ...): a
    # distribution an extra declares that the lock may lack or hold at another version -> why
    # (not on the index, no source here, built from its own source block ...). Left out of the
    # resolution (uv's --excludes); any other difference fails `check` (builder.resolve.extras).
    extras_exceptions: tuple[tuple[str, str], ...] = ()
    # The stack layer the target switches on (the catalogue's ``layers:``, named by its matrix
    # key; builder.matrix.stack_layer); its packages are in ``packages`` already.
    layer: Layer | None = None

    @property
    def platform(self) -> str:
        return ARCHES[self.arch]

    @property
    def enabled_packages(self) -> tuple[Package, ...]:
        return tuple(p for p in self.packages if p.enabled)

    def package(self, name: str) -> Package | None:
        name = canonicalize_name(name)
        for p in (*self.packages, *self.provided):
            if p.name == name:
                return p
        return None

    @property
    def engine(self) -> Package | None:
        for name in engine_distributions():
            p = self.package(name)
            if p is not None and p.enabled:
                return p
        return None

    def line(self, key: str) -> int | None:
        """The line of a dotted key inside this target, else of its parent key, else of the
        target itself (best effort)."""
        return (self.lines.get(key) or self.lines.get(key.rsplit(".", 1)[0])
                or self.lines.get("") or None)

    def where(self, key: str) -> str:
        """``file:line`` for a dotted key inside this target (best effort)."""
        line = self.line(key)
        return f"{self.file}:{line}" if line else self.file

    def error(self, key: str, message: str) -> SpecError:
        """``file:line: targets.T.KEY: message`` for a dotted key inside this target (exit 2)."""
        return SpecError(message, file=self.file, line=self.line(key),
                         key=f"targets.{self.name}.{key}", target=self.name)

    def to_dict(self) -> dict[str, Any]:
        """Canonical, order-stable form used for hashing and for ``list --json``."""

        def pkg(p: Package) -> dict[str, Any]:
            d: dict[str, Any] = {"version": p.version}
            if p.extras:
                d["extras"] = list(p.extras)
            if p.build != "wheel":
                d["build"] = p.build
            if not p.enabled:
                d["enabled"] = False
            if p.source:
                d["source"] = p.source.to_value()
            if p.prebuilt:
                d["prebuilt"] = [dict(e) for e in p.prebuilt]
            return d

        return {
            "name": self.name, "accelerator": self.accelerator, "arch": self.arch,
            "base": {k: list(v) if isinstance(v, tuple) else v
                     for k, v in vars(self.base).items() if v},
            "python": self.python, "cuda": self.cuda, "rocm": self.rocm,
            "packages": {p.name: pkg(p) for p in sorted(self.packages, key=lambda p: p.name)},
            "provided": {p.name: p.version for p in sorted(self.provided, key=lambda p: p.name)},
            "find_links": list(self.find_links), "apt": list(self.apt),
            **({"shared_libpython": True} if self.shared_libpython else {}),
            **({"gpus": list(self.gpus)} if self.gpus else {}),
            **({"build_tools": list(self.build_tools)} if self.build_tools else {}),
            **({"coverage_allow": dict(self.coverage_allow)} if self.coverage_allow else {}),
            **({"abi_allow": dict(self.abi_allow)} if self.abi_allow else {}),
            **({"record_shared": dict(self.record_shared)} if self.record_shared else {}),
            **({"overrides": {o.name: o.to_value() for o in self.overrides}}
               if self.overrides else {}),
            **({self.layer.name: dict(self.layer.value)} if self.layer else {}),
            **({"extras_exceptions": dict(self.extras_exceptions)}
               if self.extras_exceptions else {}),
        }

    @property
    def entry_hash(self) -> str:
        """sha256 of the target's canonical matrix entry (independent of YAML formatting)."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()
        return "sha256:" + hashlib.sha256(blob).hexdigest()


@dataclass(frozen=True)
class Matrix:
    path: Path
    targets: dict[str, Target]
    warnings: tuple[str, ...] = ()

    def target(self, name: str) -> Target:
        if name not in self.targets:
            known = ", ".join(sorted(self.targets)) or "none"
            raise SpecError(f"unknown target {name!r} (known: {known})", file=str(self.path),
                            key="targets")
        return self.targets[name]


class LayerProblem(ValueError):
    """A malformed stack layer: ``key`` is the dotted key that is wrong."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def with_layer(t: dict[str, Any], key: str, lines: dict[str, int],
               written: dict[str, tuple[str, str]] | None = None
               ) -> tuple[Any, Layer | None]:
    """The target's packages with those of the stack layer it switches on added (a catalogue
    layer, by its matrix key): a package the target pins itself wins; each added one reports
    the layer key's line (recorded in ``lines``) and is named by the layer key it comes from
    (recorded in ``written``: ``packages.NAME`` -> ``megatron.KEY``, and its version, where
    the layer gives it as a string, -> that key itself). The layer is read here, beside the
    field that holds it."""
    written = {} if written is None else written
    # a layer key with no value (`megatron:`) is refused like any other non-mapping, never
    # read as "no layer"
    named = [n for n in stack_layer.names() if n in t]
    if not named:
        return t["packages"], None
    if len(named) > 1:
        raise LayerProblem(f"{key}.{named[1]}", f"one stack layer per target (also: {named[0]})")
    name = named[0]
    try:
        layer = stack_layer.parse(t[name], name)
        added = stack_layer.packages(layer, None if t.get("cuda") is None else str(t["cuda"]))
    except stack_layer.LayerError as exc:
        raise LayerProblem(f"{key}.{name}" + (f".{exc.key}" if exc.key else ""),
                           str(exc)) from None
    if not isinstance(t["packages"], dict):
        return t["packages"], layer  # read_packages names what is wrong with it
    out = dict(t["packages"])
    where = yamldoc.Doc("", None, lines)
    for pname, (sub, value) in added.items():
        if pname not in out:
            out[pname] = value
            lines.setdefault(f"{key}.packages.{pname}", where.line(f"{key}.{name}.{sub}") or 0)
            source = f"{key}.{name}.{sub}"
            written[f"{key}.packages.{pname}"] = (source, "")
            if not isinstance(layer.value.get(sub), dict):
                written[f"{key}.packages.{pname}.version"] = (source, "")
        elif isinstance(value, dict) and "import" in value:
            # the target's own pin (or an override's restatement of the layer's packages,
            # which carries no `import:`): the gate still imports what the layer names
            mine = out[pname]
            out[pname] = {"import": value["import"],
                          **(mine if isinstance(mine, dict) else {"version": mine})}
    if "verl" in out:
        out["verl"] = stack_layer.verl_value(out["verl"], layer.extra)
    return out, layer
