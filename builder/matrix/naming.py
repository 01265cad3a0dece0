"""Image names: an immutable content tag that hashes every input, and the moving release tag.

The content hash covers the whole rendered build context (Dockerfile, lock and its layers, the
baked manifest and self-test code, local wheels, the site CA), the resolved base images (repo
digest, or image ID for a local base) and the builder version. It is known before anything is
built, so an existing content tag means "this exact build already exists": it is reused, never
rebuilt under the same name, and never moved.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.matrix.spec import Target

CONTENT_SCHEMA = b"verl-env/content/v1\n"
CONTEXT_SCHEMA = b"verl-env/context/v1\n"


def content_hash(context: Path, bases: Iterable[str], builder_version: str) -> str:
    """sha256 over every file of ``context`` (relative path, mode bit, bytes), the resolved base
    image identities and the builder version."""
    h = hashlib.sha256(CONTENT_SCHEMA)
    h.update(f"builder {builder_version}\n".encode())
    for base in bases:
        h.update(f"base {base}\n".encode())
    _hash_files(h, context)
    return "sha256:" + h.hexdigest()


def context_digest(context: Path) -> str:
    """sha256 over every file of ``context`` alone (what a plan knows without an engine; the
    content hash adds the base images' identities and the builder version)."""
    h = hashlib.sha256(CONTEXT_SCHEMA)
    _hash_files(h, context)
    return "sha256:" + h.hexdigest()


def _hash_files(h: Any, context: Path) -> None:
    """Every file of ``context`` into ``h``: relative path, size, bytes, in path order."""
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        rel = path.relative_to(context).as_posix()
        h.update(f"file {rel} {path.stat().st_size}\n".encode())
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)


@dataclass(frozen=True)
class Names:
    content: str  # immutable: <prefix>:<target>-verl<v>-<hash12> (or -override-<hash12>)
    release: tuple[str, ...]  # moved only after a release verdict: <prefix>:<target>

    @property
    def all(self) -> tuple[str, ...]:
        return (self.content, *self.release)


def names(target: Target, prefix: str, content: str) -> Names:
    """An override build (``--set``/``--base-image``) never gets the reviewed release tag."""
    short = content.split(":")[-1][:12]
    if target.override:
        return Names(f"{prefix}:{target.name}-override-{short}", ())
    verl = target.package("verl")
    version = verl.version if verl else "none"
    return Names(f"{prefix}:{target.name}-verl{version}-{short}", (f"{prefix}:{target.name}",))
