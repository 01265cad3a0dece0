"""Everything a rendering decides, computed without writing anything (spack's model: a typed
context first, then writers): the install layers, the source builds and their pins, the prebuilt
wheels chosen, the vendor base, the manifest and labels, and the variables ``Dockerfile.j2``
reads. :mod:`builder.render.write` writes it out."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from builder.resolve import prebuilt as prebuilt_wheels
from builder.resolve import vendor as vendor_base
from builder.errors import RenderError
from builder.matrix.families import family
from builder.files import sha256_file, sha256_text
from builder.resolve.layers import Layer, split_layers
from builder.resolve.lock import LockedPackage, build_lock_path, parse_lock
from builder.resolve.metadata import Snapshot
from builder.render.baked import labels, manifest
from builder.render.blocks.base import venv_site
from builder.render.stages import (SourceStage, source_packages, source_pins,
                                   source_stages)
from builder.resolve.sources import Pin, refuse_problems
from builder.matrix.spec import Target

# Build dependencies of the source-build stage, per accelerator family (compilers stay there).
APT_BUILD = ("build-essential", "git")


@dataclass(frozen=True)
class RenderContext:
    """One target's rendering, decided. ``target`` has the prebuilt choices applied (a chosen
    package is a wheel, not a source build)."""

    target: Target
    lock_text: str
    lock_hash: str
    matrix_hash: str
    tools: tuple[LockedPackage, ...]  # the installer's layer (uv)
    layers: tuple[Layer, ...]
    build_tools: str | None  # the build-tools lock's text, when there are source builds
    pins: dict[str, Pin]  # what each source build is built from
    source_builds: tuple[SourceStage, ...]
    chosen: dict[str, dict[str, Any]]  # prebuilt wheels to fetch into the context
    decided: dict[str, dict[str, Any]]  # what `lock` chose per package with prebuilt wheels
    local_wheels: tuple[Path, ...]  # find-links wheels the lock pins
    ca_bundle: Path | None
    ca_hash: str | None
    base_record: dict[str, Any] | None
    lock_has_pip: bool  # the lock pins pip: the venv step leaves the base's out
    site_index: bool  # every fetching step mounts the site's index config (secrets)
    manifest: dict[str, Any]
    labels: dict[str, str]

    @property
    def bytecode(self) -> dict[str, str] | None:
        """What the templates need to byte-compile with the build machine's interpreter
        (``base.bytecode_image``; None: each install step's uv compiles with the image's)."""
        t = self.target
        if not t.base.bytecode_image:
            return None
        return {"image": t.base.bytecode_image, "python": t.python,
                "site": venv_site(t)}

    @property
    def vendor(self) -> dict[str, Any] | None:
        """What the templates say about a vendor base (None: the image's own venv)."""
        record = self.base_record
        if record is None:
            return None
        return {"python": vendor_base.interpreter(record), "tools": vendor_base.TOOLS_DIR,
                "kind": record.get("kind"), "inspected": bool(record.get("inspected")),
                "externally_managed": bool(record.get("externally_managed")),
                "provided": sorted(f"{p.name} {p.version}" for p in self.target.provided)}

    def template_vars(self) -> dict[str, Any]:
        """The variables ``Dockerfile.j2`` (the shipped one or a site's) reads."""
        t = self.target
        fam = family(t.accelerator)
        wheels = bool(self.local_wheels)
        return dict(
            target=t, layers=list(self.layers), matrix_hash=self.matrix_hash,
            lock_hash=self.lock_hash, base_ref=t.base.ref,
            source_base=t.base.source_image or t.base.ref, python_bin=f"python{t.python}",
            apt=sorted(t.apt), apt_build=sorted({*t.apt, *APT_BUILD, f"python{t.python}-dev"}),
            ca_bundle=self.ca_bundle is not None, wheels=wheels,
            find_links=["/tmp/verl-env/wheels"] if wheels else [],
            source_builds=list(self.source_builds), gpus=list(t.gpus),
            prebuilt=sorted(self.chosen), lock_has_pip=self.lock_has_pip, vendor=self.vendor,
            bytecode=self.bytecode,
            image_env=dict(fam.image_env) if fam else {}, labels=self.labels)


def compute(target: Target, lock_text: str, snapshot: Snapshot, *,
            lock_file: Path | None = None, ca_bundle: Path | None = None,
            base_record: dict[str, Any] | None = None,
            index_url: str | None = None) -> RenderContext:
    """Decide ``target``'s rendering from its lock (reads files, writes none). ``base_record``:
    the vendor base's record (default: the one beside ``lock_file``); what the base already
    holds is left out of the layers. ``index_url``: the site's package index (default:
    ``VERL_ENV_INDEX_URL``)."""
    if base_record is None and target.base.vendor:
        if lock_file is None:
            raise RenderError("a vendor base needs its base record (builder.resolve.vendor)",
                              target=target.name)
        base_record = vendor_base.load_record(target, lock_file)
    locked = parse_lock(lock_text)
    # prebuilt first: a package `lock` found a fitting hashed wheel for is installed from it
    decided = prebuilt_wheels.load_record(lock_file)
    chosen = prebuilt_wheels.wheels(target, lock_file)
    if chosen:
        target = replace(target, packages=tuple(
            replace(p, build="wheel", source=None, prebuilt=()) if p.name in chosen else p
            for p in target.packages))
    tools, layers = _layers(target, locked, set(chosen), base_record)
    build_tools = _build_tools(target, snapshot, lock_file)
    if base_record is not None and build_tools is not None:
        raise RenderError("source builds on a vendor base are not supported (the source "
                          "stage builds against a venv of its own)", target=target.name)
    wheels = tuple(_local_wheels(target, locked))
    if ca_bundle and not ca_bundle.is_file():
        raise RenderError(f"--ca-bundle {ca_bundle}: no such file", target=target.name)
    ca_hash = sha256_file(ca_bundle) if ca_bundle else None
    pins: dict[str, Pin] = {}
    stages: tuple[SourceStage, ...] = ()
    if build_tools is not None:
        pins = source_pins(target, snapshot, lock_file)
        torch_layer = "".join(layer.render() for layer in layers if layer.name == "torch")
        stages = source_stages(target, pins, "\n".join(
            [target.base.source_image or target.base.ref, torch_layer, build_tools,
             ",".join(target.gpus)]))
    lock_hash, matrix_hash = sha256_text(lock_text), target.entry_hash
    return RenderContext(
        target=target, lock_text=lock_text, lock_hash=lock_hash, matrix_hash=matrix_hash,
        tools=tools, layers=layers, build_tools=build_tools, pins=pins, source_builds=stages,
        chosen=chosen, decided=decided, local_wheels=wheels, ca_bundle=ca_bundle,
        ca_hash=ca_hash, base_record=base_record,
        lock_has_pip="pip" in locked,
        site_index=bool(index_url or os.environ.get("VERL_ENV_INDEX_URL")),
        manifest=manifest(target, matrix_hash, lock_hash, base_record, pins, decided,
                          installed=tuple(locked)),
        labels=labels(target, matrix_hash, lock_hash, ca_hash, pins, decided))


def _layers(target: Target, locked: dict[str, LockedPackage], chosen: set[str],
            base_record: dict[str, Any] | None
            ) -> tuple[tuple[LockedPackage, ...], tuple[Layer, ...]]:
    """The installer (uv, taken out of ``locked``) and the install layers: every locked package
    but the source builds, the prebuilt wheels and what a vendor base holds already."""
    engine = target.engine.name if target.engine and target.engine in target.packages else None
    tools = (locked.pop("uv"),) if "uv" in locked else ()
    if not tools:
        raise RenderError("the lock has no uv pin: regenerate it with `build-env lock`",
                          target=target.name)
    exclude = ({p.name for p in source_packages(target)} | chosen
               | vendor_base.already_there(locked, base_record))
    return tools, tuple(split_layers(locked, engine=engine, exclude=exclude))


def _build_tools(target: Target, snapshot: Snapshot, lock_file: Path | None) -> str | None:
    """The build-tools lock beside ``lock_file`` when the target builds from source (its
    sources checked first), else None."""
    if not source_packages(target):
        return None
    build_lock = build_lock_path(lock_file) if lock_file else None
    if build_lock is None or not build_lock.exists():
        raise RenderError(f"no build-tools lock beside {lock_file}: run `build-env lock`",
                          target=target.name)
    refuse_problems(target, snapshot, lock_file)
    return build_lock.read_text()


def _local_wheels(target: Target, locked: dict[str, LockedPackage]) -> list[Path]:
    """Wheels in the target's find-links directories that the lock pins (site builds)."""
    found = []
    for d in target.find_links:
        for wheel in sorted(Path(d).glob("*.whl")) if Path(d).is_dir() else ():
            digest = sha256_file(wheel)
            if any(digest in p.hashes for p in locked.values()):
                found.append(wheel)
    return found
