"""Where the shipped files are. In a checkout the reference files live once, at the top of the
repository: the reviewed ``matrix.yaml`` with ``metadata/`` and ``locks/`` beside it (as any site
keeps them) and ``dockerfiles/`` (the Dockerfile templates). An installed wheel carries the same
files as package data, ``builder/reference/`` and ``builder/dockerfiles/`` (pyproject.toml's
package-dir mapping: no second copy in the repository).

The self-test payload (the ``builder/selftest`` package, stdlib only) is what goes into an image
(baked by the Dockerfile, copied in by the gate, run from a SIF): :func:`selftest_files` is the one
list of its files, :func:`copy_selftest` writes them to a directory."""

from __future__ import annotations

import json
from pathlib import Path

from builder import catalog
from builder.selftest.manifest import PAYLOAD_CHECKS, PAYLOAD_LOADER_RULES

PACKAGE = Path(__file__).resolve().parent


def reference_dir() -> Path:
    """The reference site: matrix, metadata snapshot and locks."""
    installed = PACKAGE / "reference"
    return installed if (installed / "matrix.yaml").is_file() else PACKAGE.parent


def dockerfiles_dir() -> Path:
    """The Dockerfile templates (``Dockerfile.j2``, ``_macros.j2``)."""
    installed = PACKAGE / "dockerfiles"
    return installed if (installed / "Dockerfile.j2").is_file() else PACKAGE.parent / "dockerfiles"


def selftest_dir() -> Path:
    """The self-test package as shipped (``builder/selftest``)."""
    return PACKAGE / "selftest"


def selftest_files() -> list[tuple[str, bytes]]:
    """The self-test payload: (path relative to the package, content), sorted; no byte code.
    With the package go the shipped catalogue's ABI loader rules and the checks of every
    distribution (``checks:``), under the names the self-test reads them by: its ABI and cpu
    phases fall back on them when they hold an image whose manifest has none (built before they
    travelled in the manifest, or not by verl-env)."""
    root = selftest_dir()
    files = [(str(p.relative_to(root)), p.read_bytes()) for p in sorted(root.rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    cat = catalog.shipped()
    rules = json.dumps(cat.abi_loader(), indent=1, sort_keys=True) + "\n"
    checks = json.dumps(cat.checks(cat.distributions), indent=1, sort_keys=True) + "\n"
    return sorted([*files, (PAYLOAD_LOADER_RULES, rules.encode()),
                   (PAYLOAD_CHECKS, checks.encode())])


def native_bytecode_script() -> bytes:
    """The bytecode stage's script, beside the templates that run it
    (``dockerfiles/native_bytecode.py``): a program of the build, not of the tool (stdlib only,
    run by the build machine's own interpreter in the bytecode stage and the install steps)."""
    return (dockerfiles_dir() / "native_bytecode.py").read_bytes()


def copy_selftest(dest: Path) -> Path:
    """Write the self-test payload under ``dest`` (created); returns ``dest``."""
    for rel, data in selftest_files():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    dest.mkdir(parents=True, exist_ok=True)
    return dest
