"""Walk the layers of a saved image (``docker save`` through the SDK) and count dead bytes: bytes
of files that one layer writes and a later layer deletes (whiteout, opaque directory) or replaces
(the same path written again). Only layers after the first ``skip`` (the base image's) are
charged; later layers of any kind can kill them."""

from __future__ import annotations

import io
import json
import posixpath
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO


@dataclass
class LayerFiles:
    files: dict[str, int] = field(default_factory=dict)  # regular file -> size
    entries: set[str] = field(default_factory=set)  # every non-directory path
    deleted: set[str] = field(default_factory=set)  # whiteouts: this path is gone
    opaque: set[str] = field(default_factory=set)  # whiteout of a whole directory's content


def _norm(name: str) -> str:
    return posixpath.normpath("/" + name.lstrip("./"))


def read_layer(stream: IO[bytes]) -> LayerFiles:
    out = LayerFiles()
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for m in tar:
            path = _norm(m.name)
            base, name = posixpath.split(path)
            if name == ".wh..wh..opq":
                out.opaque.add(base)
            elif name.startswith(".wh."):
                out.deleted.add(posixpath.join(base, name[4:]))
            elif not m.isdir():
                out.entries.add(path)
                if m.isfile():
                    out.files[path] = m.size
    return out


class _Chunks(io.RawIOBase):
    """A read-only, forward-only file over an iterator of byte chunks (no copy on disk)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._it, self._buf = iter(chunks), b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
        while not self._buf:
            try:
                self._buf = next(self._it)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n], self._buf = self._buf[:n], self._buf[n:]
        return n


def read_saved(chunks: Iterable[bytes]) -> list[LayerFiles]:
    """The layers of a ``docker save`` stream, in image order (lowest first)."""
    by_name: dict[str, LayerFiles] = {}
    manifest = None
    stream = io.BufferedReader(_Chunks(chunks), buffer_size=1 << 20)
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for m in tar:
            if m.name.endswith("layer.tar") and m.isfile():
                member = tar.extractfile(m)
                assert member is not None
                by_name[m.name] = read_layer(member)
            elif m.name == "manifest.json":
                member = tar.extractfile(m)
                assert member is not None
                manifest = json.load(member)
    assert manifest, "docker save wrote no manifest.json"
    return [by_name[name] for name in manifest[0]["Layers"]]


def _ancestors(path: str) -> list[str]:
    out = []
    while path != "/":
        path = posixpath.dirname(path)
        out.append(path)
    return out


def dead_files(layers: list[LayerFiles], skip: int) -> dict[str, int]:
    """``layer-index:path`` -> size, for files of layers ``skip..`` that a later layer kills."""
    dead: dict[str, int] = {}
    for i in range(skip, len(layers)):
        later = layers[i + 1:]
        for path, size in layers[i].files.items():
            parents = _ancestors(path)
            for layer in later:
                if (path in layer.entries or path in layer.deleted
                        or any(p in layer.deleted or p in layer.opaque for p in parents)):
                    dead[f"{i}:{path}"] = size
                    break
    return dead
