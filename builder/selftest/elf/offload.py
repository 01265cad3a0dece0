"""HIP offload bundles in ``.hip_fatbin``: plain (``__CLANG_OFFLOAD_BUNDLE__``) and compressed
(``CCOB``), read as far as their entry tables of target triples. The layout is described in
:mod:`.devcode`."""

from __future__ import annotations

import os
import re
import struct
import zlib
from dataclasses import dataclass
from typing import Callable

from .elfread import DevcodeError, Section, find_magic
from .zstdprefix import decompress_prefix

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
CCOB_MAGIC = b"CCOB"
_MAX_HEADER = 1 << 20  # an uncompressed bundle header larger than this is not a bundle


@dataclass(frozen=True, order=True)
class HipImage:
    """One code object of a HIP offload bundle."""

    triple: str  # e.g. hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-
    target: str  # the target id: gfx942:sramecc+:xnack-, gfx9-4-generic, amdgcnspirv

    @property
    def name(self) -> str:
        """The target id."""
        return self.target


_TARGET = re.compile(r"(gfx[0-9a-z]+(?:-[0-9a-z]+)*-generic|gfx[0-9a-f]+|amdgcnspirv)"
                     r"((?::[A-Za-z0-9_]+[+-])*)$")


def parse_triple(triple: str) -> HipImage | None:
    """``hipv4-amdgcn-amd-amdhsa--gfx942:xnack-`` → its target id; None for the host entry
    and for anything that is not AMD GPU code."""
    kind = triple.split("-", 1)[0]
    if kind not in ("hip", "hipv4", "openmp") or "amdgcn" not in triple and "spirv" not in triple:
        return None
    m = _TARGET.search(triple)
    if not m:
        return None
    return HipImage(triple, m.group(1) + m.group(2))


def _zstd() -> Callable[[bytes, int], bytes]:
    """The first ``n`` bytes of a zstd frame: ``compression.zstd`` (Python 3.14) or the
    ``zstandard`` module when the interpreter has one, else the pure-Python prefix decoder."""
    try:
        from compression import zstd as czstd  # Python 3.14

        return lambda data, n: czstd.ZstdDecompressor().decompress(data, max_length=n)
    except ImportError:
        pass
    try:
        import zstandard  # optional: an image may hold it
    except ImportError:
        return decompress_prefix

    def dec(data: bytes, n: int) -> bytes:
        reader = zstandard.ZstdDecompressor().stream_reader(data)
        out = b""
        while len(out) < n:
            piece = reader.read(n - len(out))
            if not piece:
                break
            out += piece
        return out

    return dec


_CCOB = {1: struct.Struct("<4sHHIQ"), 2: struct.Struct("<4sHHIIQ"), 3: struct.Struct("<4sHHQQQ")}


def _bundle_header(data: bytes, where: str) -> tuple[list[HipImage], int]:
    """Triples of an uncompressed bundle, and the bundle's end (max offset + size)."""
    if not data.startswith(BUNDLE_MAGIC) or len(data) < 32:
        raise DevcodeError(f"{where}: not an offload bundle")
    count, = struct.unpack_from("<Q", data, 24)
    pos, end, images = 32, 32, []
    for i in range(count):
        if pos + 24 > len(data):
            raise DevcodeError(f"{where}: entry {i} of {count} runs past the header read")
        off, size, tlen = struct.unpack_from("<QQQ", data, pos)
        triple = data[pos + 24:pos + 24 + tlen].decode("ascii", "replace")
        if len(triple) != tlen:
            raise DevcodeError(f"{where}: entry {i} triple runs past the header read")
        pos += 24 + tlen
        end = max(end, off + size)
        img = parse_triple(triple)
        if img:
            images.append(img)
    return images, end


def read_bundles(fd: int, sec: Section) -> tuple[list[list[HipImage]], list[str]]:
    """The code object targets of every offload bundle in a ``.hip_fatbin`` section, one list
    per bundle, and what could not be read."""
    groups: list[list[HipImage]] = []
    problems: list[str] = []
    end = sec.offset + sec.size
    pos = sec.offset
    while pos < end:
        head = os.pread(fd, min(4096, end - pos), pos)
        where = f"{sec.name}+{pos - sec.offset:#x}"
        if head.startswith(BUNDLE_MAGIC):
            n, = struct.unpack_from("<Q", head, 24) if len(head) >= 32 else (0,)
            want = min(32 + n * 320, _MAX_HEADER, end - pos)  # triples are short
            imgs, size = _bundle_header(os.pread(fd, want, pos), where)
            groups.append(imgs)
            nxt = pos + max(size, 32)
        elif head.startswith(CCOB_MAGIC):
            imgs, size, problem = _ccob(fd, pos, head, where)
            if problem:
                problems.append(problem)
            else:
                groups.append(imgs)
            nxt = pos + size if size else pos + 8
        else:
            nxt = pos + 1
        found = find_magic(fd, (BUNDLE_MAGIC, CCOB_MAGIC), nxt, end, 1)
        if found is None:
            break
        pos = found
    return groups, problems


def _ccob(fd: int, pos: int, head: bytes, where: str) -> tuple[list[HipImage], int, str | None]:
    """(targets, total size or 0 when the header does not say, problem)."""
    version, method = struct.unpack_from("<HH", head, 4)
    st = _CCOB.get(version)
    if st is None or len(head) < st.size:
        return [], 0, f"{where}: compressed bundle version {version} not understood"
    fields = st.unpack_from(head)
    total, usize = (0, fields[3]) if version == 1 else (fields[3], fields[4])
    if version == 1:
        return [], 0, (f"{where}: compressed bundle version 1 does not record its size; "
                       "cannot read it without reading to the end of the section")
    if method not in (0, 1):
        return [], total, f"{where}: compressed bundle method {method} not understood"
    decode = _zstd() if method == 1 else (lambda d, n: zlib.decompressobj().decompress(d, n))
    avail = total - st.size
    # The entry table is a few KiB at the start of the payload: read and decompress little,
    # more only when that was not enough.
    error: Exception | None = None
    for clen, want in ((1 << 16, 1 << 12), (1 << 20, 1 << 16), (avail, _MAX_HEADER)):
        clen, want = min(clen, avail), min(want, usize)
        try:
            images, _ = _bundle_header(decode(os.pread(fd, clen, pos + st.size), want), where)
            return images, total, None
        except Exception as e:  # noqa: BLE001 - any decoder's error: unreadable, never covered
            error = e
        if clen == avail and want == min(usize, _MAX_HEADER):
            break
    return [], total, (f"{where}: {('zlib', 'zstd')[method]} payload not readable: "
                       f"{type(error).__name__}: {error}")
