"""The SIF container format, written and read with ``struct`` (no Go tooling needed).

Layout as apptainer's builder writes it (``research/sif_spec.md`` §2.2-2.3; sylabs/apptainer
``pkg/sif``): a 128-byte global header, 48 descriptors of 585 bytes at offset 4096, then the data
objects, each placed at the end of the previous one rounded up to its alignment (0 for the
definition and JSON objects, 4096 for the squashfs partition). ``SizeWithPadding`` includes that
alignment gap and the header's ``DataSize`` is the sum of them.

The writer is split in two so the squashfs never has to be copied: :func:`plan` fixes where the
partition goes, ``mksquashfs -o OFFSET`` writes the filesystem straight into the file at that
offset, and :func:`write_head` then fills in header, descriptors and the small objects in front.

The one reader (:func:`read_raw`) parses the header and the descriptor table once; it keeps the
raw fields a signature hashes (``CreatedAt``, ``UID``, ``GID``, the raw group and ``LinkedID``,
the full ``Name``/``Extra`` arrays, :meth:`RawDescriptor.integrity_bytes`), and :func:`read_info`
is its view for people (names, groups without the flag bits, partition type and architecture).
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

HEADER = struct.Struct("<32s10s3s3s16s8q")  # 128 bytes
DESCRIPTOR = struct.Struct("<i?IIIqqqqqqq128s384s")  # 585 bytes
PARTITION_EXTRA = struct.Struct("<ii3s")
INTEGRITY = struct.Struct("<i?IIqqqq")  # DataType Used relativeID LinkedID Size CreatedAt UID GID

LAUNCH_SCRIPT = b"#!/usr/bin/env run-singularity\n"
MAGIC = b"SIF_MAGIC\0"
VERSION = b"01\0"
DESCRIPTORS_OFFSET = 4096
DESCRIPTORS_TOTAL = 48
DATA_OFFSET = DESCRIPTORS_OFFSET + DESCRIPTORS_TOTAL * DESCRIPTOR.size  # 32176
GROUP_MASK = 0xF0000000
DEFAULT_GROUP = 1
PARTITION_ALIGNMENT = 4096

DATA_DEFFILE = 0x4001
DATA_PARTITION = 0x4004
DATA_SIGNATURE = 0x4005
DATA_GENERIC_JSON = 0x4006
DATA_SBOM = 0x4009
HASH_SHA256 = 1  # the signature's hash type (sylabs sif)
DATA_TYPE_NAMES = {0x4001: "Def.FILE", 0x4002: "Env.Vars", 0x4003: "JSON.Labels",
                   0x4004: "FS", 0x4005: "Signature", 0x4006: "JSON.Generic", 0x4007: "Generic/Raw",
                   0x4008: "Cryptographic Message", 0x4009: "SBOM", 0x400A: "OCI.RootIndex",
                   0x400B: "OCI.Blob"}
FS_SQUASH = 1
PART_PRIMSYS = 2

# Go architecture name -> the 2-digit code in the header and partition descriptor.
ARCH_CODES = {"386": "01", "amd64": "02", "arm": "03", "arm64": "04", "ppc64": "05",
              "ppc64le": "06", "mips": "07", "mipsle": "08", "mips64": "09", "mips64le": "10",
              "s390x": "11", "riscv64": "12"}
ARCH_NAMES = {code: name for name, code in ARCH_CODES.items()}


class SifFormatError(ValueError):
    """The file is not a SIF this module can read."""


@dataclass(frozen=True)
class DataObject:
    """A small data object placed before the partition (definition file, JSON metadata)."""

    datatype: int
    data: bytes
    name: str = ""


@dataclass(frozen=True)
class Layout:
    """Where each small object and the partition go in the file."""

    objects: tuple[DataObject, ...]
    offsets: tuple[int, ...]
    partition_offset: int

    @property
    def objects_end(self) -> int:
        return self.offsets[-1] + len(self.objects[-1].data) if self.objects else DATA_OFFSET


def align(offset: int, alignment: int) -> int:
    """``offset`` rounded up to a multiple of ``alignment`` (0: unchanged)."""
    if alignment and offset % alignment:
        return offset + alignment - offset % alignment
    return offset


def plan(objects: list[DataObject]) -> Layout:
    """Place the small objects back to back after the descriptors, and the partition after
    them at the next 4096 boundary (what ``sif.CreateContainer`` does for the same inputs)."""
    offsets, cursor = [], DATA_OFFSET
    for obj in objects:
        offsets.append(cursor)
        cursor += len(obj.data)
    return Layout(tuple(objects), tuple(offsets), align(cursor, PARTITION_ALIGNMENT))


def _descriptor(*, datatype: int, ident: int, offset: int, size: int, padded: int, when: int,
                name: str = "", extra: bytes = b"") -> bytes:
    return DESCRIPTOR.pack(datatype, True, ident, DEFAULT_GROUP | GROUP_MASK, 0, offset, size,
                           padded, when, when, 0, 0, name.encode()[:127], extra)


def write_head(path: Path, layout: Layout, *, partition_size: int, arch: str,
               created: int | None = None, ident: uuid.UUID | None = None) -> None:
    """Write header, descriptors and small objects in front of a partition already at
    ``layout.partition_offset`` (``partition_size`` bytes, the rest of the file)."""
    if arch not in ARCH_CODES:
        raise SifFormatError(f"architecture {arch!r} has no SIF code")
    when = int(time.time()) if created is None else created
    code = ARCH_CODES[arch].encode() + b"\0"
    descriptors, end = [], DATA_OFFSET
    for i, (obj, off) in enumerate(zip(layout.objects, layout.offsets), start=1):
        descriptors.append(_descriptor(datatype=obj.datatype, ident=i, offset=off,
                                       size=len(obj.data), padded=off - end + len(obj.data),
                                       when=when, name=obj.name))
        end = off + len(obj.data)
    part_off = layout.partition_offset
    descriptors.append(_descriptor(
        datatype=DATA_PARTITION, ident=len(descriptors) + 1, offset=part_off, size=partition_size,
        padded=part_off - end + partition_size, when=when,
        extra=PARTITION_EXTRA.pack(FS_SQUASH, PART_PRIMSYS, code)))
    used = len(descriptors)
    table = b"".join(descriptors) + bytes(DESCRIPTOR.size * (DESCRIPTORS_TOTAL - used))
    header = HEADER.pack(LAUNCH_SCRIPT, MAGIC, VERSION, code, (ident or uuid.uuid4()).bytes,
                         when, when, DESCRIPTORS_TOTAL - used, DESCRIPTORS_TOTAL,
                         DESCRIPTORS_OFFSET, len(table), DATA_OFFSET,
                         part_off + partition_size - DATA_OFFSET)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, header + bytes(DESCRIPTORS_OFFSET - HEADER.size), 0)
        os.pwrite(fd, table, DESCRIPTORS_OFFSET)
        for obj, off in zip(layout.objects, layout.offsets):
            os.pwrite(fd, obj.data, off)
        gap = part_off - layout.objects_end
        if gap:
            os.pwrite(fd, bytes(gap), layout.objects_end)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class RawDescriptor:
    """A used descriptor as stored: the fields a signature hashes, raw."""

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
    size_with_padding: int = 0

    @property
    def group(self) -> int:
        return self.groupid & ~GROUP_MASK

    @property
    def name(self) -> str:
        return _cstr(self.name_raw)

    def integrity_bytes(self, min_id: int) -> bytes:
        """What ``Descriptor.GetIntegrityReader`` yields (sif pkg/sif/descriptor.go)."""
        return INTEGRITY.pack(self.datatype, self.used, self.ident - min_id, self.link, self.size,
                              self.created, self.uid, self.gid) + self.name_raw + self.extra


@dataclass(frozen=True)
class RawSif:
    """The header and used descriptors of a SIF file, as stored."""

    header: tuple[bytes, bytes, bytes, bytes, bytes, int, int, int, int, int, int, int, int]
    descriptors: tuple[RawDescriptor, ...]

    @property
    def header_integrity(self) -> bytes:
        """Launch script, magic, version and UUID: the header bytes a signature covers."""
        launch, magic, version, _arch, ident = self.header[:5]
        return launch + magic + version + ident

    def group(self, group: int) -> list[RawDescriptor]:
        return sorted((d for d in self.descriptors if d.groupid == (group | GROUP_MASK)),
                      key=lambda d: d.ident)

    def signatures_of(self, group: int) -> list[RawDescriptor]:
        return [d for d in self.descriptors
                if d.datatype == DATA_SIGNATURE and d.link == (group | GROUP_MASK)]


@dataclass(frozen=True)
class Descriptor:
    datatype: int
    ident: int
    group: int  # 0: no group
    link: int
    offset: int
    size: int
    size_with_padding: int
    name: str
    fstype: int = 0
    parttype: int = 0
    arch: str = ""

    @property
    def type_name(self) -> str:
        return DATA_TYPE_NAMES.get(self.datatype, hex(self.datatype))


@dataclass(frozen=True)
class SifInfo:
    launch_script: str
    version: str
    arch: str
    ident: uuid.UUID
    created: int
    modified: int
    descriptors_free: int
    descriptors_total: int
    data_offset: int
    data_size: int
    descriptors: tuple[Descriptor, ...]

    def primary_partition(self) -> Descriptor | None:
        return next((d for d in self.descriptors
                     if d.datatype == DATA_PARTITION and d.parttype == PART_PRIMSYS), None)

    def named(self, name: str) -> Descriptor | None:
        return next((d for d in self.descriptors if d.name == name), None)


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _arch_name(raw: bytes) -> str:
    return ARCH_NAMES.get(_cstr(raw), "unknown")


def read_raw(path: Path) -> RawSif:
    """Parse the global header and the used descriptors of a SIF file (SifFormatError when it
    is none; OSError when it cannot be read)."""
    with open(path, "rb") as f:
        head = f.read(HEADER.size)
        if len(head) < HEADER.size:
            raise SifFormatError(f"{path}: too short for a SIF header")
        header = HEADER.unpack(head)
        if header[1] != MAGIC:
            raise SifFormatError(f"{path}: no SIF magic")
        total, d_off, d_size = header[8], header[9], header[10]
        f.seek(d_off)
        table = f.read(d_size)
    descriptors = []
    for i in range(min(total, len(table) // DESCRIPTOR.size)):
        (dtype, used, ident, group, link, off, size, padded, created, _mod, uid, gid, name,
         extra) = DESCRIPTOR.unpack_from(table, i * DESCRIPTOR.size)
        if used:
            descriptors.append(RawDescriptor(dtype, used, ident, group, link, off, size, created,
                                             uid, gid, name, extra, padded))
    return RawSif(header, tuple(descriptors))


def _readable(d: RawDescriptor) -> Descriptor:
    fs = part = 0
    arch = ""
    if d.datatype == DATA_PARTITION:
        fs, part, raw_arch = PARTITION_EXTRA.unpack_from(d.extra)
        arch = _arch_name(raw_arch)
    return Descriptor(d.datatype, d.ident, d.group, d.link, d.offset, d.size,
                      d.size_with_padding, d.name, fs, part, arch)


def read_info(path: Path) -> SifInfo:
    """The header and used descriptors of a SIF file, decoded for people."""
    raw = read_raw(path)
    (launch, _magic, version, arch, ident, created, modified, free, total, _d_off, _d_size,
     data_off, data_size) = raw.header
    return SifInfo(_cstr(launch), _cstr(version), _arch_name(arch), uuid.UUID(bytes=ident),
                   created, modified, free, total, data_off, data_size,
                   tuple(_readable(d) for d in raw.descriptors))


def read_object(path: Path, descriptor: Descriptor | RawDescriptor,
                limit: int = 64 << 20) -> bytes:
    """The bytes of a (small) data object."""
    if descriptor.size > limit:
        raise SifFormatError(f"object {descriptor.ident} is {descriptor.size} bytes; too large")
    with open(path, "rb") as f:
        f.seek(descriptor.offset)
        return f.read(descriptor.size)


def object_digest(path: Path, descriptor: Descriptor | RawDescriptor) -> str:
    """sha256 hex of an object's data (streamed: the partition may be gigabytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(descriptor.offset)
        left = descriptor.size
        while left:
            chunk = f.read(min(left, 8 << 20))
            if not chunk:
                raise SifFormatError(f"{path}: object {descriptor.ident} is truncated")
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def is_sif(path: Path) -> bool:
    """True when the file starts with a SIF header (what the runtime checks first)."""
    try:
        with open(path, "rb") as f:
            return f.read(HEADER.size)[32:42] == MAGIC
    except OSError:
        return False
