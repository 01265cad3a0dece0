"""Load and validate ``matrix.yaml``: the reviewed compatibility matrix.

Every error names the file, the line and the key (``matrix.yaml:14: targets.cuda-x86_64.packages.ray:
...``). Unknown keys are rejected. Versions are parsed with :mod:`packaging`. The result is a tree
of frozen dataclasses; nothing here touches the network or the Docker Engine.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder import yamldoc
from builder.matrix import grammar
from builder.matrix import megatron
from builder.matrix import overrides
from builder.errors import SpecError
from builder.matrix.families import FAMILIES
from builder.matrix.overrides import Override

RAY_FLOOR = Version("2.40")
GLIBC_FLOOR = Version("2.34")
ACCELERATORS = tuple(FAMILIES)  # a family is data in one place: builder/matrix/families.py
ARCHES = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}
ENGINES = ("vllm", "sglang")
REQUIRED_PACKAGES = ("verl", "ray", "transformers", "tensordict", "torch")
BUILD_KINDS = ("wheel", "source")

# Distribution name -> importable top-level module, where they differ.
IMPORT_NAMES = {"flash-attn": "flash_attn", "hydra-core": "hydra", "ray": "ray"}

_TOP_KEYS = {"schema", "defaults", "targets"}
# A target name is part of a lock path and of image tags: lower case, digits, '.', '_', '-'.
TARGET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_TARGET_KEYS = {"description", "accelerator", "arch", "base", "python", "cuda", "rocm",
                "packages", "provided", "find_links", "apt", "gpus", "build_tools",
                "coverage_allow", "abi_allow", "overrides", "megatron"}
_BASE_KEYS = {"image", "digest", "glibc", "source_image", "vendor", "interpreter", "sources"}
# A vendor base provides packages (torch, vLLM): the target installs into the base's own
# interpreter. ``probe``: inspected with `build-env lock --probe` (locks/T.base.json);
# ``declared``: taken from the vendor's published Dockerfiles/notes, not yet inspected.
VENDOR_KINDS = ("probe", "declared")
_PACKAGE_KEYS = {"version", "extras", "build", "enabled", "import", "source", "prebuilt"}
# How a git source may be fetched (by the build host, at render time: builder.resolve.sources).
GIT_SCHEMES = ("git+https://", "git+ssh://", "git+git://", "git+file://")
# A distribution name (PEP 508 names), an extra, an importable module, a base's interpreter.
_DIST_NAME = re.compile(r"[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9]", re.ASCII)
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*", re.ASCII)
_INTERPRETER = re.compile(r"[A-Za-z0-9_./+-]+", re.ASCII)
_PYTHON = re.compile(r"[0-9]+\.[0-9]+", re.ASCII)


@dataclass(frozen=True)
class Source:
    """Where a source build gets its code: a git URL (``git+https://HOST/REPO@TAG``, pinned to
    a commit by ``lock``: builder.resolve.sources), a local
    directory or archive (``path``, relative to the matrix file; firewalled build hosts), or an
    archive ``url`` with its ``sha256``. Local and URL sources are copied into the build context."""

    kind: str  # git | path | url
    location: str
    sha256: str = ""

    def to_value(self) -> Any:
        if self.kind == "git":
            return self.location
        return {self.kind: self.location, **({"sha256": self.sha256} if self.sha256 else {})}


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
        return self.import_name or IMPORT_NAMES.get(self.name, self.name.replace("-", "_"))


@dataclass(frozen=True)
class Base:
    image: str
    digest: str | None = None
    glibc: str | None = None
    source_image: str | None = None  # a -devel variant for source builds (nvcc, headers)
    vendor: str | None = None  # probe | declared: the base provides packages (builder.resolve.vendor)
    interpreter: str | None = None  # declared vendor bases: the base's python (else probed)
    sources: tuple[str, ...] = ()  # declared vendor bases: where the declared facts come from

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
    # Reviewed dependency overrides (builder.matrix.overrides): a version forced over what other
    # packages declare, each with its reason; uv's --override in `build-env lock`.
    overrides: tuple[Override, ...] = ()
    # The Megatron layer the target switches on (builder.matrix.megatron); its packages are in
    # ``packages`` already.
    megatron: megatron.Layer | None = None

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
        for name in ENGINES:
            p = self.package(name)
            if p is not None and p.enabled:
                return p
        return None

    def where(self, key: str) -> str:
        """``file:line`` for a dotted key inside this target (best effort)."""
        line = self.lines.get(key) or self.lines.get(key.rsplit(".", 1)[0]) or self.lines.get("")
        return f"{self.file}:{line}" if line else self.file

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
            **({"gpus": list(self.gpus)} if self.gpus else {}),
            **({"build_tools": list(self.build_tools)} if self.build_tools else {}),
            **({"coverage_allow": dict(self.coverage_allow)} if self.coverage_allow else {}),
            **({"abi_allow": dict(self.abi_allow)} if self.abi_allow else {}),
            **({"overrides": {o.name: o.to_value() for o in self.overrides}}
               if self.overrides else {}),
            **({"megatron": dict(self.megatron.value)} if self.megatron else {}),
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


# --------------------------------------------------------------------------- YAML with lines


# --------------------------------------------------------------------------- validation


class _Ctx:
    def __init__(self, file: str, lines: dict[str, int]) -> None:
        self.file, self.lines = file, lines

    def error(self, key: str, message: str, target: str | None = None) -> SpecError:
        # a key is shown on one line: a control character or separator in it is escaped
        shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in key)
        return SpecError(message, file=self.file, line=self.line(key), key=shown,
                         target=target)

    def line(self, key: str) -> int | None:
        """The line of ``key``, else of the nearest key above it (a list item of a default)."""
        return yamldoc.Doc(self.file, None, self.lines).line(key)

    def mapping(self, value: Any, key: str, allowed: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(key, f"expected a mapping, got {type(value).__name__}")
        for k in value:
            if k not in allowed:
                sub = f"{key}.{k}" if key else str(k)
                raise self.error(sub, f"unknown key {k!r} (allowed: {', '.join(sorted(allowed))})")
        return value

    def string(self, value: Any, key: str) -> str:
        if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
            raise self.error(key, f"expected a string, got {value!r}")
        if isinstance(value, float):
            # YAML reads 3.10 as 3.1: refuse rather than silently mangle a version.
            raise self.error(key, f"write versions as quoted strings (got the number {value!r})")
        return str(value)

    def checked(self, check: Any, value: Any, key: str, *args: Any) -> str:
        """``value`` as a string fitting ``check`` (a :mod:`builder.matrix.grammar` function), else a
        SpecError naming file:line:key and what the grammar expects."""
        text = self.string(value, key)
        try:
            return check(text, *args)
        except grammar.GrammarError as exc:
            raise self.error(key, str(exc)) from None

    def matching(self, pattern: re.Pattern[str], value: Any, key: str, what: str) -> str:
        """``value`` as a string that ``pattern`` matches whole, else a SpecError."""
        text = self.checked(grammar.plain, value, key)
        if not pattern.fullmatch(text):
            raise self.error(key, f"{text!r} is not {what}")
        return text

    def version(self, value: Any, key: str) -> str:
        text = self.string(value, key)
        try:
            return str(Version(grammar.pep440_version(text)))
        except (grammar.GrammarError, InvalidVersion):
            raise self.error(key, f"invalid version {text!r} (PEP 440)") from None


def _package(ctx: _Ctx, name: str, value: Any, key: str) -> Package:
    ctx.matching(_DIST_NAME, name, key, "a distribution name (PEP 508: letters, digits, "
                 "'.', '_', '-', starting and ending with a letter or digit)")
    if isinstance(value, dict):
        ctx.mapping(value, key, _PACKAGE_KEYS)
        if "version" not in value:
            raise ctx.error(key, f"missing pin: {name} needs a 'version'")
        extras = value.get("extras", [])
        if not isinstance(extras, list) or not all(isinstance(e, str) for e in extras):
            raise ctx.error(f"{key}.extras", "expected a list of extra names")
        for i, e in enumerate(extras):
            ctx.matching(_DIST_NAME, e, f"{key}.extras[{i}]", "an extra name (PEP 508)")
        if "import" in value:
            ctx.matching(_MODULE, value["import"], f"{key}.import", "a module name (dotted "
                         "Python identifiers)")
        build = value.get("build", "wheel")
        if build not in BUILD_KINDS:
            raise ctx.error(f"{key}.build", f"build must be one of {', '.join(BUILD_KINDS)}")
        enabled = value.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ctx.error(f"{key}.enabled", "expected true or false")
        source = _source(ctx, value["source"], f"{key}.source") if value.get("source") else None
        if source and build != "source":
            raise ctx.error(f"{key}.source", "a source location needs build: source")
        prebuilt = _prebuilt(ctx, value.get("prebuilt", []), f"{key}.prebuilt")
        if prebuilt and build != "source":
            raise ctx.error(f"{key}.prebuilt", "prebuilt wheels are tried before a source build: "
                            "they need build: source (what a miss builds)")
        return Package(canonicalize_name(name), ctx.version(value["version"], f"{key}.version"),
                       tuple(sorted(canonicalize_name(e) for e in extras)), build, enabled,
                       str(value.get("import", "")), ctx.lines.get(key), source, prebuilt)
    if value is None:
        raise ctx.error(key, f"missing pin: {name} has no version")
    return Package(canonicalize_name(name), ctx.version(value, key), line=ctx.lines.get(key))


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _prebuilt(ctx: _Ctx, value: Any, key: str) -> tuple[dict[str, str], ...]:
    """``[{url, sha256, python, arch} | {wheelhouse: DIR_OR_INDEX_URL}, ...]``; a relative
    wheelhouse directory is relative to the matrix file."""
    if not isinstance(value, list):
        raise ctx.error(key, "expected a list of {url, sha256, python, arch} or {wheelhouse} "
                        "entries")
    out = []
    for i, entry in enumerate(value):
        k = f"{key}[{i}]"
        if not isinstance(entry, dict) or len({"url", "wheelhouse"} & set(entry)) != 1:
            raise ctx.error(k, "expected {url: WHEEL_URL, sha256: HEX, python: X.Y, arch: ARCH} "
                            "or {wheelhouse: DIR_OR_INDEX_URL}")
        if "wheelhouse" in entry:
            ctx.mapping(entry, k, {"wheelhouse"})
            where = ctx.checked(grammar.url if "://" in str(entry["wheelhouse"])
                                else grammar.path, entry["wheelhouse"], f"{k}.wheelhouse")
            if "://" not in where and not Path(where).is_absolute() and not ctx.file.startswith(
                    "--"):
                where = str((Path(ctx.file).parent / where).resolve())
            out.append({"wheelhouse": where})
            continue
        ctx.mapping(entry, k, {"url", "sha256", "python", "arch"})
        for req in ("sha256", "python", "arch"):
            if req not in entry:
                raise ctx.error(k, f"a prebuilt wheel url needs its {req}")
        sha = ctx.string(entry["sha256"], f"{k}.sha256").lower()
        if not _SHA256.fullmatch(sha):
            raise ctx.error(f"{k}.sha256", "expected 64 hex digits")
        arch = ctx.string(entry["arch"], f"{k}.arch")
        if arch not in ARCHES:
            raise ctx.error(f"{k}.arch", f"must be one of {', '.join(ARCHES)}")
        url = ctx.checked(grammar.url, entry["url"], f"{k}.url", ("https", "http", "file"))
        if not url.split("#")[0].endswith(".whl"):
            raise ctx.error(f"{k}.url", "expected the URL of a .whl file")
        python = ctx.matching(_PYTHON, entry["python"], f"{k}.python", "a python version "
                              "MAJOR.MINOR")
        out.append({"url": url, "sha256": sha, "python": python, "arch": arch})
    return tuple(out)


def _source(ctx: _Ctx, value: Any, key: str) -> Source:
    """``git+https://HOST/REPO@TAG``, a path string, ``{path: P[, sha256: H]}`` or
    ``{url: U, sha256: H}``; relative paths are relative to the matrix file."""
    if isinstance(value, str) and value.startswith("git+"):
        ctx.checked(grammar.url, value, key, tuple(s[:-3] for s in GIT_SCHEMES))
        rest = value.split("://", 1)[1] if "://" in value else ""
        ref = rest.rpartition("@")[2] if "@" in rest else ""
        if not value.startswith(GIT_SCHEMES) or not ref or "/" in ref:
            raise ctx.error(key, "expected git+https://HOST/REPO@TAG (or git+ssh://, git+git://, "
                            "git+file://), pinned to a commit by `build-env lock`")
        return Source("git", value)
    if isinstance(value, str):
        value = {"path": value}
    if not isinstance(value, dict) or len({"path", "url"} & set(value)) != 1:
        raise ctx.error(key, "expected git+https://HOST/REPO@TAG, {path: DIR_OR_ARCHIVE} or "
                        "{url: ARCHIVE_URL, sha256: HEX}")
    ctx.mapping(value, key, {"path", "url", "sha256"})
    sha = str(value.get("sha256", "")).lower()
    if sha and not _SHA256.fullmatch(sha):
        raise ctx.error(f"{key}.sha256", "expected 64 hex digits")
    if "url" in value:
        url = ctx.checked(grammar.url, value["url"], f"{key}.url", ("https", "http", "file"))
        if not sha:
            raise ctx.error(f"{key}.sha256", "a source url needs its sha256")
        return Source("url", url, sha)
    raw = Path(ctx.checked(grammar.path, value["path"], f"{key}.path")).expanduser()
    where = raw if raw.is_absolute() or ctx.file.startswith("--") else (
        Path(ctx.file).parent / raw)
    if not where.exists():
        raise ctx.error(f"{key}.path", f"no such directory or archive: {where}")
    return Source("path", str(where.resolve()), sha)


def _packages(ctx: _Ctx, value: Any, key: str) -> tuple[Package, ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ctx.error(key, "expected a mapping of package name to version")
    return tuple(_package(ctx, str(n), v, f"{key}.{n}") for n, v in value.items())


def _merge(defaults: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    out = dict(defaults)
    for k, v in entry.items():
        out[k] = {**out[k], **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _base(ctx: _Ctx, t: dict[str, Any], key: str) -> Base:
    """The base image: every string against its grammar (an image reference, a digest, URLs);
    a digest named twice (in ``image`` and ``digest:``) must agree."""
    b = ctx.mapping(t["base"], f"{key}.base", _BASE_KEYS)
    if "image" not in b:
        raise ctx.error(f"{key}.base", "missing key 'image'")
    digest = b.get("digest")
    if digest is not None and not (isinstance(digest, str) and digest.startswith("sha256:")
                                   and len(digest) == 71):
        raise ctx.error(f"{key}.base.digest", "expected sha256:<64 hex digits>")
    if digest is not None:
        ctx.checked(grammar.oci_digest, digest, f"{key}.base.digest")
    image = ctx.checked(grammar.oci_reference, b["image"], f"{key}.base.image")
    embedded = grammar.parse_oci_reference(image).digest
    if digest and embedded and digest != embedded:
        raise ctx.error(f"{key}.base.digest", f"the image names the digest {embedded} and "
                        f"digest: names {digest}: keep one")
    glibc = ctx.version(b["glibc"], f"{key}.base.glibc") if "glibc" in b else None
    if glibc and Version(glibc) < GLIBC_FLOOR:
        raise ctx.error(f"{key}.base.glibc", f"glibc {glibc} is below {GLIBC_FLOOR}: vLLM's "
                        "dependencies need manylinux_2_34 wheels (llguidance, tilelang, z3-solver)")
    vendor = ctx.string(b["vendor"], f"{key}.base.vendor") if "vendor" in b else None
    if vendor is not None and vendor not in VENDOR_KINDS:
        raise ctx.error(f"{key}.base.vendor", f"vendor must be one of {', '.join(VENDOR_KINDS)}")
    for k in ("interpreter", "sources"):
        if k in b and vendor != "declared":
            raise ctx.error(f"{key}.base.{k}", f"{k} is for a declared vendor base "
                            "(vendor: declared); a probed base records its own")
    sources = b.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(x, str) for x in sources):
        raise ctx.error(f"{key}.base.sources", "expected a list of strings")
    for i, src in enumerate(sources):
        ctx.checked(grammar.plain, src, f"{key}.base.sources[{i}]")  # a citation: URL or title
    if vendor and not t.get("provided"):
        raise ctx.error(f"{key}.base.vendor", "a vendor base needs the packages it provides "
                        "under provided:")
    source_image = (ctx.checked(grammar.oci_reference, b["source_image"],
                                f"{key}.base.source_image") if "source_image" in b else None)
    interpreter = (ctx.matching(_INTERPRETER, b["interpreter"], f"{key}.base.interpreter",
                                "an interpreter (a command or path of letters, digits, ./+-_)")
                   if "interpreter" in b else None)
    return Base(image, digest, glibc, source_image, vendor, interpreter, tuple(sources))


def _target(ctx: _Ctx, name: str, raw: dict[str, Any], key: str) -> Target:
    t = raw
    for req in ("accelerator", "arch", "base", "python", "packages"):
        if req not in t:
            raise ctx.error(key, f"missing key {req!r}", target=name)
    accel = ctx.string(t["accelerator"], f"{key}.accelerator")
    if accel not in ACCELERATORS:
        raise ctx.error(f"{key}.accelerator", f"must be one of {', '.join(ACCELERATORS)}")
    arch = ctx.string(t["arch"], f"{key}.arch")
    if arch not in ARCHES:
        raise ctx.error(f"{key}.arch", f"must be one of {', '.join(ARCHES)}")
    base = _base(ctx, t, key)
    python = ctx.checked(grammar.plain, t["python"], f"{key}.python")
    try:
        pv = Version(python)
    except InvalidVersion:
        raise ctx.error(f"{key}.python", f"invalid python version {python!r}") from None
    if len(pv.release) != 2 or not _PYTHON.fullmatch(python):
        raise ctx.error(f"{key}.python", f"give python as MAJOR.MINOR (got {python!r})")
    raw_packages, layer = _megatron_layer(ctx, t, key, name)
    packages = _packages(ctx, raw_packages, f"{key}.packages")
    provided = _packages(ctx, t.get("provided"), f"{key}.provided")
    cuda = ctx.version(t["cuda"], f"{key}.cuda") if t.get("cuda") is not None else None
    rocm = ctx.version(t["rocm"], f"{key}.rocm") if t.get("rocm") is not None else None
    for listkey in ("find_links", "apt", "gpus", "build_tools"):
        v = t.get(listkey, [])
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ctx.error(f"{key}.{listkey}", "expected a list of strings")
    _strings(ctx, t, key)
    target = Target(name, accel, arch, base, python, packages, provided, cuda, rocm,
                    str(t.get("description", "")), tuple(t.get("find_links", [])),
                    tuple(t.get("apt", [])), ctx.file,
                    {k[len(key) + 1:] if k != key else "": v for k, v in ctx.lines.items()
                     if k == key or k.startswith(key + ".")},
                    gpus=_gpus(ctx, accel, t.get("gpus"), f"{key}.gpus", name),
                    build_tools=_build_tools(ctx, t.get("build_tools", []), f"{key}.build_tools"),
                    coverage_allow=_coverage_allow(ctx, accel, t.get("coverage_allow"),
                                                   f"{key}.coverage_allow", name),
                    abi_allow=_abi_allow(ctx, t.get("abi_allow"), f"{key}.abi_allow", name),
                    overrides=_overrides(ctx, t.get("overrides"), f"{key}.overrides", name,
                                         packages),
                    megatron=layer)
    _rules(ctx, target, key)
    return target


def _megatron_layer(ctx: _Ctx, t: dict[str, Any], key: str, name: str
                    ) -> tuple[Any, megatron.Layer | None]:
    """The target's packages with those of its Megatron layer added (builder.matrix.megatron): a
    package the target pins itself wins; each added one reports the layer key's line."""
    raw = t.get("megatron")
    if raw is None:
        return t["packages"], None
    try:
        layer = megatron.parse(raw)
        added = megatron.packages(layer, None if t.get("cuda") is None
                                  else ctx.string(t["cuda"], f"{key}.cuda"))
    except megatron.LayerError as exc:
        raise ctx.error(f"{key}.megatron" + (f".{exc.key}" if exc.key else ""), str(exc),
                        name) from None
    if not isinstance(t["packages"], dict):
        return t["packages"], layer  # _packages names what is wrong with it
    out = dict(t["packages"])
    for pname, (sub, value) in added.items():
        if pname not in out:
            out[pname] = value
            ctx.lines.setdefault(f"{key}.packages.{pname}",
                                 ctx.line(f"{key}.megatron.{sub}") or 0)
        elif isinstance(value, dict) and "import" in value:
            # the target's own pin (or an override's restatement of the layer's packages,
            # which carries no `import:`): the gate still imports what the layer names
            mine = out[pname]
            out[pname] = {"import": value["import"],
                          **(mine if isinstance(mine, dict) else {"version": mine})}
    if "verl" in out:
        out["verl"] = megatron.verl_value(out["verl"], layer.extra)
    return out, layer


def _strings(ctx: _Ctx, t: dict[str, Any], key: str) -> None:
    """The target's free strings against their grammars (docs/matrix.md): apt packages are
    Debian package names, find-links are paths or URLs, the description is one plain line."""
    for i, pkg in enumerate(t.get("apt", [])):
        ctx.checked(grammar.debian_package, pkg, f"{key}.apt[{i}]")
    for i, link in enumerate(t.get("find_links", [])):
        ctx.checked(grammar.url if "://" in link else grammar.path, link,
                    f"{key}.find_links[{i}]")
    if "description" in t:
        ctx.checked(grammar.plain, t["description"], f"{key}.description")


@dataclass(frozen=True)
class _Allowance:
    """What one kind of reviewed gate exception covers, in its error messages."""
    globs: str    # "library globs"
    each: str     # what each listed glob may do: "may lack code for a declared GPU"
    objects: str  # what a glob must name: "libraries"
    reason: str   # what the reason must say


_COVERAGE = _Allowance("library globs", "may lack code for a declared GPU", "libraries",
                       "why this library may lack code for a declared GPU")
_ABI = _Allowance("shared-object globs", "may not load in the image", "shared objects",
                  "what the object needs that the image lacks, and what is lost")


def _coverage_allow(ctx: _Ctx, accel: str, value: Any, key: str, name: str
                    ) -> tuple[tuple[str, str], ...]:
    """``coverage_allow: {GLOB: REASON}``: every exception names the libraries it covers and
    says why; only for families with GPUs."""
    if value is not None and FAMILIES[accel].gpu_pattern is None:
        raise ctx.error(key, f"a {accel} target has no device code to allow", name)
    return _allowances(ctx, value, key, name, _COVERAGE)


def _abi_allow(ctx: _Ctx, value: Any, key: str, name: str) -> tuple[tuple[str, str], ...]:
    """``abi_allow: {GLOB: REASON}``: shared objects the ABI phase may find unloadable (a
    library the image does not ship), each named and with the reason (what is lost)."""
    return _allowances(ctx, value, key, name, _ABI)


def _allowances(ctx: _Ctx, value: Any, key: str, name: str, kind: _Allowance
                ) -> tuple[tuple[str, str], ...]:
    """A reviewed exception list ``{GLOB: REASON}``: each glob names objects (not everything),
    each reason is words on one line; both held to their grammars."""
    if value is None:
        return ()
    if not isinstance(value, dict) or not value:
        raise ctx.error(key, f"expected a mapping of {kind.globs} to the reason each "
                             f"{kind.each}", name)
    out = []
    for glob, why in value.items():
        if not isinstance(glob, str) or not glob.strip() or glob.strip("*/. ") == "":
            raise ctx.error(f"{key}.{glob}", f"a glob must name {kind.objects} (not match "
                                             "everything)", name)
        ctx.checked(grammar.path, glob, f"{key}.{glob}")
        if isinstance(why, str):
            ctx.checked(grammar.plain, why, f"{key}.{glob}")
        if not isinstance(why, str) or len(why.strip()) < 10:
            raise ctx.error(f"{key}.{glob}", f"give the reason in words ({kind.reason})", name)
        out.append((glob, why.strip()))
    return tuple(sorted(out))


def _overrides(ctx: _Ctx, value: Any, key: str, name: str, packages: tuple[Package, ...]
               ) -> tuple[Override, ...]:
    """``overrides: {NAME: {version, reason}}`` (builder.matrix.overrides), each held to the grammars;
    an override may not contradict the target's own pin of the same package."""
    try:
        found = overrides.parse(value, grammar.plain)
    except overrides.OverrideError as exc:
        raise ctx.error(f"{key}.{exc.subkey}" if exc.subkey else key, str(exc), name) from None
    clash = overrides.pin_conflict(found, {p.name: p.version for p in packages if p.enabled})
    if clash:
        raise ctx.error(f"{key}.{clash[0]}", clash[1], name)
    return found


def _gpus(ctx: _Ctx, accel: str, value: Any, key: str, name: str) -> tuple[str, ...]:
    """The GPU list: required for a family with GPUs, each name its family's kind (sm_90,
    gfx942), no duplicates; refused for cpu."""
    fam = FAMILIES[accel]
    if fam.gpu_pattern is None:
        if value:
            raise ctx.error(key, f"a {accel} target runs on no GPU: remove gpus", name)
        return ()
    if not value:
        raise ctx.error(key.rsplit(".", 1)[0] if value is None else key,
                        f"missing key 'gpus': a {accel} target lists the GPUs it must run on "
                        f"(gpus: a list of names matching {fam.gpu_pattern})", name)
    out: list[str] = []
    for i, g in enumerate(value):
        if not isinstance(g, str) or not re.fullmatch(fam.gpu_pattern, g):
            raise ctx.error(f"{key}[{i}]", f"{g!r} is not a {accel} GPU architecture (the "
                            f"{accel} family's names match {fam.gpu_pattern})", name)
        if g in out:
            raise ctx.error(f"{key}[{i}]", f"{g} is listed twice", name)
        out.append(g)
    return tuple(out)


def _build_tools(ctx: _Ctx, value: list[str], key: str) -> tuple[str, ...]:
    for i, req in enumerate(value):
        ctx.checked(grammar.pep508_requirement, req, f"{key}[{i}]")
        try:
            r = Requirement(req)
        except InvalidRequirement as exc:
            raise ctx.error(f"{key}[{i}]", f"not a requirement: {exc}") from None
        if not any(s.operator == "==" for s in r.specifier):
            raise ctx.error(f"{key}[{i}]", f"pin {r.name} with == (the build-tools lock hashes "
                            "what it names)")
    return tuple(value)


def _rules(ctx: _Ctx, t: Target, key: str) -> None:
    """Matrix policy that needs no package metadata."""
    names = [p.name for p in (*t.packages, *t.provided)]
    for n in set(names):
        if names.count(n) > 1:
            raise ctx.error(f"{key}.provided.{n}", f"{n} is both pinned and provided", t.name)
    for req in REQUIRED_PACKAGES:
        if t.package(req) is None:
            raise ctx.error(f"{key}.packages", f"missing pin: {req} (pin it under packages, or "
                            "under provided when the base image ships it)", t.name)
    ray = t.package("ray")
    assert ray is not None
    if Version(ray.version) < RAY_FLOOR:
        k = f"{key}.packages.ray" if ray in t.packages else f"{key}.provided.ray"
        raise ctx.error(k, f"Ray {ray.version} is refused: verl-env requires Ray >= {RAY_FLOOR} "
                        "(older Ray breaks GPU assignment and the debugger)", t.name)
    engines = [e for e in ENGINES if t.package(e) is not None and t.package(e).enabled]
    if len(engines) > 1:
        raise ctx.error(f"{key}.packages", "vllm and sglang cannot share one environment: "
                        "make them separate targets", t.name)
    # pinned is what is required (as for verl, ray ...); a pinned engine may be switched off
    # (enabled: false) for an experiment or a fixture, and the listing says so
    if t.accelerator in ("cuda", "rocm") and not any(t.package(e) for e in ENGINES):
        raise ctx.error(f"{key}.packages", "missing pin: a GPU target needs a rollout engine "
                        "(vllm or sglang)", t.name)
    if t.accelerator == "cuda" and not t.cuda:
        raise ctx.error(key, "missing key 'cuda' (the CUDA version of the stack)", t.name)
    if t.accelerator == "rocm" and not t.rocm:
        raise ctx.error(key, "missing key 'rocm' (the ROCm version of the base image)", t.name)
    if t.accelerator != "cuda" and t.cuda:
        raise ctx.error(f"{key}.cuda", f"a {t.accelerator} target cannot declare cuda", t.name)


def load_matrix(path: str | Path) -> Matrix:
    """Parse and validate a matrix file. Raises :class:`SpecError` naming file:line:key."""
    path = Path(path)
    file = str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"cannot read matrix: {exc.strerror}", file=file) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise SpecError(f"not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r})",
                        file=file, line=line) from None
    node = yamldoc.compose(text, file)
    if node is None:
        raise SpecError("empty matrix file", file=file)
    lines: dict[str, int] = {}
    raw = yamldoc.plain(node, "", lines, file)
    ctx = _Ctx(file, lines)
    ctx.mapping(raw, "", _TOP_KEYS)
    if raw.get("schema") != 1:
        raise ctx.error("schema", "expected 'schema: 1'")
    targets_raw = raw.get("targets")
    if not isinstance(targets_raw, dict) or not targets_raw:
        raise ctx.error("targets", "expected a non-empty mapping of targets")
    defaults = ctx.mapping(raw.get("defaults") or {}, "defaults", _TARGET_KEYS)
    targets: dict[str, Target] = {}
    warnings: list[str] = []
    for name, entry in targets_raw.items():
        key = f"targets.{name}"
        if not TARGET_NAME.fullmatch(str(name)):
            raise ctx.error(key, f"target name {name!r}: use lower-case letters, digits, '.', '_' "
                                 "and '-' (at most 63, starting with a letter or digit): it names "
                                 "a lock file and image tags")
        ctx.mapping(entry, key, _TARGET_KEYS)
        for k, v in defaults.items():  # defaults report their own lines when they are the culprit
            if k not in entry:
                for dk, dl in list(lines.items()):
                    if dk == f"defaults.{k}" or dk.startswith((f"defaults.{k}.",
                                                               f"defaults.{k}[")):
                        lines.setdefault(key + dk[len("defaults"):], dl)
        merged = _merge(defaults, entry)
        for k in ("base", "packages", "provided"):
            if isinstance(defaults.get(k), dict) and isinstance(entry.get(k), dict):
                for sub in defaults[k]:
                    if sub not in entry[k]:
                        lines.setdefault(f"{key}.{k}.{sub}", lines.get(f"defaults.{k}.{sub}", 0))
        t = _target(ctx, str(name), merged, key)
        if not t.base.pinned_digest:
            warnings.append(f"{t.where('base.image')}: targets.{name}.base: base image "
                            f"{t.base.image!r} is pinned by tag only; add its digest")
        targets[str(name)] = t
    return Matrix(path, targets, tuple(warnings))


# --------------------------------------------------------------------------- overrides


def apply_overrides(target: Target, assignments: list[str], *, base_image: str | None = None
                    ) -> Target:
    """Apply ``--set KEY=VALUE`` / ``--base-image`` for local experiments.

    Keys: ``python``, ``cuda``, ``rocm``, ``packages.NAME`` (version), ``packages.NAME.enabled``,
    ``packages.NAME.build``, ``provided.NAME``. The result is marked ``override=True`` and is
    re-validated by the same rules as the matrix.
    """
    if not assignments and not base_image:
        return target
    raw = target.to_dict()
    for item in assignments:
        if "=" not in item:
            raise SpecError(f"--set expects KEY=VALUE, got {item!r}", file="--set", key=item)
        key, value = item.split("=", 1)
        parts = key.split(".")
        if parts[0] in ("python", "cuda", "rocm") and len(parts) == 1:
            raw[parts[0]] = value
        elif parts[0] == "packages" and len(parts) in (2, 3):
            name = canonicalize_name(parts[1])
            entry = raw["packages"].setdefault(name, {"version": value})
            if len(parts) == 2:
                entry["version"] = value
            elif parts[2] == "enabled":
                flag = {"1": True, "true": True, "yes": True, "on": True,
                        "0": False, "false": False, "no": False, "off": False}.get(value.lower())
                if flag is None:
                    raise SpecError(f"expected true or false, got {value!r}", file="--set",
                                    key=key)
                entry["enabled"] = flag
            elif parts[2] in ("build", "source"):
                entry[parts[2]] = value
            else:
                raise SpecError(f"cannot override {key!r}", file="--set", key=key)
        elif parts[0] == "gpus" and len(parts) == 1:
            raw["gpus"] = [g.strip() for g in value.split(",") if g.strip()]
        elif parts[0] == "provided" and len(parts) == 2:
            raw["provided"][canonicalize_name(parts[1])] = value
        else:
            raise SpecError(f"cannot override {key!r} (python, cuda, rocm, gpus, packages.NAME"
                            "[.enabled|.build], provided.NAME)", file="--set", key=key)
    if base_image:
        try:
            grammar.oci_reference(base_image)
        except grammar.GrammarError as exc:
            raise SpecError(str(exc), file="--base-image") from None
        raw["base"] = {"image": base_image}
    name = raw.pop("name")
    lines = {"": 0}
    ctx = _Ctx("--set", lines)
    body = {k: v for k, v in raw.items() if v not in (None, [], {}) or k in ("packages",)}
    t = _target(ctx, name, body, f"targets.{name}")
    # a package's `import:` is not in the canonical entry (to_dict): carry it over, so the gate
    # of an override build imports what the matrix names (sglang-kernel: sgl_kernel)
    named = {p.name: p.import_name for p in target.packages if p.import_name}
    packages = tuple(replace(p, import_name=named.get(p.name, p.import_name)) for p in t.packages)
    return replace(t, packages=packages, override=True, file=target.file, lines=target.lines)
