"""Whether one release can be installed on a target at all, whatever the other pins say.

Three facts about the target decide it: its python (Requires-Python, the wheel's python tag),
its platform (architecture and glibc: the wheel's ``manylinux_X_Y`` tag must not need a newer
glibc than the base has) and its accelerator (torch, torchvision and torchaudio are built per
CUDA / ROCm version, or for the CPU: the build must be the target's). Pure: the release's
metadata comes in as data (the snapshot).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from builder.resolve.compat import holds
from builder.resolve.lock import DEFAULT_GLIBC
from builder.resolve.metadata import Release
from builder.matrix.spec import Package, Target

# Built once per accelerator and toolkit: the index (or a find-links directory) holds one build
# per version, for one CUDA / ROCm release or the CPU.
ACCELERATOR_BUILDS = ("torch", "torchvision", "torchaudio")
_CU_LOCAL = re.compile(r"cu(\d+)(\d)$")  # cu128 -> 12.8, cu130 -> 13.0
_ROCM_LOCAL = re.compile(r"rocm(\d+(?:\.\d+)*)$")
# what a CUDA build of torch on the index depends on: cuda-toolkit==13.0.2, nvidia-*-cu12
_CUDA_DEP = re.compile(r"^(cuda-toolkit|nvidia-cuda-runtime(?:-cu\d+)?)$")
_NVIDIA_CU = re.compile(r"^nvidia-[a-z0-9-]+-cu(\d+)$")


@dataclass(frozen=True)
class Build:
    """What an accelerator build is for: ``cuda``/``rocm`` with its version, or ``cpu``."""

    kind: str  # cuda | rocm | cpu
    version: str = ""  # 13.0, 12 (major only when that is all the metadata says), 6.4

    def __str__(self) -> str:
        label = {"cuda": "CUDA", "rocm": "ROCm", "cpu": "CPU"}[self.kind]
        return f"{label} {self.version}" if self.version else label


@dataclass(frozen=True)
class Stop:
    """Why a release cannot be used, and what would change that."""

    reason: str
    unblock: str


def glibc(target: Target) -> Version:
    return Version(target.base.glibc or DEFAULT_GLIBC)


def platform_label(target: Target) -> str:
    g = glibc(target)
    return f"manylinux_{g.major}_{g.minor}_{target.arch}"


def supported_tags(target: Target) -> frozenset[Tag]:
    """Every wheel tag a CPython of the target's version on its platform installs."""
    g = glibc(target)
    arch = target.arch
    plats = [f"manylinux_{g.major}_{m}_{arch}" for m in range(g.minor, 4, -1)]
    plats += [f"manylinux2014_{arch}"] if g >= Version("2.17") else []
    if arch == "x86_64":
        plats += ["manylinux2010_x86_64", "manylinux1_x86_64"]
    plats.append(f"linux_{arch}")
    major, minor = (int(x) for x in target.python.split("."))
    tags = list(cpython_tags((major, minor), platforms=plats))
    tags += compatible_tags((major, minor), f"cp{major}{minor}", plats)
    return frozenset(tags)


def wheel_fits(filename: str, tags: frozenset[Tag]) -> bool:
    try:
        _, _, _, wheel_tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion):
        return False
    return any(t in tags for t in wheel_tags)


def accelerator_build(release: Release, target: Target) -> Build:
    """What ``release`` (of torch, torchvision or torchaudio) is built for: its local version
    label (``+cu128``, ``+rocm6.4``, ``+cpu``) when it has one, else its CUDA dependencies (the
    index's Linux torch pulls ``cuda-toolkit==13.0.2`` or ``nvidia-*-cu12``), else the CPU."""
    local = Version(release.version).local or ""
    if local == "cpu":
        return Build("cpu")
    m = _CU_LOCAL.fullmatch(local)
    if m:
        return Build("cuda", f"{m.group(1)}.{m.group(2)}")
    m = _ROCM_LOCAL.fullmatch(local)
    if m:
        return Build("rocm", m.group(1))
    majors = set()
    for req in release.requirements():
        if not holds(req, target):
            continue
        name = canonicalize_name(req.name)
        if _CUDA_DEP.match(name):
            pins = [s.version for s in req.specifier if s.operator in ("==", "~=", "===")]
            if pins:
                v = Version(pins[0].rstrip(".*"))
                return Build("cuda", f"{v.major}.{v.minor}")
            majors.add("")
        m = _NVIDIA_CU.match(name)
        if m:
            majors.add(m.group(1))
    if majors:
        known = sorted(m for m in majors if m)
        return Build("cuda", known[0] if known else "")
    return Build("cpu")


def target_build(target: Target) -> Build:
    if target.accelerator == "cuda":
        return Build("cuda", target.cuda or "")
    if target.accelerator == "rocm":
        return Build("rocm", target.rocm or "")
    return Build("cpu")


def _same_toolkit(want: str, have: str) -> bool:
    """13.0 matches 13.0; a build that says only its major (nvidia-*-cu12) matches 12.x."""
    w, h = want.split("."), have.split(".")
    n = min(len(h), 2)
    return w[:n] == h[:n]


def build_problem(release: Release, target: Target) -> Stop | None:
    have, want = accelerator_build(release, target), target_build(target)
    if have.kind == want.kind and (want.kind == "cpu" or not have.version
                                   or _same_toolkit(want.version, have.version)):
        return None
    reason = (f"{release.name} {release.version} is a {have} build; targets.{target.name} "
              f"needs a {want} build")
    if want.kind == "cpu":
        return Stop(reason, f"a {release.name} {release.version}+cpu wheel in the target's "
                            "find_links")
    if have.kind == want.kind:
        return Stop(reason, f"a {want} build of {release.name} {release.version}, or raising "
                            f"targets.{target.name}.{want.kind} (and its base) to {have.version}")
    return Stop(reason, f"a {want} build of {release.name} {release.version} (an index or "
                        "find_links that has one)")


def unusable(package: Package, release: Release | None, version: str, target: Target,
             tags: frozenset[Tag]) -> Stop | None:
    """Why ``package`` at ``version`` cannot be installed on ``target`` whatever else is pinned
    (None: it can)."""
    name = package.name
    if release is None:
        return Stop(f"{name} {version}: no metadata in the snapshot",
                    "`build-env propose --online` (fetches it from the index)")
    if release.requires_python and not SpecifierSet(release.requires_python).contains(
            Version(f"{target.python}.0"), prereleases=True):
        return Stop(f"{name} {version} requires python {release.requires_python}; targets."
                    f"{target.name}.python is {target.python}",
                    f"a python in {release.requires_python} (targets.{target.name}.python)")
    if package.build == "source" and package.source is None and not release.sdist_sha256:
        return Stop(f"{name} {version} has no sdist on the index to build from",
                    f"a source of its own (packages.{name}.source: a git tag, a directory or "
                    "an archive), or a release with an sdist")
    if package.build == "wheel":
        if not release.has_wheel:
            return Stop(f"{name} {version} has no wheel on the index (only an sdist)",
                        f"a wheel of it, or building it from source (packages.{name}.build: "
                        "source)")
        if release.wheels and not any(wheel_fits(w, tags) for w in release.wheels):
            shown = ", ".join(sorted({w[:-4].split("-", 2)[-1] for w in release.wheels})[:4])
            return Stop(f"{name} {version} has no wheel for {target.arch} python "
                        f"{target.python} on glibc {glibc(target)} ({platform_label(target)});"
                        f" its wheels: {shown}",
                        f"a {name} wheel for {platform_label(target)}, or a base with a newer "
                        f"glibc (targets.{target.name}.base.glibc)")
    if name in ACCELERATOR_BUILDS:
        return build_problem(release, target)
    return None


