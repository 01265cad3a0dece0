"""Flatten the layers of a ``docker save`` stream into one merged tar, without a rootfs.

The save stream is written once to a spool file as it arrives (the layer tars must be read in
manifest order, and ``docker save`` emits them in an unrelated order); each layer's tar *headers*
are scanned while it arrives (data is seeked over). Then the OCI whiteout rules are applied to
that index
(``.wh.NAME`` deletes NAME, ``.wh..wh..opq`` empties a directory; neither touches what the same
layer writes), and the result is a list of byte ranges of the spool: the surviving members'
original header and data blocks, in layer order. Those ranges are sent to ``mksquashfs -tar`` with
``sendfile`` (see :mod:`builder.sif_native`), so file data is never parsed or copied in Python.

Supported save formats: the legacy ``manifest.json`` form (Docker < 25, the engine here) and the
OCI layout form (``index.json`` -> manifest -> ``blobs/sha256/...``). Compressed layer blobs
(containerd image store) are decompressed into the spool first.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import posixpath
import shutil
import subprocess
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
BLOCK = 512


class LayerError(ValueError):
    """The saved image cannot be flattened."""


# --------------------------------------------------------------------------- the spool


class Spool:
    """The save stream, appended to a file as it is read. Readers address it by offset; reading
    past what has arrived pulls more of the stream."""

    def __init__(self, chunks: Iterable[bytes], path: Path) -> None:
        self._chunks: Iterator[bytes] | None = iter(chunks)
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.size = 0

    def _fill(self, upto: int) -> None:
        while self._chunks is not None and self.size < upto:
            chunk = next(self._chunks, None)
            if chunk is None:
                self._chunks = None
                break
            view = memoryview(chunk)
            while view:
                n = os.pwrite(self.fd, view, self.size)
                self.size += n
                view = view[n:]

    def pread(self, n: int, offset: int) -> bytes:
        self._fill(offset + n)
        return os.pread(self.fd, n, offset)

    def drain(self) -> None:
        """Read the stream to its end (the HTTP response is then complete)."""
        self._fill(1 << 62)

    def append_from(self, stream: io.BufferedIOBase) -> tuple[int, int]:
        """Append a whole (decompressed) stream at the end; returns its (offset, size)."""
        self._fill(1 << 62)
        start = self.size
        while True:
            block = stream.read(1 << 20)
            if not block:
                break
            os.pwrite(self.fd, block, self.size)
            self.size += len(block)
        return start, self.size - start

    def close(self) -> None:
        os.close(self.fd)
        self.path.unlink(missing_ok=True)


class View(io.RawIOBase):
    """A seekable read-only file over ``[base, base+length)`` of the spool (for ``tarfile``)."""

    def __init__(self, spool: Spool, base: int = 0, length: int | None = None) -> None:
        super().__init__()
        self.spool, self.base, self.length, self.pos = spool, base, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            pos += self.pos
        elif whence == io.SEEK_END:
            if self.length is None:
                self.spool._fill(1 << 62)
                pos += self.spool.size - self.base
            else:
                pos += self.length
        self.pos = max(0, pos)
        return self.pos

    def readinto(self, buf: Any) -> int:
        n = len(buf)
        if self.length is not None:
            n = max(0, min(n, self.length - self.pos))
        data = self.spool.pread(n, self.base + self.pos) if n else b""
        buf[:len(data)] = data
        self.pos += len(data)
        return len(data)


# --------------------------------------------------------------------------- one layer's index


@dataclass(slots=True)
class Member:
    """One tar member of a layer: where its blocks are in the spool."""

    name: str  # normalised: no leading "/" or "./", "" for the root
    info: tarfile.TarInfo
    start: int  # first header block (extended headers included)
    data: int  # first data block
    end: int  # end of the padded data
    layer: int
    index: int
    link_source: Member | None = None  # hardlinks: the member of this layer they point to

    @property
    def isdir(self) -> bool:
        return self.info.isdir()


def normalise(name: str) -> str:
    name = posixpath.normpath("/" + name).lstrip("/")
    return "" if name == "." else name


def scan_layer(spool: Spool, base: int, length: int, layer: int) -> list[Member]:
    """Headers of one uncompressed layer tar at ``[base, base+length)`` of the spool."""
    if length == 0:
        return []
    members = []
    with tarfile.open(fileobj=View(spool, base, length), mode="r:") as tf:
        if tf.pax_headers:
            raise LayerError(f"layer {layer} has global PAX headers (not supported)")
        for i, info in enumerate(tf):
            data = base + info.offset_data
            end = data + (-(-info.size // BLOCK) * BLOCK if info.isreg() else 0)
            members.append(Member(normalise(info.name), info, base + info.offset, data, end,
                                  layer, i))
    return members


# --------------------------------------------------------------------------- saved image


@dataclass
class SavedImage:
    """Where the config and the layer tars of a ``docker save`` stream are in the spool."""

    config: dict[str, Any]
    layers: list[tuple[int, int]]  # (offset, size) of each uncompressed layer, base first
    format: str  # "docker-legacy" | "oci-layout"
    scanned: dict[int, list[Member]] = field(default_factory=dict)  # by layer offset


def _looks_like_tar(spool: Spool, offset: int, size: int) -> bool:
    return size >= 2 * BLOCK and spool.pread(5, offset + 257) == b"ustar"


def _outer_index(spool: Spool) -> tuple[dict[str, tuple[int, int]], dict[str, str],
                                         dict[int, list[Member]]]:
    """Walk the save stream once. Uncompressed layer tars are scanned as they arrive (their
    headers are read while the stream is spooled, so no second pass is needed)."""
    files: dict[str, tuple[int, int]] = {}
    links: dict[str, str] = {}
    scanned: dict[int, list[Member]] = {}
    with tarfile.open(fileobj=View(spool), mode="r:") as tf:
        for info in tf:
            name = normalise(info.name)
            if info.isreg():
                files[name] = (info.offset_data, info.size)
                layer_like = name.endswith("/layer.tar") or name.startswith("blobs/")
                if layer_like and _looks_like_tar(spool, info.offset_data, info.size):
                    scanned[info.offset_data] = scan_layer(spool, info.offset_data, info.size, -1)
            elif info.issym() or info.islnk():
                target = info.linkname if info.islnk() else posixpath.join(
                    posixpath.dirname(name), info.linkname)
                links[name] = normalise(target)
    spool.drain()
    return files, links, scanned


def _resolve(name: str, files: dict[str, tuple[int, int]],
             links: dict[str, str]) -> tuple[int, int]:
    for _ in range(16):
        if name in files:
            return files[name]
        if name not in links:
            break
        name = links[name]
    raise LayerError(f"saved image lacks {name}")


def _blob(digest: str) -> str:
    algo, _, hexpart = digest.partition(":")
    return f"blobs/{algo}/{hexpart}"


def _read_json(spool: Spool, where: tuple[int, int]) -> Any:
    return json.loads(spool.pread(where[1], where[0]))


def _uncompressed(spool: Spool, where: tuple[int, int]) -> tuple[int, int]:
    """A layer blob as an uncompressed tar range (decompressing into the spool if needed)."""
    magic = spool.pread(4, where[0])
    if magic[:2] == b"\x1f\x8b":
        with gzip.GzipFile(fileobj=View(spool, *where)) as stream:
            return spool.append_from(stream)  # type: ignore[arg-type]
    if magic == b"\x28\xb5\x2f\xfd":
        zstd = shutil.which("zstd")
        if not zstd:
            raise LayerError("zstd-compressed layer and no zstd program to decompress it")
        proc = subprocess.Popen([zstd, "-dc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert proc.stdin and proc.stdout
        proc.stdin.write(spool.pread(where[1], where[0]))
        proc.stdin.close()
        result = spool.append_from(proc.stdout)  # type: ignore[arg-type]
        if proc.wait():
            raise LayerError("zstd could not decompress a layer")
        return result
    return where


def read_saved(spool: Spool) -> SavedImage:
    """Index the whole save stream (this is what spools it) and find config and layers."""
    files, links, scanned = _outer_index(spool)
    if "oci-layout" in files and "index.json" in files:
        index = _read_json(spool, files["index.json"])
        manifest_desc = index["manifests"][0]
        manifest = _read_json(spool, _resolve(_blob(manifest_desc["digest"]), files, links))
        if "manifests" in manifest:  # an index inside the index: take the first platform
            manifest = _read_json(spool, _resolve(_blob(manifest["manifests"][0]["digest"]),
                                                  files, links))
        config = _read_json(spool, _resolve(_blob(manifest["config"]["digest"]), files, links))
        paths = [_blob(layer["digest"]) for layer in manifest["layers"]]
        fmt = "oci-layout"
    elif "manifest.json" in files:
        manifest = _read_json(spool, files["manifest.json"])[0]
        config = _read_json(spool, _resolve(normalise(manifest["Config"]), files, links))
        paths = [normalise(p) for p in manifest["Layers"]]
        fmt = "docker-legacy"
    else:
        raise LayerError("neither manifest.json nor an OCI layout in the saved image")
    layers = [_uncompressed(spool, _resolve(p, files, links)) for p in paths]
    return SavedImage(config, layers, fmt, scanned)


# --------------------------------------------------------------------------- the merge


@dataclass(slots=True)
class Node:
    """A path of the flattened tree: its winning member, and where in the stream it goes
    (directories keep the position of their first appearance, so parents precede children)."""

    member: Member
    position: tuple[int, int]


@dataclass
class Tree:
    """The flattened filesystem as an index over layer members."""

    nodes: dict[str, Node] = field(default_factory=dict)
    children: dict[str, set[str]] = field(default_factory=dict)
    root: tarfile.TarInfo | None = None
    whiteouts: int = 0

    def add(self, name: str, node: Node) -> None:
        self.nodes[name] = node
        self.children.setdefault(posixpath.dirname(name), set()).add(name)

    def remove(self, name: str) -> None:
        """Delete a path and everything below it."""
        if self.nodes.pop(name, None) is None and name not in self.children:
            return
        for child in list(self.children.pop(name, ())):
            self.remove(child)
        siblings = self.children.get(posixpath.dirname(name))
        if siblings is not None:
            siblings.discard(name)

    def empty(self, name: str) -> None:
        """Delete everything below a directory (an opaque whiteout), keeping it."""
        for child in list(self.children.get(name, ())):
            self.remove(child)

    def apply(self, members: list[Member]) -> None:
        """Lay one layer over the tree: its whiteouts first (they only hide what lower layers
        wrote), then its entries in order."""
        for m in members:
            base = posixpath.basename(m.name)
            if not base.startswith(WHITEOUT):
                continue
            self.whiteouts += 1
            parent = posixpath.dirname(m.name)
            if base == OPAQUE:
                self.empty(parent)
            elif not base.startswith(WHITEOUT + WHITEOUT):
                self.remove(posixpath.join(parent, base[len(WHITEOUT):]))
        seen: dict[str, Member] = {}
        for m in members:
            if posixpath.basename(m.name).startswith(WHITEOUT):
                continue
            if m.info.islnk():
                m.link_source = seen.get(normalise(m.info.linkname))
            seen[m.name] = m
            self._place(m)

    def _place(self, m: Member) -> None:
        if not m.name:
            self.root = m.info
            return
        old = self.nodes.get(m.name)
        if old is not None and old.member.isdir and m.isdir:
            old.member = m  # a directory again: newer metadata, same place in the stream
            return
        if old is not None:
            self.remove(m.name)
        self.add(m.name, Node(m, (m.layer, m.index)))

    def lookup(self, path: str, max_links: int = 40) -> Node | None:
        """Resolve a path inside the tree, following symlinks (relative or absolute)."""
        parts, done = normalise(path).split("/"), ""
        hops = 0
        while parts:
            part = parts.pop(0)
            if part in ("", "."):
                continue
            here = posixpath.join(done, part) if done else part
            node = self.nodes.get(here)
            if node is None:
                return None
            if node.member.info.issym():
                hops += 1
                if hops > max_links:
                    return None
                target = node.member.info.linkname
                base = "" if target.startswith("/") else done
                parts = [p for p in normalise(posixpath.join("/" + base, target)).split("/")
                         if p] + parts
                done = ""
                continue
            done = here
        return self.nodes.get(done) if done else None


def flatten(spool: Spool, saved: SavedImage) -> Tree:
    """Scan every layer and merge them into one tree (base layer first)."""
    tree = Tree()
    used: set[int] = set()
    for i, (offset, size) in enumerate(saved.layers):
        members = saved.scanned.get(offset) if offset not in used else None
        used.add(offset)
        if members is None:  # compressed, or a layer repeated in the image: fresh members
            members = scan_layer(spool, offset, size, i)
        for m in members:
            m.layer = i
        tree.apply(members)
    return tree
