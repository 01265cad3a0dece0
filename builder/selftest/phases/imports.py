"""Imports, driven by the manifest's ``imports`` map (distribution → module): a target
imports only what it pins or provides. Compiled extensions that a plain import can miss are
imported explicitly, as the manifest's ``extensions`` map says (distribution -> lists of
alternative modules, the first that exists imported: a package whose import only warns when
its extension fails to load). The build carries that map from its catalogue; a manifest
without it imports no extra module.

A compiled GPU extension links the driver's user-space library (``libcuda.so.1``, ROCm's
``libamdhip64``/``libhsa-runtime64``), which exists only where a driver is installed. On a build
host without GPUs that import cannot run: it is reported as ``skip`` with the reason (required
only when GPUs are expected), never as a pass. The same holds for a package whose top-level
import loads such an extension (``import sgl_kernel`` loads ``libcuda.so.1``): the manifest's
imports go through :func:`decide_extension` too.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from typing import Any

from ..phase import Run, Step, skip
from ..report import FAIL, PASS, Check

PHASE = "imports"

DRIVER_LIBS = ("libcuda.so", "libamdhip64.so", "libhsa-runtime64.so", "libnvidia-ml.so")


def driver_missing(error: str | None) -> str | None:
    """The driver library an import failed on, if that is why it failed."""
    if error and error.startswith(("ImportError", "OSError")):
        for lib in DRIVER_LIBS:
            if lib in error:
                return lib
    return None


def extra_modules(manifest: dict[str, Any], dist: str) -> tuple[tuple[str, ...], ...]:
    """The extra modules imported after ``dist``'s (the manifest's ``extensions``): each a
    tuple of alternatives, one check, the first that exists imported."""
    entry = (manifest.get("extensions") or {}).get(dist) or ()
    return tuple(tuple(str(m) for m in c) for c in entry
                 if isinstance(c, list) and c and all(isinstance(m, str) for m in c))


def first_existing(candidates: tuple[str, ...]) -> str:
    """The first candidate module that can be found (else the first, to report its error)."""
    for name in candidates:
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except (ImportError, ValueError):
            continue
    return candidates[0]


def decide_extension(cid: str, module: str, error: str | None, version: str | None,
                     gpus_expected: bool) -> Check:
    """Like :func:`decide_import`, but a missing GPU driver library is a skip unless GPUs are
    expected (then it is a failure: the image cannot run on this node)."""
    lib = driver_missing(error)
    if lib and not gpus_expected:
        return skip(cid, PHASE, f"import {module} needs the GPU driver's {lib}, absent on this "
                    "host (no GPU expected): not run", required=False)
    return decide_import(cid, module, error, version)


def module_version(dist: str, module: Any) -> str | None:
    """The module's ``__version__``, else the distribution's metadata version."""
    v = getattr(module, "__version__", None)
    if isinstance(v, str):
        return v
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def decide_import(cid: str, module: str, error: str | None, version: str | None) -> Check:
    """Pass when the import succeeded; fail with the error text otherwise."""
    if error is not None:
        return Check(cid, PHASE, FAIL, value=module, reason=f"import {module} failed: {error}")
    return Check(cid, PHASE, PASS, value=version or module,
                 reason=f"import {module}" + ("" if version else " (no version found)"))


def try_import(module: str) -> tuple[Any, str | None]:
    """Import a module; return it, or None and the error text."""
    try:
        return importlib.import_module(module), None
    except BaseException as e:  # noqa: BLE001 - SystemExit from a broken package counts too
        return None, f"{type(e).__name__}: {e}"


def plan(run: Run) -> list[Step]:
    """One step per manifest import, plus the extra compiled modules."""
    steps: list[Step] = []
    failed: set[str] = set()
    driverless: set[str] = set()  # skipped at the driver boundary (no GPU expected)
    for dist, module in sorted(run.manifest.get("imports", {}).items()):

        def main(r: Run, dist: str = dist, module: str = module) -> Check:
            mod, err = try_import(module)
            version = module_version(dist, mod) if mod is not None else None
            if version:
                r.fact(f"versions.{dist}", version)
            # a package whose top-level import loads its GPU extension (``import sgl_kernel``
            # needs libcuda.so.1) stops at the same driver boundary as an extension does
            check = decide_extension(f"imports.{dist}", module, err, version,
                                     r.expect.expected)
            if err is not None:
                (driverless if check.status == "skip" else failed).add(dist)
            return check

        steps.append(Step((f"imports.{dist}",), main))
        for candidates in extra_modules(run.manifest, dist):
            cid = f"imports.{candidates[0]}"

            def sub(r: Run, candidates: tuple[str, ...] = candidates, dist: str = dist,
                    cid: str = cid) -> Check:
                if dist in failed:
                    return skip(cid, PHASE, f"not tried: import of {dist} failed", required=True)
                if dist in driverless:
                    return skip(cid, PHASE, f"not tried: import of {dist} needs the GPU "
                                "driver, absent on this host (no GPU expected)", required=False)
                extra = first_existing(candidates)
                mod, err = try_import(extra)
                return decide_extension(cid, extra, err, None if err else
                                        getattr(mod, "__version__", None), r.expect.expected)

            steps.append(Step((cid,), sub))
    return steps
