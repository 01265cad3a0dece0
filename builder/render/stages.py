"""The source builds of a target, as data: what each is pinned to, and the build stage it gets
(what it copies, builds, and with which variables: the common ones and its block's,
:mod:`builder.render.blocks`). Computed without writing anything."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from builder.errors import RenderError
from builder.files import sha256_file
from builder.resolve.metadata import Snapshot
from builder.render.blocks import Block, block_for, common_env
from builder.resolve.sources import ARCHIVE_SUFFIXES, Pin, archive_suffix, split_git, tree_sha256
from builder.resolve.sources import load_record as load_source_record
from builder.matrix.spec import Package, Target

SOURCE_DIR = "/tmp/verl-env/source"


@dataclass(frozen=True)
class SourceStage:
    """One source package's build stage, as ``Dockerfile.j2`` reads it."""

    name: str
    version: str
    origin: str  # what it is built from, for the stage's comment
    notes: tuple[str, ...]
    src: str  # what the stage copies from the context
    copy_dest: str
    what: str  # pip wheel's argument
    env: tuple[tuple[str, str], ...]
    hashed: bool  # an sdist: --require-hashes
    cache_key: str
    bind: str  # the final stage's mount of its wheels


def source_name(p: Package) -> str:
    """The name of a package's local source in the context: a directory, or the archive's name."""
    assert p.source is not None
    if p.source.kind == "git" or (p.source.kind == "path" and Path(p.source.location).is_dir()):
        return p.name
    suffix = archive_suffix(p.source.location)
    if not suffix:
        raise RenderError(f"{p.name}: source {p.source.location} is neither a directory nor an "
                          f"archive ({', '.join(ARCHIVE_SUFFIXES)})")
    return p.name + suffix


def source_packages(target: Target) -> list[Package]:
    return [p for p in target.enabled_packages if p.build == "source"]


def source_pins(target: Target, snapshot: Snapshot, lock_file: Path | None) -> dict[str, Pin]:
    """What each source build is pinned to, known before anything is fetched: an sdist's hash
    (metadata snapshot), a git source's recorded commit (beside the lock), a directory's tree
    hash, an archive's sha256 (the file's, or the matrix's for a URL)."""
    record = load_source_record(lock_file) if lock_file is not None else {}
    pins: dict[str, Pin] = {}
    for p in source_packages(target):
        if p.source is None:
            rel = snapshot.release(p.name, p.version)
            assert rel is not None and rel.sdist_sha256  # sources.problems refused it otherwise
            pins[p.name] = Pin("sdist", f"sha256:{rel.sdist_sha256}")
        elif p.source.kind == "git":
            pins[p.name] = Pin("git", record[p.name]["commit"], record[p.name]["ref"])
        elif p.source.kind == "path" and Path(p.source.location).is_dir():
            pins[p.name] = Pin("tree", tree_sha256(Path(p.source.location)))
        elif p.source.kind == "path":
            pins[p.name] = Pin("archive", sha256_file(Path(p.source.location)))
        else:
            pins[p.name] = Pin("archive", f"sha256:{p.source.sha256}")
    return pins


def _block_env(block: Block, target: Target) -> list[tuple[str, str]]:
    """The block's variables; a GPU its build has no code for is a render error (check names
    it first, with its file and line)."""
    try:
        return list(block.env(target))
    except ValueError as exc:
        raise RenderError(str(exc), target=target.name) from None


def source_stages(target: Target, pins: dict[str, Pin], cache_inputs: str
                  ) -> tuple[SourceStage, ...]:
    """One build stage per source package. ``cache_inputs``: what every wheel is compiled
    against (base, torch layer, build tools, GPUs); its hash keys the packages' pip caches, so
    no wheel built against another torch is ever reused."""
    stages = []
    for p in source_packages(target):
        pin, block = pins[p.name], block_for(p.name)
        if pin.kind == "sdist":
            origin = f"its sdist on the index ({pin.value}), hash-checked"
            copy, dest, what = f"source/{p.name}.txt", "", f"-r {SOURCE_DIR}/{p.name}.txt"
        else:
            assert p.source is not None
            name = source_name(p)
            directory = pin.kind in ("git", "tree")
            origin = (f"{split_git(p.source.location)[0]} {pin.ref}, commit {pin.value}"
                      if pin.kind == "git" else f"a directory (tree {pin.value})"
                      if directory else f"an archive ({pin.value})")
            copy = f"source/{name}/" if directory else f"source/{name}"
            dest = f"{name}/" if directory else ""
            what = f"{SOURCE_DIR}/{name}"
        key = hashlib.sha256(f"{cache_inputs}\n{p.name}".encode()).hexdigest()[:12]
        stages.append(SourceStage(
            name=p.name, version=p.version, origin=origin, notes=block.notes, src=copy,
            copy_dest=dest, what=what, env=(*common_env(target, p), *_block_env(block, target)),
            hashed=pin.kind == "sdist", cache_key=key,
            bind=f"type=bind,from=source-{p.name},source=/wheels,"
                 f"target=/tmp/verl-env/built/{p.name}"))
    return tuple(stages)
