"""Cross-package compatibility check over one target's pins (pure; metadata comes in as data).

Every enabled pinned package's declared requirements (markers evaluated for the target's python
and architecture, with the extras the matrix asks for) must be satisfied by the other pins. Two
packages that constrain the same dependency to ranges no release satisfies are reported together,
naming both packages and both ranges. Packages *provided* by the base image are checked as
dependencies only: their index metadata describes the index build, not the vendor's (AMD's vLLM is
built on a different torch than the index's vLLM wheel says).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.matrix import overrides
from builder.matrix.families import SOURCE_ARCHS
from builder.matrix.grammar import GrammarError, parse_oci_reference
from builder.resolve.metadata import Snapshot
from builder.matrix.spec import Package, Target


@dataclass(frozen=True)
class Problem:
    """One failed compatibility rule, with the matrix location it concerns."""

    where: str  # file:line
    key: str  # dotted key inside the target
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.key}: {self.message}"


def _env(python: str, arch: str, extra: str) -> dict[str, str]:
    """The PEP 508 marker environment of a target's platform (by its python and arch)."""
    return {
        "python_version": python, "python_full_version": f"{python}.0",
        "platform_machine": arch, "sys_platform": "linux", "platform_system": "Linux",
        "os_name": "posix", "implementation_name": "cpython",
        "platform_python_implementation": "CPython", "extra": extra,
    }


def holds(req: Requirement, target: Target, extra: str = "") -> bool:
    """Whether ``req``'s marker holds on ``target`` (with ``extra`` asked for); no marker holds.
    Each marker is evaluated once per process per python, arch and extra: a ``check`` of the
    shipped matrix asks tens of thousands of times for a few hundred markers."""
    if req.marker is None:
        return True
    key = (id(req.marker), target.python, target.arch, extra)
    known = _HOLDS.get(key)
    if known is None or known[0] is not req.marker:
        known = _HOLDS[key] = (req.marker, req.marker.evaluate(_env(*key[1:])))
    return known[1]


# (id(marker), python, arch, extra) -> (the marker, kept alive so its id is not reused; held?)
_HOLDS: dict[tuple[int, str, str, str], tuple[Marker, bool]] = {}


def applies(req: Requirement, target: Target, extras: tuple[str, ...]) -> bool:
    """Whether ``req`` holds on ``target`` plain or with any of ``extras``."""
    return any(holds(req, target, e) for e in ("", *extras))


def _key(target: Target, p: Package) -> str:
    return f"{'provided' if p in target.provided else 'packages'}.{p.name}"


def _fmt(spec: SpecifierSet) -> str:
    return str(spec) or "(any)"


def _disjoint(a: SpecifierSet, b: SpecifierSet, known: list[str]) -> bool:
    """True when no known release satisfies both ranges (needs the dependency's version list).
    Each release list is parsed once per process (``check`` of the shipped matrix asks a few
    hundred times over lists of hundreds of releases)."""
    releases = _releases(tuple(known))
    return bool(releases) and not any(a.contains(v, prereleases=True) and
                                      b.contains(v, prereleases=True) for v in releases)


@functools.lru_cache(maxsize=256)
def _releases(known: tuple[str, ...]) -> tuple[Version | str, ...]:
    """``known`` parsed (a string that is no PEP 440 version stays a string, as before)."""
    out: list[Version | str] = []
    for v in known:
        try:
            out.append(Version(v))
        except InvalidVersion:
            out.append(v)
    return tuple(out)


def check_target(target: Target, snapshot: Snapshot) -> list[Problem]:
    """Return every compatibility problem of ``target``; an empty list means it passes."""
    problems: list[Problem] = []
    if target.provided and not target.base.vendor:
        problems.append(Problem(
            target.where("provided"), f"targets.{target.name}.provided",
            f"provided packages ({', '.join(p.name for p in target.provided)}) need a base that "
            "provides them: set base.vendor (declared or probed) and base.interpreter, or move "
            "them to packages: (a fresh venv would hide the base's copies)"))
    problems += accelerator_problems(target, snapshot) + source_arch_problems(target)
    pins = {p.name: p for p in (*target.enabled_packages, *target.provided)}
    constraints: dict[str, list[tuple[Package, Requirement]]] = {}

    for p in target.enabled_packages:
        rel = snapshot.release(p.name, p.version)
        if rel is None and p.name in local_sources(target):
            continue  # a local-only source build: nothing on the index to check it against
        if rel is None:
            problems.append(Problem(target.where(_key(target, p)), f"targets.{target.name}."
                                    f"{_key(target, p)}", f"no metadata for {p.name}=={p.version} "
                                    "in the snapshot: run `build-env check --online`"))
            continue
        if rel.requires_python and not SpecifierSet(rel.requires_python).contains(
                Version(f"{target.python}.0"), prereleases=True):
            problems.append(Problem(target.where("python"), f"targets.{target.name}.python",
                                    f"python {target.python} is outside {p.name} {p.version}'s "
                                    f"Requires-Python {rel.requires_python}"))
        for req in overrides.kept(target.overrides, p.name, rel.requirements()):
            if applies(req, target, p.extras):
                constraints.setdefault(canonicalize_name(req.name), []).append((p, req))

    for dep, cons in sorted(constraints.items()):
        known = snapshot.versions.get(dep, [])
        pin = pins.get(dep)
        if pin is not None and pin.version not in known:
            known = [*known, pin.version]
        reported: set[str] = set()
        for i, (a, ra) in enumerate(cons):
            for b, rb in cons[i + 1:]:
                if a.name == b.name or not _disjoint(ra.specifier, rb.specifier, known):
                    continue
                problems.append(Problem(
                    target.where(_key(target, b)), f"targets.{target.name}.{_key(target, b)}",
                    f"conflict on {dep}: {a.name} {a.version} requires {dep}{_fmt(ra.specifier)} "
                    f"but {b.name} {b.version} requires {dep}{_fmt(rb.specifier)}; "
                    f"no {dep} release satisfies both"))
                reported.update((a.name, b.name))
        if pin is None:
            continue
        for p, req in cons:
            if p.name in reported or req.specifier.contains(pin.version, prereleases=True):
                continue
            problems.append(Problem(
                target.where(_key(target, pin)), f"targets.{target.name}.{_key(target, pin)}",
                f"{dep} {pin.version} does not satisfy {p.name} {p.version}'s requirement "
                f"{dep}{_fmt(req.specifier)}"))
    return problems


def overridden(target: Target, snapshot: Snapshot) -> list[tuple[str, str]]:
    """``(override name, what it replaces)`` for every declared requirement of the target's
    pins that a reviewed override replaces (builder.matrix.overrides), e.g. ``sglang 0.5.12 requires
    transformers==5.6.0``; an override that replaces none of them is listed with ``None`` said
    in words (it may still replace a requirement deeper in the graph)."""
    hits = replacing(target, snapshot)
    out: list[tuple[str, str]] = []
    for o in target.overrides:
        out += [(o.name, h) for h in hits[o.name]] or [
            (o.name, "no pinned package's declared requirement (a deeper one, if any)")]
    return out


def replacing(target: Target, snapshot: Snapshot) -> dict[str, list[str]]:
    """``{override name: [what it replaces]}``: each declared requirement of a pin (recorded
    metadata, markers applied) that an override replaces and that excludes its version."""
    out: dict[str, list[str]] = {o.name: [] for o in target.overrides}
    for p in target.enabled_packages:
        rel = snapshot.release(p.name, p.version)
        for req in rel.requirements() if rel is not None else ():
            o = overrides.replaced(target.overrides, p.name, req)
            if (o is not None and applies(req, target, p.extras)
                    and not req.specifier.contains(o.version, prereleases=True)):
                out[o.name].append(f"{p.name} {p.version} requires {req.name}"
                                   f"{_fmt(req.specifier)}")
    return out


def declared(target: Target, snapshot: Snapshot) -> set[str]:
    """The pins and what their recorded metadata requires directly (markers for the target,
    with the extras asked for, a package's extras that name its own other extras followed:
    verl[vllm] asks verl[verl-core]); normalised names. The closure's part known without a
    resolution."""
    out = {p.name for p in (*target.enabled_packages, *target.provided)}
    for p in target.enabled_packages:
        rel = snapshot.release(p.name, p.version)
        extras, todo = set(p.extras), True
        while rel is not None and todo:
            todo = False
            for req in rel.requirements():
                if not applies(req, target, tuple(sorted(extras))):
                    continue
                name = canonicalize_name(req.name)
                out.add(name)
                more = {canonicalize_name(e) for e in req.extras} - extras
                if name == p.name and more:
                    extras |= more
                    todo = True
    return out


def index_pins(target: Target) -> list[tuple[str, str]]:
    """The ``(name, version)`` pairs whose metadata comes from the package index. Provided
    packages are not among them: their versions are the vendor's own builds (e.g.
    ``2.9.1.dev20251204+rocm7.0.2``), checked against the base, never looked up on the index."""
    return [(p.name, p.version) for p in target.enabled_packages]


def local_sources(target: Target) -> list[str]:
    """Packages built from a source of their own: a git repository, a local directory, an
    archive or a URL (they may be absent from the index)."""
    return [p.name for p in target.enabled_packages
            if p.build == "source" and p.source is not None]


# --------------------------------------------------------------------------- cross-field checks

# torch's local version names its build: +cu130 (CUDA 13.0), +rocm7.0.2, +cpu
_LOCAL_CUDA = re.compile(r"cu([0-9]+)([0-9])")
_LOCAL_ROCM = re.compile(r"rocm([0-9]+(?:\.[0-9]+)*)")
# what a CUDA build of torch requires: the toolkit's or the runtime's exact version, or a
# -cuNN library (the major version only)
_REQ_CUDA_EXACT = ("cuda-toolkit", "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu11",
                   "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu13")
_REQ_CUDA_MAJOR = re.compile(r"nvidia-.+-cu([0-9]+)")
# a ROCm version inside an image tag (rocm/verl:..._rocm7.0.2_..., rocm/pytorch:rocm7.0.2_...)
_TAG_ROCM = re.compile(r"rocm([0-9]+(?:\.[0-9]+)+)")
_TAG_CUDA = re.compile(r"([0-9]+)\.([0-9]+)(?:\.[0-9]+)?(?:-.*)?")


@dataclass(frozen=True)
class Build:
    """What a package was built for: ``kind`` cuda | rocm | cpu, its version (as precise as
    known), and how that is known."""

    kind: str
    version: str
    how: str


def _agree(declared: str, found: str) -> bool:
    """Versions agree on the parts both give (13.0 ~ 13.0.2 ~ 13; 12.0 !~ 13.0)."""
    a, b = declared.split("."), found.split(".")
    n = min(len(a), len(b))
    return [int(x) for x in a[:n]] == [int(x) for x in b[:n]]


def torch_build(target: Target, snapshot: Snapshot) -> Build | None:
    """What the pinned (or provided) torch was built for: its local version (+cu130,
    +rocm7.0.2, +cpu), else the CUDA its index metadata requires; None when neither says."""
    torch = target.package("torch")
    if torch is None:
        return None
    try:
        local = Version(torch.version).local or ""
    except InvalidVersion:
        return None
    if m := _LOCAL_CUDA.fullmatch(local):
        return Build("cuda", f"{m[1]}.{m[2]}", f"its local version +{local}")
    if m := _LOCAL_ROCM.fullmatch(local):
        return Build("rocm", m[1], f"its local version +{local}")
    if local == "cpu":
        return Build("cpu", "", "its local version +cpu")
    rel = snapshot.release(torch.name, torch.version)
    if rel is None or torch in target.provided:
        return None
    major = None
    for req in rel.requirements():
        if not applies(req, target, torch.extras):
            continue
        name = canonicalize_name(req.name)
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if name in _REQ_CUDA_EXACT and exact:
            v = Version(exact[0])
            return Build("cuda", f"{v.major}.{v.minor}", f"it requires {req.name}=={exact[0]}")
        if m := _REQ_CUDA_MAJOR.fullmatch(name):
            major = major or Build("cuda", m[1], f"it requires {req.name}")
    return major


def _base_versions(target: Target) -> list[tuple[str, str, str]]:
    """``(key, reference, version)`` for each base image whose tag names the target's CUDA or
    ROCm version (nvidia/cuda:13.0.2-..., ..._rocm7.0.2_...)."""
    out = []
    for key, ref in (("base.image", target.base.image),
                     ("base.source_image", target.base.source_image)):
        if not ref:
            continue
        try:
            parsed = parse_oci_reference(ref)
        except GrammarError:
            continue
        tag = parsed.tag or ""
        if target.accelerator == "cuda" and parsed.name.rsplit("/", 1)[-1] == "cuda":
            if m := _TAG_CUDA.fullmatch(tag):
                out.append((key, ref, f"{m[1]}.{m[2]}"))
        elif target.accelerator == "rocm" and (m := _TAG_ROCM.search(tag)):
            out.append((key, ref, m[1]))
    return out


def accelerator_problems(target: Target, snapshot: Snapshot) -> list[Problem]:
    """The target's CUDA/ROCm version against the torch build and the base image's tag."""
    kind = "cuda" if target.cuda else "rocm" if target.rocm else None
    declared = target.cuda or target.rocm
    if kind is None or declared is None:
        return []
    key, name = kind, kind.upper() if kind == "cuda" else "ROCm"
    problems = []
    build = torch_build(target, snapshot)
    torch = target.package("torch")
    if build is not None and torch is not None and (
            build.kind != kind or not _agree(declared, build.version)):
        label = {"cuda": "CUDA", "rocm": "ROCm", "cpu": "CPU"}[build.kind]
        what = f"{label} {build.version}".strip()
        problems.append(Problem(
            target.where(key), f"targets.{target.name}.{key}",
            f"{kind} {declared} disagrees with torch {torch.version}, a {what} build ({build.how}"
            f"): set {key} to the torch build's version or pin a torch built for {name} "
            f"{declared}"))
    for bkey, ref, version in _base_versions(target):
        if not _agree(declared, version):
            problems.append(Problem(
                target.where(key), f"targets.{target.name}.{key}",
                f"{kind} {declared} disagrees with {bkey} {ref} ({name} {version})"))
    return problems


def source_arch_problems(target: Target) -> list[Problem]:
    """Each source build's GPU list against what its build system compiles for
    (builder.matrix.families' SOURCE_ARCHS): a GPU it has no code for would fail the gate."""
    problems = []
    for p in target.enabled_packages:
        archs = SOURCE_ARCHS.get(p.name)
        if p.build != "source" or archs is None or archs.family != target.accelerator:
            continue
        missing = archs.unsupported(target.gpus)
        if missing:
            gens = ", ".join(f"sm_{m}x" for m in archs.generations)
            problems.append(Problem(
                target.where("gpus"), f"targets.{target.name}.gpus",
                f"{p.name} {archs.version} builds no code for {', '.join(missing)} (its setup "
                f"builds for {gens}): remove them from gpus, or do not build {p.name} from "
                "source"))
    return problems
