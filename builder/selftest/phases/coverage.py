"""Coverage: does the device code in the image's Python environment run on the GPUs the target
declares? Needs no GPU: it reads the CUDA fat binaries and HIP offload bundles of every ELF
shared object (``*.so``, ``*.so.*``) under the interpreter's site directories
(:mod:`.devcode`) and decides native / JIT / none per library and GPU (:mod:`.devcompat`).

Checks: ``coverage.scan`` (what was read, how long it took, and the whole table in its value),
then one ``coverage.<distribution>`` per distribution that carries device code for the target's
accelerator: pass when every library runs natively on every declared GPU, warn when one only
runs after a JIT compile, fail naming the library and the GPU it cannot run on. A library the
matrix lists in ``coverage_allow`` (a reviewed exception, with its reason: arch-specific kernels
the package loads only on the GPUs they were built for) may lack code for a declared GPU: its
cells read ``NONE (allowed)`` and the check names the exception instead of failing.
"""

from __future__ import annotations

import glob
import os
import site
import sys
import sysconfig
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..elf.devcode import DeviceCode, read_device_code
from ..elf.devcompat import NATIVE, NONE, Decision, decide_cuda, decide_rocm, worst
from ..manifest import normalize
from . import allowpath
from ..phase import Run, Step, skip
from ..report import CPU_TARGET, FAIL, PASS, SKIP, WARN, Check, threshold

PHASE = "coverage"
UNOWNED = "unowned"
NO_GPUS = ("the manifest declares no 'gpus' for this target (built before GPU lists existed); "
           "nothing to hold the device code against")


@dataclass
class Library:
    """One shared object with device code for the target's accelerator."""

    dist: str  # normalised distribution name, or "unowned"
    path: str  # relative to its site directory, e.g. torch/lib/libtorch_cuda.so
    images: list[str]  # distinct image names, e.g. sm_80, sm_90a, compute_90, gfx942
    decisions: dict[str, Decision] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    # GPU -> (fat binaries / bundles with no code for it, all of them), where the library as a
    # whole does run there: kernels of some translation units were built for other GPUs only
    gaps: dict[str, tuple[int, int]] = field(default_factory=dict)
    allowed: str | None = None  # the matrix's reason when coverage_allow names this library


def site_dirs() -> list[str]:
    """The site directories of the running interpreter (site-packages / dist-packages),
    existing, deduplicated, none inside another."""
    cands = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        cands.append(site.getusersitepackages())
    paths = sysconfig.get_paths()
    cands += [paths.get("purelib", ""), paths.get("platlib", "")]
    cands += [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    real = []
    for c in cands:
        if c and os.path.isdir(c):
            r = os.path.realpath(c)
            if r not in real:
                real.append(r)
    return [r for r in real if not any(r != o and r.startswith(o + os.sep) for o in real)]


def shared_objects(root: str) -> Iterable[str]:
    """Regular files named ``*.so`` or ``*.so.N...`` under ``root`` (symlinks not followed)."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if name.endswith(".so") or ".so." in name:
                path = os.path.join(dirpath, name)
                if not os.path.islink(path):
                    yield path


def owners(root: str) -> dict[str, str]:
    """Path relative to ``root`` → normalised distribution name, from ``*.dist-info/RECORD``."""
    out: dict[str, str] = {}
    for record in glob.glob(os.path.join(root, "*.dist-info", "RECORD")):
        dist = normalize(os.path.basename(os.path.dirname(record)).split("-")[0])
        try:
            with open(record, encoding="utf-8", errors="replace") as f:
                for line in f:
                    rel = line.split(",", 1)[0].strip().strip('"')
                    if rel:
                        out[os.path.normpath(rel)] = dist
        except OSError:
            continue
    return out


def images_for(code: DeviceCode, accelerator: str) -> list[str]:
    """Distinct image names of the accelerator's kind (CUDA for cuda, HIP for rocm)."""
    if accelerator == "cuda":
        return sorted({i.name for g in code.all_cuda_groups for i in g if not i.empty})
    return sorted({i.name for i in code.hip})


def decide(code: DeviceCode, accelerator: str, gpus: list[str]) -> dict[str, Decision]:
    """Per GPU, how the library's code runs there (the best of all its images)."""
    if accelerator == "cuda":
        cuda = [i for grp in code.all_cuda_groups for i in grp if not i.empty]
        return {g: decide_cuda(cuda, g) for g in gpus}
    return {g: decide_rocm(code.hip, g) for g in gpus}


def gaps(code: DeviceCode, accelerator: str, decisions: dict[str, Decision]) -> \
        dict[str, tuple[int, int]]:
    """Per GPU the library runs on, how many of its fat binaries (bundles) have no code for it
    (fat binaries holding only device-link stubs are not counted)."""
    raw: list[Any] = code.all_cuda_groups if accelerator == "cuda" else code.hip_groups
    distinct = Counter(frozenset(i for i in grp if not getattr(i, "empty", False))
                       for grp in raw)
    distinct.pop(frozenset(), None)
    total = sum(distinct.values())
    rule: Any = decide_cuda if accelerator == "cuda" else decide_rocm
    out = {}
    for g, d in decisions.items():
        if d.status == NONE or total < 2:
            continue
        lacking = sum(n for grp, n in distinct.items() if rule(grp, g).status == NONE)
        if lacking:
            out[g] = (lacking, total)
    return out


def scan(roots: list[str], accelerator: str, gpus: list[str]) -> tuple[list[Library], int]:
    """Every library with device code (or unreadable device code) under ``roots``, decided;
    and the number of ELF files read."""
    libs: list[Library] = []
    seen: set[tuple[int, int]] = set()
    files = 0
    for root in roots:
        owned: dict[str, str] | None = None
        for path in shared_objects(root):
            try:
                st = os.stat(path)
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                code = read_device_code(path)
            except OSError as e:
                code = DeviceCode(problems=[f"cannot read: {e.strerror or e}"])
            if code is None:
                continue
            files += 1
            imgs = images_for(code, accelerator)
            if not imgs and not code.problems:
                continue
            if owned is None:
                owned = owners(root)
            rel = os.path.relpath(path, root)
            lib = Library(owned.get(os.path.normpath(rel), UNOWNED), rel, imgs,
                          problems=list(code.problems))
            if imgs:
                lib.decisions = decide(code, accelerator, gpus)
                lib.gaps = gaps(code, accelerator, lib.decisions)
            libs.append(lib)
    libs.sort(key=lambda lib: (lib.dist, lib.path))
    return libs, files


def _status(lib: Library, gpu: str) -> str:
    d = lib.decisions.get(gpu)
    return d.status if d else NONE


def allowance(path: str, allow: dict[str, str]) -> str | None:
    """The reason of the first ``coverage_allow`` glob that matches the library's path (a
    glob's ``*`` stays within one path segment: :mod:`.allowpath`)."""
    return allowpath.reason(path, allow)


def lacking(lib: Library, gpus: list[str]) -> list[str]:
    """The declared GPUs the library has no code for (none when its code was not read)."""
    return [g for g in gpus if lib.images and _status(lib, g) == NONE]


def decide_allowances(libs: list[Library], gpus: list[str], allow: dict[str, str],
                      strict: bool) -> Check | None:
    """``coverage.allowances``: every ``coverage_allow`` entry must excuse a library that lacks
    code for a declared GPU here; one that excuses none is stale: a warning naming it, a
    failure under ``--strict``. None when the matrix allows nothing."""
    return allowpath.decide(
        f"{PHASE}.allowances", "coverage_allow", allow,
        [lib.path for lib in libs if lacking(lib, gpus)], "library lacking code for a declared GPU",
        "a library that lacks code for a declared GPU here", strict)


def decide_dist(dist: str, libs: list[Library], gpus: list[str]) -> Check:
    """One distribution's check: fail names every (library, GPU) with no code, a library whose
    device code could not be read is a required skip (unless another fails), JIT is a warn.
    A library the matrix allows (``coverage_allow``) is named with its reason, not failed."""
    cid = f"{PHASE}.{dist}"
    value = {g: worst(_status(lib, g) for lib in libs if lib.images) for g in gpus}
    thr = threshold("runs on", gpus, "manifest gpus")
    missing, allowed = [], []
    for lib in libs:
        gaps_ = lacking(lib, gpus)
        if gaps_ and lib.allowed:
            allowed.append(f"{lib.path} has no code for {', '.join(gaps_)}, allowed by the "
                           f"matrix: {lib.allowed}")
        elif gaps_:
            missing.append(f"{lib.path} has no code for {', '.join(gaps_)} "
                           f"(has {','.join(lib.images)})")
    unread = [f"{lib.path}: {'; '.join(lib.problems[:2])}" for lib in libs if lib.problems]
    if missing:
        return Check(cid, PHASE, FAIL, value=value, threshold=thr,
                     reason=f"{dist}: " + "; ".join(missing + unread))
    if unread:
        return Check(cid, PHASE, SKIP, value=value, threshold=thr,
                     reason=f"{dist}: device code not readable: " + "; ".join(unread))
    jit = [f"{lib.path} on {g} by JIT from {lib.decisions[g].by}" for lib in libs
           for g in gpus if lib.images and _status(lib, g) not in (NATIVE, NONE)]
    if jit:
        return Check(cid, PHASE, WARN, value=value, threshold=thr,
                     reason=f"{dist}: runs only after a JIT compile at first load: "
                            + "; ".join(jit + allowed))
    return Check(cid, PHASE, PASS, value=value, threshold=thr,
                 reason=f"{dist}: " + "; ".join(allowed) if allowed else "")


def table(libs: list[Library], gpus: list[str]) -> list[dict[str, Any]]:
    """The coverage table: one row per library (``gaps``: GPU -> "n/m" fat binaries of a
    library that runs there which have no code for it)."""
    rows = []
    for lib in libs:
        row: dict[str, Any] = {"dist": lib.dist, "library": lib.path, "code": lib.images,
                               "gpus": {g: _status(lib, g) if lib.images else "unreadable"
                                        for g in gpus}}
        if lib.gaps:
            row["gaps"] = {g: f"{n}/{m}" for g, (n, m) in lib.gaps.items()}
        if lib.problems:
            row["problems"] = lib.problems
        if lib.allowed:
            row["allowed"] = lib.allowed
        rows.append(row)
    return rows


def check_coverage(run: Run, roots: list[str] | None = None) -> list[Check]:
    """The phase's one step: scan, decide, one check per distribution."""
    gpus = run.manifest.get("gpus")
    if not gpus:
        return [skip(f"{PHASE}.scan", PHASE, NO_GPUS, required=True)]
    roots = roots if roots is not None else (run.options.get("coverage_roots") or site_dirs())
    t0 = time.monotonic()
    libs, files = scan(roots, run.accelerator, gpus)
    elapsed = time.monotonic() - t0
    for lib in libs:
        lib.allowed = allowance(lib.path, run.manifest.get("coverage_allow") or {})
    dists = sorted({lib.dist for lib in libs})
    value = {"roots": roots, "elf_files": files, "libraries": len(libs),
             "distributions": len(dists), "seconds": round(elapsed, 3), "gpus": gpus,
             "table": table(libs, gpus)}
    reason = (f"{_n(files, 'ELF file')}, {len(libs)} with {run.accelerator} device code, "
              f"{_n(len(dists), 'distribution')}, in {elapsed:.2f} s")
    if not libs:  # a GPU image whose environment holds no device code at all: say so
        reason += f"; no {run.accelerator} device code under {', '.join(roots) or 'no root'}"
    checks = [Check(f"{PHASE}.scan", PHASE, PASS if libs else WARN, value=value,
                    duration_s=elapsed, reason=reason)]
    checks += [decide_dist(d, [lib for lib in libs if lib.dist == d], gpus) for d in dists]
    allowances = decide_allowances(libs, gpus, run.manifest.get("coverage_allow") or {},
                                   bool(run.options.get("strict")))
    return checks + ([allowances] if allowances else [])


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def plan(run: Run) -> list[Step]:
    """cuda/rocm: one step (required); cpu: not applicable."""
    if run.accelerator not in ("cuda", "rocm"):
        return [Step((f"{PHASE}.scan",),
                     lambda r: skip(f"{PHASE}.scan", PHASE, CPU_TARGET, applies=False),
                     required=False, applies=False)]
    return [Step((f"{PHASE}.scan",), check_coverage)]
