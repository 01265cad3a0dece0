"""Imports, driven by the manifest's ``imports`` map (distribution → module): a target
imports only what it pins or provides. Compiled extensions that a plain import can miss are
imported explicitly (``vllm._C``: ``import vllm`` only warns when it fails to load)."""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any

from .phase import Run, Step, skip
from .report import FAIL, PASS, Check

PHASE = "imports"

# Extra modules imported after the main one, per distribution.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm._C",),
    "verl": ("verl.single_controller",),
}


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
    for dist, module in sorted(run.manifest.get("imports", {}).items()):

        def main(r: Run, dist: str = dist, module: str = module) -> Check:
            mod, err = try_import(module)
            if err is not None:
                failed.add(dist)
            version = module_version(dist, mod) if mod is not None else None
            if version:
                r.fact(f"versions.{dist}", version)
            return decide_import(f"imports.{dist}", module, err, version)

        steps.append(Step((f"imports.{dist}",), main))
        for extra in EXTRA_MODULES.get(dist, ()):

            def sub(r: Run, extra: str = extra, dist: str = dist) -> Check:
                if dist in failed:
                    return skip(f"imports.{extra}", PHASE, f"not tried: import of {dist} failed",
                                required=True)
                mod, err = try_import(extra)
                return decide_import(f"imports.{extra}", extra, err, None if err else
                                     getattr(mod, "__version__", None))

            steps.append(Step((f"imports.{extra}",), sub))
    return steps
