"""A target read whole: its fields (builder.matrix.fields), the GPUs, the reviewed gate
exceptions and dependency overrides, the Megatron layer, and the matrix's policy (what every
target pins, the Ray floor, one rollout engine per environment).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder import catalog, yamldoc
from builder.matrix import grammar
from builder.matrix import overrides
from builder.matrix.families import FAMILIES
from builder.matrix.fields import (
    _DIST_NAME, PYTHON, Ctx, read_base, read_packages,
)
from builder.matrix.model import (Base, LayerProblem, Package, Target, engine_distributions,
                                   with_layer)
from builder.matrix.overrides import Override
from builder.selftest.phases import allowpath

# The matrix's shape (types, allowed and required keys, enumerations): what `check` validates
# against first, and what editors complete from (the modeline `build-env init` writes).
SCHEMA_FILE = Path(__file__).resolve().parent / "matrix.schema.json"
RAY_FLOOR = Version("2.40")


def merge(defaults: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    out = dict(defaults)
    for k, v in entry.items():
        out[k] = {**out[k], **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out



@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=1)
def packages_schema() -> dict[str, Any]:
    """The schema of a ``packages:`` mapping alone."""
    return {"$defs": schema()["$defs"], "$ref": "#/$defs/packages"}


def complete_schema() -> dict[str, Any]:
    """A target merged with its defaults: its shape, and the keys it must then have."""
    whole = schema()
    return {"$defs": whole["$defs"],
            "allOf": [{"$ref": "#/$defs/target"}, {"$ref": "#/$defs/complete"}]}


def read_target(ctx: Ctx, name: str, raw: dict[str, Any], key: str) -> Target:
    yamldoc.validate(yamldoc.Doc(ctx.file, raw, ctx.lines), complete_schema(), ctx.maker(name),
                     at=key)
    t = raw
    accel, arch = str(t["accelerator"]), str(t["arch"])
    base = read_base(ctx, t, key)
    python = ctx.checked(grammar.plain, t["python"], f"{key}.python")
    try:
        pv = Version(python)
    except InvalidVersion:
        raise ctx.error(f"{key}.python", f"invalid python version {python!r}") from None
    if len(pv.release) != 2 or not PYTHON.fullmatch(python):
        raise ctx.error(f"{key}.python", f"give python as MAJOR.MINOR (got {python!r})")
    try:
        raw_packages, layer = with_layer(t, key, ctx.lines, ctx.written)
    except LayerProblem as exc:
        raise ctx.error(exc.key, str(exc), name) from None
    if layer is not None and isinstance(raw_packages, dict):
        # the packages the layer adds (the target's own were checked), held to a package's shape
        own = t["packages"] if isinstance(t["packages"], dict) else {}
        added = {k: v for k, v in raw_packages.items() if k not in own}
        yamldoc.validate(yamldoc.Doc(ctx.file, added, ctx.lines), packages_schema(),
                         ctx.maker(name), at=f"{key}.packages")
    packages = read_packages(ctx, raw_packages, f"{key}.packages")
    provided = read_packages(ctx, t.get("provided"), f"{key}.provided")
    cuda = ctx.version(t["cuda"], f"{key}.cuda") if t.get("cuda") is not None else None
    rocm = ctx.version(t["rocm"], f"{key}.rocm") if t.get("rocm") is not None else None
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
                    shared_libpython=_shared_libpython(ctx, t, base, f"{key}.shared_libpython",
                                                       name),
                    record_shared=_allowances(ctx, t.get("record_shared"),
                                              f"{key}.record_shared", name, _RECORD),
                    overrides=_overrides(ctx, t.get("overrides"), f"{key}.overrides", name,
                                         packages),
                    extras_exceptions=_extras_exceptions(ctx, t.get("extras_exceptions"),
                                                         f"{key}.extras_exceptions", name),
                    layer=layer)
    _rules(ctx, target, key)
    return target


def _strings(ctx: Ctx, t: dict[str, Any], key: str) -> None:
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
_RECORD = _Allowance("path globs", "may be claimed by two distributions' RECORDs", "files",
                     "which distributions claim the path, and why both may")


def _coverage_allow(ctx: Ctx, accel: str, value: Any, key: str, name: str
                    ) -> tuple[tuple[str, str], ...]:
    """``coverage_allow: {GLOB: REASON}``: every exception names the libraries it covers and
    says why; only for families with GPUs."""
    if value is not None and FAMILIES[accel].gpu_pattern is None:
        raise ctx.error(key, f"a {accel} target has no device code to allow", name)
    return _allowances(ctx, value, key, name, _COVERAGE)


def _abi_allow(ctx: Ctx, value: Any, key: str, name: str) -> tuple[tuple[str, str], ...]:
    """``abi_allow: {GLOB: REASON}``: shared objects the ABI phase may find unloadable (a
    library the image does not ship), each named and with the reason (what is lost)."""
    return _allowances(ctx, value, key, name, _ABI)


def _allowances(ctx: Ctx, value: Any, key: str, name: str, kind: _Allowance
                ) -> tuple[tuple[str, str], ...]:
    """A reviewed exception list ``{GLOB: REASON}``: each glob names objects of one package
    (anchored: builder.selftest.phases.allowpath, the self-test's own matcher), each reason is
    words on one line; both held to their grammars."""
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
        unanchored = allowpath.problem(glob)
        if unanchored:
            raise ctx.error(f"{key}.{glob}", unanchored, name)
        if isinstance(why, str):
            ctx.checked(grammar.plain, why, f"{key}.{glob}")
        if not isinstance(why, str) or len(why.strip()) < 10:
            raise ctx.error(f"{key}.{glob}", f"give the reason in words ({kind.reason})", name)
        out.append((glob, why.strip()))
    return tuple(sorted(out))


def _overrides(ctx: Ctx, value: Any, key: str, name: str, packages: tuple[Package, ...]
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


def _extras_exceptions(ctx: Ctx, value: Any, key: str, name: str
                       ) -> tuple[tuple[str, str], ...]:
    """``extras_exceptions: {DIST: REASON}``: each a distribution name (PEP 503 normalised) and
    the reason in words; whether each is declared by an extra the target asks for is checked
    against the metadata snapshot (builder.resolve.extras)."""
    if value is None:
        return ()
    if not isinstance(value, dict) or not value:
        raise ctx.error(key, "expected a mapping of distribution names to the reason each may "
                             "differ from what the extras declare", name)
    out: dict[str, str] = {}
    for dist, why in value.items():
        ctx.matching(_DIST_NAME, str(dist), f"{key}.{dist}", "a distribution name (PEP 508)")
        canon = canonicalize_name(str(dist))
        if not isinstance(why, str) or len(why.strip()) < 10:
            raise ctx.error(f"{key}.{dist}", "give the reason in words (why the lock cannot hold "
                                             "what the extra declares)", name)
        ctx.checked(grammar.plain, why, f"{key}.{dist}")
        if canon in out or canon != str(dist):
            raise ctx.error(f"{key}.{dist}", f"write the distribution as {canon!r}, once", name)
        out[canon] = why.strip()
    return tuple(sorted(out.items()))


def _shared_libpython(ctx: Ctx, t: dict[str, Any], base: Base, key: str, name: str) -> bool:
    """``shared_libpython``: the apt-installed interpreter's shared library; a vendor base's
    interpreter is its own, so asking for it there is refused rather than ignored."""
    wanted = bool(t.get("shared_libpython", False))
    if wanted and base.vendor:
        raise ctx.error(key, "a vendor base keeps its own interpreter (base.vendor): remove "
                             "shared_libpython", name)
    return wanted


def _gpus(ctx: Ctx, accel: str, value: Any, key: str, name: str) -> tuple[str, ...]:
    """The GPU list: required for a family with GPUs, each name its family's kind (sm_90,
    gfx942), no duplicates; refused for cpu."""
    fam = FAMILIES[accel]
    if fam.gpu_pattern is None:
        if value:
            raise ctx.error(key, f"a {accel} target runs on no GPU: remove gpus", name)
        return ()
    if value is None:
        raise ctx.error(key.rsplit(".", 1)[0],
                        f"missing key 'gpus': a {accel} target lists the GPUs it must run on "
                        f"(gpus: a list of names matching {fam.gpu_pattern})", name)
    if not value:
        raise ctx.error(key, f"the list is empty: a {accel} target lists the GPUs it must run "
                        f"on (at least one name matching {fam.gpu_pattern})", name)
    out: list[str] = []
    for i, g in enumerate(value):
        if not isinstance(g, str) or not re.fullmatch(fam.gpu_pattern, g):
            raise ctx.error(f"{key}[{i}]", f"{g!r} is not a {accel} GPU architecture (the "
                            f"{accel} family's names match {fam.gpu_pattern})", name)
        if g in out:
            raise ctx.error(f"{key}[{i}]", f"{g} is listed twice", name)
        out.append(g)
    return tuple(out)


def _build_tools(ctx: Ctx, value: list[str], key: str) -> tuple[str, ...]:
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


def _rules(ctx: Ctx, t: Target, key: str) -> None:
    """Matrix policy that needs no package metadata."""
    names = [p.name for p in (*t.packages, *t.provided)]
    for n in set(names):
        if names.count(n) > 1:
            raise ctx.error(f"{key}.provided.{n}", f"{n} is both pinned and provided", t.name)
    for req in catalog.shipped().required:
        if t.package(req) is None:
            raise ctx.error(f"{key}.packages", f"missing pin: {req} (pin it under packages, or "
                            "under provided when the base image ships it)", t.name)
    ray = t.package("ray")
    assert ray is not None
    if Version(ray.version) < RAY_FLOOR:
        k = f"{key}.packages.ray" if ray in t.packages else f"{key}.provided.ray"
        raise ctx.error(k, f"Ray {ray.version} is refused: verl-env requires Ray >= {RAY_FLOOR} "
                        "(older Ray breaks GPU assignment and the debugger)", t.name)
    known = engine_distributions()
    engines = [e for e in known if t.package(e) is not None and t.package(e).enabled]
    if len(engines) > 1:
        raise ctx.error(f"{key}.packages", f"{' and '.join(engines)} cannot share one "
                        "environment: make them separate targets", t.name)
    # pinned is what is required (as for verl, ray ...); a pinned engine may be switched off
    # (enabled: false) for an experiment or a fixture, and the listing says so
    if t.accelerator in ("cuda", "rocm") and not any(t.package(e) for e in known):
        raise ctx.error(f"{key}.packages", "missing pin: a GPU target needs a rollout engine "
                        f"({' or '.join(known)})", t.name)
    if t.accelerator == "cuda" and not t.cuda:
        raise ctx.error(key, "missing key 'cuda' (the CUDA version of the stack)", t.name)
    if t.accelerator == "rocm" and not t.rocm:
        raise ctx.error(key, "missing key 'rocm' (the ROCm version of the base image)", t.name)
    if t.accelerator != "cuda" and t.cuda:
        raise ctx.error(f"{key}.cuda", f"a {t.accelerator} target cannot declare cuda", t.name)
