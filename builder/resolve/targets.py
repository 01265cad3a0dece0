"""Where a matrix lives, and the targets in it: the core that both the CLI and the pipeline use.

A *site* is a directory holding ``matrix.yaml`` with its ``metadata/pypi-snapshot.json`` and
``locks/`` beside it. The reference site ships inside the package (:mod:`builder.shipped`), so an
installed ``build-env`` works from any directory; a site keeps its own copy in its own repository
(``build-env init DIR``). When a site lacks its snapshot or a lock, one error names the command
that makes it, instead of one line per package.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from builder import shipped
from builder.resolve.compat import local_sources
from builder.errors import SiteError
from builder.resolve.metadata import Snapshot, load_snapshot, snapshot_path
from builder.matrix.spec import Matrix, Target, apply_overrides, load_matrix


SITE_DIRS = ("metadata", "locks")  # beside matrix.yaml


def reference_dir() -> Path:
    """The reference site shipped in the package: matrix, metadata snapshot and locks."""
    return shipped.reference_dir()


def default_matrix() -> Path:
    """``./matrix.yaml`` when the working directory is a site, else the shipped reference."""
    here = Path("matrix.yaml")
    return here if here.is_file() else reference_dir() / "matrix.yaml"


@dataclass(frozen=True)
class Site:
    matrix: Matrix
    snapshot_file: Path

    @property
    def path(self) -> Path:
        return self.matrix.path

    def targets(self, names: Iterable[str] | None = None) -> list[Target]:
        chosen = list(names or [])
        return [self.matrix.target(n) for n in chosen] if chosen else list(
            self.matrix.targets.values())

    def snapshot(self, targets: Iterable[Target] = ()) -> Snapshot:
        """The metadata snapshot; one clear error when it is missing or lacks pinned releases.

        Packages built from a local directory, archive or URL need no entry: the index may not
        know them at all (a site's own extension); they are never resolved from it."""
        fix = f"build-env check --online --matrix {self.path}"
        if not self.snapshot_file.is_file():
            raise SiteError(f"no metadata snapshot at {self.snapshot_file} for {self.path}: run "
                            f"`{fix}` to fetch it (or `build-env init DIR` for a starter site)")
        snap = load_snapshot(self.snapshot_file)
        missing = sorted({f"{p.name}=={p.version}" for t in targets for p in t.enabled_packages
                          if snap.release(p.name, p.version) is None
                          and p.name not in local_sources(t)})
        if missing:
            shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more"
                                              if len(missing) > 6 else "")
            raise SiteError(f"{self.snapshot_file} has no metadata for {len(missing)} pinned "
                            f"release(s) ({shown}): run `{fix}`")
        return snap


def open_site(matrix: Path | None = None, snapshot: Path | None = None) -> Site:
    m = load_matrix(matrix or default_matrix())
    return Site(m, snapshot or snapshot_path(m.path))


def resolve_target(site: Site, name: str, overrides: Iterable[str] = (),
                   base_image: str | None = None) -> Target:
    """The matrix target with ``--set``/``--base-image`` applied."""
    return apply_overrides(site.matrix.target(name), list(overrides), base_image=base_image)


def init_site(directory: Path) -> list[Path]:
    """Write a starter site: the reference matrix, its snapshot and locks, and a README line.
    Refuses to overwrite an existing matrix (nothing is written then)."""
    directory = Path(directory)
    if (directory / "matrix.yaml").exists():
        raise SiteError(f"{directory / 'matrix.yaml'} exists: refusing to overwrite a site")
    ref = reference_dir()
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    staging = directory / ".verl-env-init.part"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        shutil.copy2(ref / "matrix.yaml", staging / "matrix.yaml")
        for part in SITE_DIRS:  # only the site's own files (in a checkout ref is the repo root)
            shutil.copytree(ref / part, staging / part,
                            ignore=shutil.ignore_patterns("__pycache__", "*.py"))
        (staging / "README.md").write_text(
            "# verl-env site\n\nThis directory is a verl-env site: `matrix.yaml` (the reviewed "
            "compatibility matrix), `metadata/` (its package-metadata snapshot) and `locks/`. "
            "Edit the matrix, then run `build-env check --online && build-env lock` here, and "
            "`build-env --target T` to build.\n")
        for src in sorted(staging.rglob("*")):
            dest = directory / src.relative_to(staging)
            if src.is_dir():
                dest.mkdir(exist_ok=True)
            elif not dest.exists():
                src.replace(dest)
                written.append(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written
