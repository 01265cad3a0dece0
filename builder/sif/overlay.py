"""Lay apptainer's ``/.singularity.d`` tree over a flattened rootfs tar *while it streams*.

The input is ``docker export`` of a container of the image: one tar in which the engine has
already applied every layer and whiteout. It is passed through block by block (file data is
never parsed, only handed on as views of the chunks that arrived), with these changes:

* an existing regular file (or hardlink) at a path apptainer writes (``/.singularity.d/...``,
  ``/etc/hosts``, ``/etc/resolv.conf``) is dropped and the generated file takes its place, with
  the original's owner; a directory or symlink there stays as the image has it;
* a symlink at one of apptainer's link paths (``/singularity``, ``/.run``, ...) pointing
  elsewhere is replaced; anything else there stays;
* what ``docker export`` alone adds is dropped: ``/.dockerenv``, the empty ``/dev/console``;
* after the last member, the missing directories, links and files are appended, then the tar's
  end-of-archive marker.

Every path still appears once (mksquashfs would keep only one of two). The architecture is
detected as apptainer does (the ELF machine of ``/bin/sh`` through its symlinks, else of the
first executable ELF file) from the first bytes of executables seen on the way.
"""

from __future__ import annotations

import posixpath
import struct
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from builder.sif import meta as sif_meta

BLOCK = tarfile.BLOCKSIZE
ZERO_BLOCK = bytes(BLOCK)
END = bytes(2 * BLOCK)
_EXTENSIONS = {tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK,
               tarfile.SOLARIS_XHDTYPE}
_NO_DATA = {tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.DIRTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE,
            tarfile.FIFOTYPE}
KEEP_DROPPED = 1 << 20  # data of a replaced file kept for hardlinks to it (config files: tiny)
ELF_MACHINES = {3: "386", 8: "mips", 20: "ppc", 21: "ppc64", 22: "s390x", 40: "arm", 62: "amd64",
                183: "arm64", 243: "riscv64"}
Piece = bytes | memoryview


class OverlayError(ValueError):
    """The input is not a tar stream this overlay can pass through."""


def normalise(name: str) -> str:
    """Tar member name as a relative path without ``./``, leading or trailing slashes."""
    return posixpath.normpath("/" + name).lstrip("/")


def elf_arch(head: bytes) -> str | None:
    """Go architecture name from the first 20 bytes of an ELF file."""
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    little = head[5] == 1
    machine = struct.unpack_from("<H" if little else ">H", head, 18)[0]
    arch = ELF_MACHINES.get(machine)
    if arch == "ppc64" and little:
        return "ppc64le"
    if arch == "mips" and little:
        return "mipsle" if head[4] == 1 else "mips64le"
    if arch == "mips" and head[4] == 2:
        return "mips64"
    return arch


def header(name: str, *, kind: bytes, mode: int, size: int = 0, linkname: str = "",
           uid: int = 0, gid: int = 0, mtime: float = 0.0) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname = kind, mode, size, linkname
    info.uid, info.gid, info.mtime, info.uname, info.gname = uid, gid, int(mtime), "", ""
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")


def file_entry(name: str, data: bytes, mode: int, mtime: float, uid: int = 0,
               gid: int = 0) -> bytes:
    return (header(name, kind=tarfile.REGTYPE, mode=mode, size=len(data), uid=uid, gid=gid,
                   mtime=mtime) + data + bytes(-len(data) % BLOCK))


def _pax_records(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0 or not data[pos:space].isdigit():
            break  # the padding after the last record
        length = int(data[pos:space])
        if length <= 0:
            break
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def _skip(src: _Input, n: int) -> None:
    for _ in src.views(n):
        pass


class _Input:
    """The incoming chunks, read as exact byte counts (headers) or handed on as views (data)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buf: bytes = b""
        self._pos = 0
        self.offset = 0  # bytes consumed so far

    def _next(self) -> bool:
        for chunk in self._chunks:
            if chunk:
                self._buf, self._pos = chunk, 0
                return True
        return False

    def take(self, n: int) -> bytes | None:
        """Exactly ``n`` bytes; None at a clean end of the stream (nothing read)."""
        parts: list[bytes] = []
        need = n
        while need:
            avail = len(self._buf) - self._pos
            if not avail:
                if not self._next():
                    if need == n:
                        return None
                    raise OverlayError(f"tar stream ends inside a block at byte {self.offset}")
                continue
            k = min(avail, need)
            parts.append(self._buf[self._pos:self._pos + k])
            self._pos += k
            need -= k
        self.offset += n
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def must(self, n: int) -> bytes:
        data = self.take(n)
        if data is None:
            raise OverlayError(f"tar stream ends at byte {self.offset} without its end marker")
        return data

    def views(self, n: int) -> Iterator[memoryview]:
        """The next ``n`` bytes as views of the arriving chunks (no copy)."""
        while n:
            avail = len(self._buf) - self._pos
            if not avail:
                if not self._next():
                    raise OverlayError(f"tar stream ends inside a file at byte {self.offset}")
                continue
            k = min(avail, n)
            yield memoryview(self._buf)[self._pos:self._pos + k]
            self._pos += k
            self.offset += k
            n -= k

    def drain(self) -> int:
        """Consume the rest of the stream (the HTTP response then ends cleanly)."""
        rest = len(self._buf) - self._pos
        self._buf, self._pos = b"", 0
        for chunk in self._chunks:
            rest += len(chunk)
        return rest


@dataclass
class OverlayStats:
    members: int = 0  # members of the input, end marker not counted
    bytes_in: int = 0
    replaced: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    arch: str | None = None


class Overlay:
    """``Overlay(meta, mtime).stream(chunks)``: the pieces of the output tar, in order."""

    DROP_EXPORT_ONLY = (".dockerenv",)

    def __init__(self, meta: sif_meta.SifMetadata, mtime: float) -> None:
        self.mtime = mtime
        self.files: dict[str, tuple[bytes, int]] = {f.path: (f.data, f.mode) for f in meta.files}
        self.files.update({p: (b"", 0o644) for p in sif_meta.TRUNCATED})
        self.links = dict(sif_meta.SYMLINKS)
        watched = set(sif_meta.DIRECTORIES)
        watched |= {posixpath.dirname(d) for d in sif_meta.DIRECTORIES}
        self._watched = watched - {""}
        self.kinds: dict[str, bytes] = {}  # watched path -> tar type seen
        self.done: set[str] = set()  # generated paths already settled in the stream
        self.kept: dict[str, tuple[tarfile.TarInfo, bytes]] = {}  # replaced files' old data
        self.symlinks: dict[str, str] = {}
        self.hardlinks: dict[str, str] = {}
        self.elf: dict[str, str] = {}  # executable -> ELF architecture
        self.first_elf: str | None = None
        self.stats = OverlayStats()

    # ------------------------------------------------------------------- the stream

    def stream(self, chunks: Iterable[bytes]) -> Iterator[Piece]:
        src = _Input(chunks)
        while True:
            extensions: list[bytes] = []
            pax: dict[str, str] = {}
            longname = longlink = None
            block = src.must(BLOCK)
            while True:
                if block == ZERO_BLOCK:
                    break
                try:
                    info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
                except tarfile.HeaderError as exc:
                    raise OverlayError(f"bad tar header at byte {src.offset - BLOCK}: "
                                       f"{exc}") from None
                if info.type not in _EXTENSIONS:
                    break
                data = src.must(-(-info.size // BLOCK) * BLOCK)
                extensions += [block, data]
                if info.type == tarfile.GNUTYPE_LONGNAME:
                    longname = data[:info.size].rstrip(b"\0").decode("utf-8", "surrogateescape")
                elif info.type == tarfile.GNUTYPE_LONGLINK:
                    longlink = data[:info.size].rstrip(b"\0").decode("utf-8", "surrogateescape")
                else:
                    pax.update(_pax_records(data[:info.size]))
                block = src.must(BLOCK)
            if block == ZERO_BLOCK:
                if extensions:
                    raise OverlayError(f"tar stream: extended header without a member at byte "
                                       f"{src.offset - BLOCK}")
                break
            if info.type == tarfile.XGLTYPE:  # global header: passed on as it is
                size = -(-info.size // BLOCK) * BLOCK
                yield block
                yield from src.views(size)
                continue
            name = pax.get("path") or longname or info.name
            link = pax.get("linkpath") or longlink or info.linkname
            size = int(pax["size"]) if "size" in pax else info.size
            if "uid" in pax:
                info.uid = int(pax["uid"])
            if "gid" in pax:
                info.gid = int(pax["gid"])
            has_data = info.type not in _NO_DATA
            padded = -(-size // BLOCK) * BLOCK if has_data else 0
            self.stats.members += 1
            yield from self._member(src, info, normalise(name), link, size, padded,
                                    [*extensions, block])
        self.stats.bytes_in = src.offset
        yield from self._appended()
        yield END
        src.drain()

    def _member(self, src: _Input, info: tarfile.TarInfo, name: str, link: str, size: int,
                padded: int, head: list[bytes]) -> Iterator[Piece]:
        kind = info.type
        is_file = kind in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
        if name in self._watched:
            self.kinds[name] = kind
        if kind == tarfile.SYMTYPE:
            self.symlinks[name] = link
        elif kind == tarfile.LNKTYPE:
            link = normalise(link)
            self.hardlinks[name] = link
        if not name or (name in self.DROP_EXPORT_ONLY and is_file) or (
                name == "dev/console" and is_file and size == 0):
            self.stats.dropped.append(name or "/")
            _skip(src, padded)
            return
        if name in self.files:
            self.done.add(name)
            if is_file or kind == tarfile.LNKTYPE:
                data, mode = self.files[name]
                if is_file and size <= KEEP_DROPPED:
                    self.kept[name] = (info, src.must(padded)[:size])
                else:
                    _skip(src, padded)
                self.stats.replaced.append(name)
                yield file_entry(name, data, mode, self.mtime, info.uid, info.gid)
                return
        elif name in self.links:
            self.done.add(name)
            target = self.links[name]
            if kind == tarfile.SYMTYPE and link != target:
                self.stats.replaced.append(name)
                yield header(name, kind=tarfile.SYMTYPE, mode=0o777, linkname=target,
                             mtime=self.mtime)
                return
        if kind == tarfile.LNKTYPE and link in self.kept:  # its file was replaced: a copy
            data = self.kept[link][1]
            yield file_entry(name, data, info.mode, info.mtime, info.uid, info.gid)
            return
        if kind == tarfile.LNKTYPE and link in self.files and link in self.stats.replaced:
            raise OverlayError(f"{name} is a hardlink to /{link}, which is replaced and too "
                               "large to keep")
        yield from head
        if not padded:
            return
        if is_file and size >= 20 and info.mode & 0o111:
            first = src.must(BLOCK)
            arch = elf_arch(first[:20])
            if arch:
                self.elf[name] = arch
                self.first_elf = self.first_elf or arch
            yield first
            padded -= BLOCK
        yield from src.views(padded)

    def _appended(self) -> Iterator[Piece]:
        """Directories, symlinks and files the stream did not settle, in apptainer's order."""
        for d in sif_meta.DIRECTORIES:
            parent = posixpath.dirname(d)
            if d in self.kinds or (parent in self.kinds and self.kinds[parent] != tarfile.DIRTYPE):
                continue  # exists (an existing symlink stays), or lives under a non-directory
            self.kinds[d] = tarfile.DIRTYPE
            self.stats.added.append(d)
            yield header(d, kind=tarfile.DIRTYPE, mode=0o755, mtime=self.mtime)
        for name, target in self.links.items():
            if name not in self.done:
                self.stats.added.append(name)
                yield header(name, kind=tarfile.SYMTYPE, mode=0o777, linkname=target,
                             mtime=self.mtime)
        for name, (data, mode) in self.files.items():
            if name not in self.done:
                self.stats.added.append(name)
                yield file_entry(name, data, mode, self.mtime)
        self.stats.arch = self.detect_arch()

    # ------------------------------------------------------------------- architecture

    def resolve(self, path: str, depth: int = 0) -> str | None:
        """Follow symlinks (in any component) and hardlinks to the file a path names."""
        if depth > 40:
            return None
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            target = self.symlinks.get(prefix)
            if target is not None:
                base = "" if target.startswith("/") else posixpath.dirname(prefix)
                joined = normalise(posixpath.join(base, target, *parts[i:]))
                return self.resolve(joined, depth + 1)
        return self.hardlinks.get(path, path)

    def detect_arch(self) -> str | None:
        sh = self.resolve("bin/sh")
        if sh is not None and sh in self.elf:
            return self.elf[sh]
        return self.first_elf
