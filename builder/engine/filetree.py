"""An image's file tree, as its flattened filesystem says (``docker export`` of a created, never
started container: the engine applies the layers and their whiteouts): one :class:`FileEntry`
per path, with its type, mode, owner, size, the SHA-256 of a regular file's bytes, and a link's
target. Modification times are not kept: a rebuild writes every file anew.

:func:`read_tree` reads any tar stream (pure: the tests hand it tar files they make);
:meth:`builder.engine.Engine.file_tree` streams an image's export into it, holding no file of it
on disk or in memory beyond one read block.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

BLOCK = 1 << 20

KINDS = {tarfile.REGTYPE: "file", tarfile.AREGTYPE: "file", tarfile.CONTTYPE: "file",
         tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hardlink",
         tarfile.CHRTYPE: "char", tarfile.BLKTYPE: "block", tarfile.FIFOTYPE: "fifo"}


@dataclass(frozen=True)
class FileEntry:
    """One path of an image. ``digest``: ``sha256:...`` of a regular file's bytes (a hard link
    carries its target's); ``link``: a symlink's or hard link's target (absolute path for a hard
    link); ``device``: ``major:minor`` of a device node."""

    path: str
    kind: str
    mode: int
    uid: int
    gid: int
    size: int = 0
    digest: str | None = None
    link: str | None = None
    device: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "type": self.kind,
                               "mode": f"{self.mode:04o}", "owner": f"{self.uid}:{self.gid}",
                               "size": self.size}
        for key, value in (("digest", self.digest), ("link", self.link),
                           ("device", self.device)):
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FileEntry:
        uid, _, gid = str(data["owner"]).partition(":")
        return cls(str(data["path"]), str(data["type"]), int(str(data["mode"]), 8), int(uid),
                   int(gid or 0), int(data.get("size") or 0), data.get("digest"),
                   data.get("link"), data.get("device"))


class _ChunkReader(io.RawIOBase):
    """A file object over an iterator of byte chunks (the engine's export stream)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, out: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(out), len(self._buf))
        out[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def _path(name: str) -> str:
    name = name.removeprefix("./").rstrip("/")
    return "/" + name.lstrip("/") if name not in ("", ".") else "/"


def _digest(tar: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    h = hashlib.sha256()
    handle = tar.extractfile(member)
    if handle is not None:
        for block in iter(lambda: handle.read(BLOCK), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def read_tree(chunks: Iterable[bytes]) -> list[FileEntry]:
    """Every entry of the tar stream ``chunks``, sorted by path (a tar's order is the engine's
    walk, not a fact of the image). A hard link gets its target's size and digest."""
    entries: dict[str, FileEntry] = {}
    stream = io.BufferedReader(_ChunkReader(chunks), buffer_size=BLOCK)
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            path = _path(member.name)
            kind = KINDS.get(member.type, "other")
            entry = FileEntry(path, kind, member.mode & 0o7777, member.uid, member.gid)
            if kind == "file":
                entry = FileEntry(path, kind, entry.mode, entry.uid, entry.gid, member.size,
                                  _digest(tar, member))
            elif kind == "symlink":
                entry = FileEntry(path, kind, entry.mode, entry.uid, entry.gid,
                                  link=member.linkname)
            elif kind == "hardlink":
                target = entries.get(_path(member.linkname))
                entry = FileEntry(path, kind, entry.mode, entry.uid, entry.gid,
                                  target.size if target else 0,
                                  target.digest if target else None, _path(member.linkname))
            elif kind in ("char", "block"):
                entry = FileEntry(path, kind, entry.mode, entry.uid, entry.gid,
                                  device=f"{member.devmajor}:{member.devminor}")
            entries[path] = entry
    return [entries[p] for p in sorted(entries)]
