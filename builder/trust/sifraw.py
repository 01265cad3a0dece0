"""The few raw SIF fields a signature covers, read with ``struct`` (sylabs ``sif`` v2 layout).

``builder.sif_format``'s reader decodes descriptors for people (names, groups without the flag
bits); a signature needs the raw bytes it hashes (``CreatedAt``, ``UID``, ``GID``, the raw
``LinkedID``, the full ``Name``/``Extra`` arrays), so they are read here.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path

from builder.errors import TrustError
from builder.files import sha256_file

HEADER = struct.Struct("<32s10s3s3s16s8q")  # 128 bytes
DESCRIPTOR = struct.Struct("<i?IIIqqqqqqq128s384s")  # 585 bytes
INTEGRITY = struct.Struct("<i?IIqqqq")  # DataType Used relativeID LinkedID Size CreatedAt UID GID
MAGIC = b"SIF_MAGIC\0"
GROUP_MASK = 0xF0000000
DATA_PARTITION, DATA_SIGNATURE, DATA_GENERIC_JSON, DATA_SBOM = 0x4004, 0x4005, 0x4006, 0x4009
HASH_SHA256 = 1


@dataclass(frozen=True)
class RawDescriptor:
    datatype: int
    used: bool
    ident: int
    groupid: int  # raw, with GROUP_MASK when grouped
    link: int  # raw
    offset: int
    size: int
    created: int
    uid: int
    gid: int
    name_raw: bytes
    extra: bytes

    @property
    def group(self) -> int:
        return self.groupid & ~GROUP_MASK

    @property
    def name(self) -> str:
        return self.name_raw.split(b"\0", 1)[0].decode("utf-8", "replace")

    def integrity_bytes(self, min_id: int) -> bytes:
        """What ``Descriptor.GetIntegrityReader`` yields (sif pkg/sif/descriptor.go)."""
        return INTEGRITY.pack(self.datatype, self.used, self.ident - min_id, self.link, self.size,
                              self.created, self.uid, self.gid) + self.name_raw + self.extra


@dataclass(frozen=True)
class RawSif:
    header_integrity: bytes  # launch script + magic + version + UUID
    descriptors: tuple[RawDescriptor, ...]

    def group(self, group: int) -> list[RawDescriptor]:
        return sorted((d for d in self.descriptors if d.groupid == (group | GROUP_MASK)),
                      key=lambda d: d.ident)

    def signatures_of(self, group: int) -> list[RawDescriptor]:
        return [d for d in self.descriptors
                if d.datatype == DATA_SIGNATURE and d.link == (group | GROUP_MASK)]


def read(path: Path) -> RawSif:
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER.size)
            if len(head) < HEADER.size or head[32:42] != MAGIC:
                raise TrustError(f"{path}: not a SIF file (no SIF magic)")
            fields = HEADER.unpack(head)
            launch, magic, version, _arch, ident = fields[:5]
            total, d_off, d_size = fields[8], fields[9], fields[10]
            f.seek(d_off)
            table = f.read(d_size)
    except OSError as exc:
        raise TrustError(f"{path}: cannot read ({exc.strerror})") from None
    out = []
    for i in range(min(total, len(table) // DESCRIPTOR.size)):
        (dtype, used, ident_, group, link, off, size, _padded, created, _mod, uid, gid, name,
         extra) = DESCRIPTOR.unpack_from(table, i * DESCRIPTOR.size)
        if used:
            out.append(RawDescriptor(dtype, used, ident_, group, link, off, size, created, uid,
                                     gid, name, extra))
    return RawSif(launch + magic + version + ident, tuple(out))


def object_digest(path: Path, d: RawDescriptor) -> str:
    """sha256 hex of an object's data (streamed: the partition may be gigabytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(d.offset)
        left = d.size
        while left:
            chunk = f.read(min(left, 8 << 20))
            if not chunk:
                raise TrustError(f"{path}: object {d.ident} is truncated")
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def read_object(path: Path, d: RawDescriptor, limit: int = 64 << 20) -> bytes:
    if d.size > limit:
        raise TrustError(f"{path}: object {d.ident} is {d.size} bytes; too large to read")
    with open(path, "rb") as f:
        f.seek(d.offset)
        return f.read(d.size)


file_sha256 = sha256_file  # the SIF file's digest, as statements name it
