"""What is baked into an image about itself: the manifest (the self-test asserts it)
and the OCI labels, both computed from the target, the hashes and the source pins."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from builder import __version__, catalog
from builder.matrix import overrides
from builder.resolve import vendor as vendor_base
from builder.resolve.sources import Pin, describe
from builder.matrix.spec import Target

LABEL_NS = "org.verl-env"
MANIFEST_SCHEMA = "verl-env/manifest/v1"


def manifest(target: Target, matrix_hash: str, lock_hash: str,
             base_record: dict[str, Any] | None = None,
             sources: dict[str, Pin] | None = None,
             decided: dict[str, dict[str, Any]] | None = None,
             installed: Iterable[str] = ()) -> dict[str, Any]:
    """What the image must hold; the self-test asserts it (schema in docs/architecture.md).
    ``gpus``: the GPU architectures the image must run on (the coverage phase holds every ELF
    shared object to them). A vendor base adds the ``base`` section
    (builder.resolve.vendor.manifest_section); ``source_pins`` says what each source build was built
    from (git commit, tree or archive sha256, sdist hash). ``installed``: the lock's
    distributions, whose catalogued loader rules (``abi_loader``) travel with the image."""
    cat = catalog.load(Path(target.file).parent)
    installed = tuple(installed)
    pins = {p.name: p.version for p in target.enabled_packages}
    provided = {p.name: p.version for p in target.provided}
    # what the catalogue imports, and every package whose import the matrix names
    # (sglang-kernel: sgl_kernel)
    imports = {p.name: p.module for p in (*target.enabled_packages, *target.provided)
               if cat.imported(p.name) or p.import_name}
    # and what the lock installs that the catalogue imports wherever it is installed (the
    # packages of verl's extras: cupy, trl, liger-kernel, flash-linear-attention ...)
    imports.update({n: cat.import_name(n) for n in installed
                    if n not in imports and cat.imported_when_locked(n)})
    extensions = {n: [list(c) for c in d.extensions] for n in imports
                  if (d := cat.get(n)) is not None and d.extensions}
    checks = cat.checks(imports)
    loader = cat.abi_loader({*pins, *provided, *installed})
    return {
        "schema": MANIFEST_SCHEMA, "target": target.name, "accelerator": target.accelerator,
        "arch": target.arch, "python": target.python, "cuda": target.cuda, "rocm": target.rocm,
        "pins": dict(sorted(pins.items())), "provided": dict(sorted(provided.items())),
        "imports": dict(sorted(imports.items())),
        **({"extensions": dict(sorted(extensions.items()))} if extensions else {}),
        # what the gate runs of each imported package (the catalogue's checks; present even
        # when empty: the self-test falls back on its payload's copy only without the key)
        "checks": checks,
        "source_builds": sorted(p.name for p in target.enabled_packages if p.build == "source"),
        "gpus": list(target.gpus),
        **({"coverage_allow": dict(target.coverage_allow)} if target.coverage_allow else {}),
        **({"abi_allow": dict(target.abi_allow)} if target.abi_allow else {}),
        **({"record_shared": dict(target.record_shared)} if target.record_shared else {}),
        # what the installed packages load themselves (the catalogue's abi rules): the self-test
        # keeps only the loader's mechanics
        **({"abi_loader": loader} if loader else {}),
        # reviewed dependency overrides (builder.matrix.overrides): the gate's requirement check
        # accepts exactly the requirements each one replaces
        **({"overrides": {o.name: o.to_value() for o in target.overrides}}
           if target.overrides else {}),
        **({"source_pins": describe(sources)} if sources else {}),
        # prebuilt first: per package with prebuilt wheels, what `lock` chose and why
        **({"prebuilt": {n: {k: v for k, v in e.items() if k != "entries"}
                         for n, e in sorted(decided.items())}} if decided else {}),
        "matrix_hash": matrix_hash, "lock_hash": lock_hash, "override": target.override,
        **({"base": vendor_base.manifest_section(target, base_record)} if base_record else {}),
    }


def labels(target: Target, matrix_hash: str, lock_hash: str, ca_hash: str | None,
           sources: dict[str, Pin] | None = None,
           decided: dict[str, dict[str, Any]] | None = None) -> dict[str, str]:
    """OCI labels: every pin, provided package, the GPUs, what each source build was built
    from, the matrix and lock hashes."""
    out = {
        "org.opencontainers.image.title": f"verl-env {target.name}",
        "org.opencontainers.image.description": target.description or target.name,
        f"{LABEL_NS}.target": target.name, f"{LABEL_NS}.accelerator": target.accelerator,
        f"{LABEL_NS}.arch": target.arch, f"{LABEL_NS}.python": target.python,
        f"{LABEL_NS}.base": target.base.ref, f"{LABEL_NS}.matrix-hash": matrix_hash,
        f"{LABEL_NS}.lock-hash": lock_hash, f"{LABEL_NS}.override": str(target.override).lower(),
        f"{LABEL_NS}.builder": __version__,
    }
    if target.cuda:
        out[f"{LABEL_NS}.cuda"] = target.cuda
    if target.rocm:
        out[f"{LABEL_NS}.rocm"] = target.rocm
    for p in target.enabled_packages:
        out[f"{LABEL_NS}.pin.{p.name}"] = p.version + (" (source)" if p.build == "source" else "")
    for p in target.provided:
        out[f"{LABEL_NS}.provided.{p.name}"] = p.version
    if target.gpus:
        out[f"{LABEL_NS}.gpus"] = ",".join(target.gpus)
    out.update(overrides.labels(target.overrides, LABEL_NS))
    for name, pin in (sources or {}).items():
        out[f"{LABEL_NS}.source.{name}"] = pin.label()
    for name, entry in (decided or {}).items():
        out[f"{LABEL_NS}.prebuilt.{name}"] = (
            f"{entry['filename']} sha256:{entry['sha256']}" if entry["choice"] == "wheel"
            else "none fits: built from source")
    if ca_hash:
        out[f"{LABEL_NS}.site-ca"] = ca_hash
    return dict(sorted(out.items()))
