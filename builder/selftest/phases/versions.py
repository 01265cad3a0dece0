"""Versions: the manifest's pins and provided packages against what is installed, verl's own
declared requirements (``importlib.metadata.requires('verl')``, evaluated with the image's
``packaging``), Ray >= 2.40, and torch's build against the target's accelerator. A manifest
with reviewed dependency ``overrides`` adds ``versions.requires`` (:mod:`.requires`): every
installed distribution's requirements hold, the overrides the only accepted exceptions."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
from typing import Any, Callable, Iterable

from . import requires
from ..manifest import declared, pin_matches
from ..phase import Run, Step, skip
from ..report import FAIL, PASS, WARN, Check, threshold

PHASE = "versions"
RAY_MIN = "2.40"


def installed_version(name: str) -> str | None:
    """Installed version of a distribution, or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def packaging_parts() -> tuple[Any, Any] | None:
    """(Requirement, Version) from the image's ``packaging``, or None when absent."""
    try:
        from packaging.requirements import Requirement  # type: ignore[import-not-found]
        from packaging.version import Version  # type: ignore[import-not-found]
    except ImportError:
        return None
    return Requirement, Version


def decide_pin(name: str, pin: str, installed: str | None, kind: str = "pin",
               parse: Callable[[str], Any] | None = None) -> Check:
    """A pinned (or base-image provided) package must be installed at the pinned version."""
    cid = f"versions.{kind}.{name}"
    thr = threshold("==", pin, "manifest " + ("provided" if kind == "provided" else "pins"))
    if installed is None:
        return Check(cid, PHASE, FAIL, threshold=thr, reason=f"{name} is not installed")
    if pin_matches(pin, installed, parse):
        return Check(cid, PHASE, PASS, value=installed, threshold=thr)
    if kind == "provided":
        return Check(cid, PHASE, FAIL, value=installed, threshold=thr,
                     reason=f"{name}: the matrix claims the base provides {pin}, the image holds "
                            f"{installed}")
    return Check(cid, PHASE, FAIL, value=installed, threshold=thr,
                 reason=f"{name} {installed} installed, manifest says {pin}")


def dist_files(name: str) -> tuple[str | None, str | None]:
    """(dist-info location, sha256 of its RECORD) of the installed distribution, as
    builder.vendor's probe recorded them in the base."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None, None
    path = getattr(dist, "_path", None)
    if path is None:
        return None, None
    record = os.path.join(str(path), "RECORD")
    if not os.path.isfile(record):
        return str(path), None
    with open(record, "rb") as f:
        return str(path), "sha256:" + hashlib.sha256(f.read()).hexdigest()


def decide_base_files(name: str, expected: dict[str, Any], inspected: bool,
                      found: tuple[str | None, str | None]) -> Check:
    """A provided distribution's files must be the base's: the same dist-info location and the
    same RECORD (the list of its files with their hashes) as the probe of the base recorded;
    anything moved, reinstalled or shadowing it fails. The files themselves are not re-hashed
    against the RECORD (a file edited in place keeps the RECORD). A declared base (not
    inspected) cannot pass: required skip."""
    cid = f"versions.base_files.{name}"
    if not inspected or not expected.get("path"):
        return skip(cid, PHASE, "declared base, not yet inspected: run `build-env lock --probe` "
                                "on a host that can pull it", required=True)
    thr = threshold("==", expected.get("record"), f"RECORD of {expected.get('path')} in the base")
    path, record = found
    if path is None:
        return Check(cid, PHASE, FAIL, threshold=thr, reason=f"{name} is not installed")
    if path != expected["path"]:
        return Check(cid, PHASE, FAIL, value=path, threshold=thr,
                     reason=f"{name} is installed at {path}, the base has it at "
                            f"{expected['path']}")
    if record != expected.get("record"):
        return Check(cid, PHASE, FAIL, value=record, threshold=thr,
                     reason=f"{name}: its RECORD differs from the base's (reinstalled or "
                            "replaced)")
    return Check(cid, PHASE, PASS, value=record, threshold=thr)


def evaluate_requirements(reqs: Iterable[str], installed: Callable[[str], str | None],
                          requirement_cls: Any) -> tuple[int, list[str]]:
    """Evaluate requirement strings (markers for this interpreter, no extras) against the
    installed versions. Returns (how many applied, violations)."""
    applied, bad = 0, []
    for text in reqs:
        req = requirement_cls(text)
        if not requires.applies(req):
            continue
        applied += 1
        have = installed(req.name)
        if requires.holds(req, have):
            continue
        bad.append(f"{req.name} missing (needs {req.specifier or 'any'})" if have is None
                   else f"{req.name} {have} not in {req.specifier}")
    return applied, bad


def decide_verl_requires(verl_version: str | None, have_packaging: bool,
                         applied: int = 0, violations: list[str] | None = None) -> Check:
    """verl's declared requirements must all hold; skipped (required) when verl or
    ``packaging`` is missing."""
    cid = "versions.verl_requires"
    if verl_version is None:
        return skip(cid, PHASE, "verl is not installed", required=True)
    if not have_packaging:
        return skip(cid, PHASE, "packaging is not installed in the image: cannot evaluate "
                                "verl's requirements", required=True)
    violations = violations or []
    thr = threshold("==", 0, f"importlib.metadata.requires('verl') of verl {verl_version}")
    if violations:
        return Check(cid, PHASE, FAIL, value=len(violations), unit="violations", threshold=thr,
                     reason="; ".join(violations))
    return Check(cid, PHASE, PASS, value=0, unit="violations", threshold=thr,
                 reason=f"{applied} requirements hold")


def version_tuple(text: str) -> tuple[int, ...]:
    """Leading numeric release of a version string (fallback when packaging is absent)."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", text)
    return tuple(int(p) for p in m.group(1).split(".")) if m else ()


def decide_ray_min(installed: str | None) -> Check:
    """Ray older than 2.40 breaks verl on GPUs ("Duplicate GPU detected", verl#161)."""
    cid = "versions.ray_min"
    thr = threshold(">=", RAY_MIN, "verl#161; matrix refuses Ray < 2.40")
    if installed is None:
        return Check(cid, PHASE, FAIL, threshold=thr, reason="ray is not installed")
    if version_tuple(installed) < version_tuple(RAY_MIN):
        return Check(cid, PHASE, FAIL, value=installed, threshold=thr,
                     reason=f"ray {installed} < {RAY_MIN}")
    return Check(cid, PHASE, PASS, value=installed, threshold=thr)


def decide_torch_build(accelerator: str, torch_cuda: str | None, torch_hip: str | None,
                       manifest_cuda: str | None, manifest_rocm: str | None) -> Check:
    """torch must be built for the target's accelerator (a CPU torch in a CUDA image is a
    broken image) and for the manifest's CUDA/ROCm major version."""
    cid = "versions.torch_build"
    build = f"cuda {torch_cuda}" if torch_cuda else f"rocm {torch_hip}" if torch_hip else "cpu"
    if accelerator == "cpu":
        return Check(cid, PHASE, PASS, value=build, reason="cpu target")
    want, have, label = ((manifest_cuda, torch_cuda, "CUDA") if accelerator == "cuda"
                         else (manifest_rocm, torch_hip, "ROCm/HIP"))
    if not have:
        return Check(cid, PHASE, FAIL, value=build,
                     reason=f"{accelerator} target but torch is a {build} build")
    if want and version_tuple(want)[:1] != version_tuple(have)[:1]:
        return Check(cid, PHASE, FAIL, value=build, threshold=threshold("==", want),
                     reason=f"torch built for {label} {have}, manifest says {want}")
    if want and version_tuple(want)[:2] != version_tuple(have)[:2]:
        return Check(cid, PHASE, WARN, value=build, threshold=threshold("==", want),
                     reason=f"torch built for {label} {have}, manifest says {want} "
                            "(same major)")
    return Check(cid, PHASE, PASS, value=build)


def parse_torch_version_py(text: str) -> dict[str, str | None]:
    """``cuda``/``hip``/``__version__`` assignments of torch/version.py (no torch import)."""
    out: dict[str, str | None] = {}
    for key in ("__version__", "cuda", "hip"):
        mt = re.search(rf"^{key}\s*(?::[^=]*)?=\s*(?:'([^']*)'|\"([^\"]*)\"|None)", text,
                       re.MULTILINE)
        out[key] = (mt.group(1) or mt.group(2)) if mt and (mt.group(1) or mt.group(2)) else None
    return out


def torch_build_info() -> dict[str, str | None]:
    """torch's build (version, CUDA, HIP) read from torch/version.py without importing torch
    (importing it costs seconds); falls back to importing it."""
    try:
        spec = importlib.util.find_spec("torch")
        for loc in (spec.submodule_search_locations or []) if spec else []:
            path = os.path.join(loc, "version.py")
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    return parse_torch_version_py(f.read())
    except (ImportError, OSError, ValueError):
        pass
    import torch  # type: ignore[import-not-found]

    return {"__version__": torch.__version__, "cuda": torch.version.cuda,
            "hip": getattr(torch.version, "hip", None)}


def plan(run: Run) -> list[Step]:
    """Pins, provided packages, verl's requirements, every requirement under reviewed overrides,
    Ray minimum, torch build."""
    m = run.manifest
    parts = packaging_parts()
    parse = parts[1] if parts else None
    steps: list[Step] = []
    for kind in ("pins", "provided"):
        for name, pin in sorted(m.get(kind, {}).items()):
            label = "pin" if kind == "pins" else "provided"

            def pin_step(r: Run, name: str = name, pin: str = pin, label: str = label) -> Check:
                have = installed_version(name)
                if have:
                    r.fact(f"versions.{name}", have)
                return decide_pin(name, pin, have, label, parse)

            steps.append(Step((f"versions.{label}.{name}",), pin_step))
    base = m.get("base") if isinstance(m.get("base"), dict) else None
    for name, expected in sorted((base or {}).get("provided", {}).items()):
        def files_step(r: Run, name: str = name, expected: dict = expected) -> Check:
            return decide_base_files(name, expected, bool(base and base.get("inspected")),
                                     dist_files(name))

        steps.append(Step((f"versions.base_files.{name}",), files_step))
    if declared(m, "verl"):
        def verl_step(r: Run) -> Check:
            v = installed_version("verl")
            if v is None or parts is None:
                return decide_verl_requires(v, parts is not None)
            reqs = importlib.metadata.requires("verl") or []
            applied, bad = evaluate_requirements(reqs, installed_version, parts[0])
            return decide_verl_requires(v, True, applied, bad)

        steps.append(Step(("versions.verl_requires",), verl_step))
    if m.get("overrides"):
        steps.append(Step((requires.CHECK_ID,), lambda r: requires.check(r.manifest)))
    if declared(m, "ray"):
        steps.append(Step(("versions.ray_min",),
                          lambda r: decide_ray_min(installed_version("ray"))))
    if declared(m, "torch"):
        def torch_step(r: Run) -> Check:
            build = torch_build_info()
            for key in ("cuda", "hip"):
                r.fact(f"versions.{key}", build.get(key))
            return decide_torch_build(run.accelerator, build.get("cuda"), build.get("hip"),
                                      m.get("cuda"), m.get("rocm"))

        steps.append(Step(("versions.torch_build",), torch_step))
    return steps

