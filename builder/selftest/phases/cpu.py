"""Functional CPU checks: what the catalogue says to run of each package (the manifest's
``checks``: tensordict's ``"k" in td`` membership, broken on old and arm64 fallback versions),
an N-rank gloo all-reduce (FileStore rendezvous, exact result), and for
each package built from source (the manifest's ``source_builds``), ``cpu.source_build.NAME``:
its compiled modules import, were compiled for the image's architecture (the ELF machine of
every ``.so``), and its smoke entry point (``verl_env_smoke()``, when it has one) returns True."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import struct
import sys
from collections.abc import Mapping
from typing import Any

from ..manifest import PAYLOAD_CHECKS as CHECKS_FILE, declared, payload_file, read_payload
from ..phase import Run, Step, rank_timeout
from ..launch.ranks import decide_allreduce, spawn_local
from ..report import FAIL, PASS, Check

PHASE = "cpu"
# the catalogue's checks this self-test was shipped with (beside the package; absent when it
# runs from a source tree)
PAYLOAD_CHECKS = payload_file(CHECKS_FILE)
GLOO_CHECK_BYTES = 4 << 20
GLOO_BW_BYTES = 16 << 20


def decide_catalogued(cid: str, error: Exception | None, passed: str,
                      version: str | None) -> Check:
    """A catalogued check passed when its code ran to its end; an assert's message (or the
    exception) is the failure's reason."""
    if error is None:
        return Check(cid, PHASE, PASS, value=version, reason=passed)
    text = str(error)
    reason = text if isinstance(error, AssertionError) and text else \
        f"{type(error).__name__}: {text}"
    return Check(cid, PHASE, FAIL, value=version, reason=reason)


def catalogued_step(dist: str, name: str, entry: Mapping[str, str]) -> Step:
    """``cpu.<dist>_<name>``: run the catalogue's code for ``dist`` (the manifest's ``checks``)
    in this process, which imported the stack already."""
    cid = f"cpu.{dist.replace('-', '_')}_{name}"

    def step(run: Run) -> Check:
        try:
            version: str | None = importlib.metadata.version(dist)
        except Exception:  # noqa: BLE001 - not installed: the code's import says why
            version = None
        error: Exception | None = None
        try:
            exec(compile(entry["code"], f"<catalogue {dist}.{name}>", "exec"),  # noqa: S102
                 {"__name__": f"verl_env_check_{name}"})
        except Exception as e:  # noqa: BLE001 - the package's failure is the verdict
            error = e
        return decide_catalogued(cid, error, entry["pass"], version)

    return Step((cid,), step)


def gloo_step(run: Run) -> Check:
    """``--gloo-ranks`` ranks (default 2) all-reduce over gloo: forked from this process once
    it imported ``torch.distributed`` (no rank imports torch again); spawned as new interpreters
    when that import fails here, so each rank's log says why."""
    opts = run.options
    world = int(opts.get("gloo_ranks", 2))
    try:
        import torch.distributed  # type: ignore[import-not-found]  # noqa: F401 - the ranks' import, once
        fork = True
    except Exception:  # noqa: BLE001 - the spawned ranks report it
        fork = False
    res = spawn_local("gloo", world, ["cpu"] * world, GLOO_CHECK_BYTES, GLOO_BW_BYTES,
                      iters=3, warmup=1, timeout=rank_timeout(run, PHASE),
                      workdir=run.ctx.get("workdir"), fork=fork)
    run.fact("cpu.gloo_world", world)
    run.fact("cpu.gloo_transport", "gloo/tcp")
    return decide_allreduce("cpu.gloo_allreduce", PHASE, res, transport="gloo/tcp")


# ELF e_machine per architecture (the manifest's arch names).
ELF_MACHINES = {"x86_64": 62, "aarch64": 183}
SMOKE = "verl_env_smoke"


def elf_machine(path: str) -> int | None:
    """The ELF header's e_machine of a shared object (None when it is not ELF)."""
    with open(path, "rb") as f:
        head = f.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    return struct.unpack("<H" if head[5] == 1 else ">H", head[18:20])[0]


def _module_of(rel: str) -> str:
    """``pkg/_C.cpython-311-aarch64-linux-gnu.so`` -> ``pkg._C``."""
    parts = rel.split("/")
    parts[-1] = parts[-1].split(".", 1)[0]
    return ".".join(parts)


def _loaded_as(path: str) -> str | None:
    """The name under which ``sys.modules`` already holds the file ``path`` (None if none)."""
    real = os.path.realpath(path)
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and os.path.realpath(file) == real:
            return name
    return None


def import_compiled(mod: str, path: str) -> str:
    """Import the compiled module ``mod`` (file ``path``) once: its package first (whose
    loader may load the very file under another name, as TransformerEngine's does with
    ``transformer_engine_torch``), then the module only if no name holds that file yet: a
    pybind11 module imported twice under two names fails ("DType is already registered").
    Returns the name it is loaded under."""
    if "." in mod:
        importlib.import_module(mod.rsplit(".", 1)[0])
    held = _loaded_as(path)
    if held is not None:
        return held
    importlib.import_module(mod)
    return mod


def decide_source_build(name: str, arch: str | None, modules: dict[str, int | None],
                        errors: list[str], smoke: object, smoke_error: str | None,
                        version: str | None) -> Check:
    """Pass only when there is a compiled module, each imported and is for ``arch``, and the
    smoke entry point (when the package has one) returned True."""
    cid = f"cpu.source_build.{name}"
    if errors:
        return Check(cid, PHASE, FAIL, value=version, reason="; ".join(errors))
    if not modules:
        return Check(cid, PHASE, FAIL, value=version,
                     reason=f"{name} has no compiled module: nothing shows it was built here")
    want = ELF_MACHINES.get(arch or "")
    wrong = {m: e for m, e in modules.items() if want is None or e != want}
    if wrong:
        return Check(cid, PHASE, FAIL, value=version,
                     reason=f"compiled for ELF machine {wrong}, the image is {arch} "
                            f"({want}): built for the wrong architecture")
    if smoke_error is not None:
        return Check(cid, PHASE, FAIL, value=version, reason=smoke_error)
    if smoke is not None and smoke is not True:
        return Check(cid, PHASE, FAIL, value=version,
                     reason=f"{SMOKE}() returned {smoke!r}, expected True")
    called = f", {SMOKE}() returned True" if smoke is True else ""
    return Check(cid, PHASE, PASS, value=version,
                 reason=f"{len(modules)} compiled module(s) for {arch} "
                        f"({', '.join(sorted(modules))}) imported{called}")


def source_build_step(name: str) -> "Step":
    def step(run: Run) -> Check:
        arch = run.manifest.get("arch")
        modules: dict[str, int | None] = {}
        errors: list[str] = []
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            return decide_source_build(name, arch, {}, [f"{name} is not installed"], None,
                                       None, None)
        version = dist.version
        tops: list[str] = []
        for f in dist.files or ():
            rel = str(f)
            top = rel.split("/", 1)[0]
            if "/" in rel and not top.endswith((".dist-info", ".data")) and top not in tops:
                tops.append(top)
            if not rel.endswith(".so") or ".dist-info" in rel:
                continue
            mod = _module_of(rel)
            try:
                path = str(dist.locate_file(f))
                modules[mod] = elf_machine(path)
                import_compiled(mod, path)
            except BaseException as e:  # noqa: BLE001
                errors.append(f"import {mod} failed: {type(e).__name__}: {e}")
        smoke, smoke_error = None, None
        for top in tops:
            try:
                fn = getattr(importlib.import_module(top), SMOKE, None)
            except BaseException as e:  # noqa: BLE001
                errors.append(f"import {top} failed: {type(e).__name__}: {e}")
                continue
            if callable(fn):
                try:
                    smoke = fn()
                except BaseException as e:  # noqa: BLE001
                    smoke_error = f"{top}.{SMOKE}() raised {type(e).__name__}: {e}"
                break
        run.fact(f"source_build.{name}.machine", platform.machine())
        return decide_source_build(name, arch, modules, errors, smoke, smoke_error, version)

    return Step((f"cpu.source_build.{name}",), step)


def catalogued(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The catalogue's checks the phase runs: the manifest's ``checks``, even empty; without
    the key (an image built before the checks travelled with it, or not by verl-env), those of
    the payload's copy for the distributions the manifest declares."""
    if "checks" in manifest:
        return dict(manifest["checks"] or {})
    shipped = read_payload(PAYLOAD_CHECKS)
    if not isinstance(shipped, dict):
        return {}
    return {d: c for d, c in shipped.items() if isinstance(c, dict) and declared(manifest, d)}


def plan(run: Run) -> list[Step]:
    """The catalogue's checks of the target's packages (:func:`catalogued`); gloo when it has
    torch; each source build's."""
    steps = [catalogued_step(dist, name, entry)
             for dist, checks in sorted(catalogued(run.manifest).items())
             for name, entry in sorted(checks.items())]
    if declared(run.manifest, "torch"):
        steps.append(Step(("cpu.gloo_allreduce",), gloo_step))
    for name in run.manifest.get("source_builds") or ():
        steps.append(source_build_step(name))
    return steps
