"""Where the shipped reference files are. In a checkout they live once, at the top of the
repository: the reviewed ``matrix.yaml`` with ``metadata/`` and ``locks/`` beside it (as any site
keeps them) and ``dockerfiles/`` (the Dockerfile templates). An installed wheel carries the same
files as package data, ``builder/reference/`` and ``builder/dockerfiles/`` (pyproject.toml's
package-dir mapping: no second copy in the repository)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def reference_dir() -> Path:
    """The reference site: matrix, metadata snapshot and locks."""
    installed = PACKAGE / "reference"
    return installed if (installed / "matrix.yaml").is_file() else PACKAGE.parent


def dockerfiles_dir() -> Path:
    """The Dockerfile templates (``Dockerfile.j2``, ``_macros.j2``)."""
    installed = PACKAGE / "dockerfiles"
    return installed if (installed / "Dockerfile.j2").is_file() else PACKAGE.parent / "dockerfiles"
