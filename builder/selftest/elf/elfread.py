"""The few ELF facts the device-code reader and the ABI phase need: the ELF header (class,
machine, type), the section table of a little-endian ELF file (or of an ELF image inside one,
a cubin), exact reads, and a chunked search for a magic. The dynamic section, symbols and
versions are read by :mod:`.elfdyn` on top of this. Stdlib only; nothing here reads more than
it is asked for."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

ELF_MAGIC = b"\x7fELF"
SHT_PROGBITS, SHF_EXECINSTR = 1, 0x4
# Data sections of a CUDA library that may hold fat binaries it loads itself (cuModuleLoadData):
# read-only/large data, never code, debug info or relocatable device code (__nv_relfatbin holds
# objects for a later device link, not code that runs as it is).
SKIP_DATA = (".debug", ".eh_frame", ".gcc_except_table", ".got", ".comment", ".note", ".init",
             ".fini", ".dynamic", ".interp", ".plt", ".tbss", ".tdata", "__nv_relfatbin",
             ".nv_fatbin", ".nvFatBinSegment", ".hip_fatbin", ".dyn", ".rela", ".gnu",
             ".symtab", ".strtab", ".shstrtab", "__nv_module_id")
SCAN_CHUNK = 1 << 16  # gaps between containers and bundles are small


class DevcodeError(Exception):
    """The file's device code cannot be read (malformed, or no decoder for its compression)."""


@dataclass(frozen=True)
class Section:
    name: str
    offset: int
    size: int
    type: int = SHT_PROGBITS
    flags: int = 0
    index: int = 0  # its index in the section header table (what sh_link refers to)
    link: int = 0  # sh_link: the string table of a symbol table, dynamic or version section

    @property
    def data_candidate(self) -> bool:
        """A data section that may hold fat binaries loaded by the library itself."""
        return (self.type == SHT_PROGBITS and not self.flags & SHF_EXECINSTR and self.size > 0
                and not self.name.startswith(SKIP_DATA))


def pread_exact(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise DevcodeError(f"short read: {size} bytes at offset {offset}")
    return data


def elf_sections(fd: int, base: int = 0, limit: int | None = None) -> list[Section] | None:
    """The sections of a little-endian ELF file (None: not such an ELF file), or of an ELF
    image at ``base`` inside the file, ``limit`` bytes long (a cubin in a fat binary); section
    offsets are relative to ``base``.

    Reads the ELF header, the section header table and the section-name string table only."""
    ident = os.pread(fd, 64, base)
    if len(ident) < 52 or ident[:4] != ELF_MAGIC or ident[5] != 1:  # EI_DATA 1: little-endian
        return None
    if ident[4] == 2:  # ELFCLASS64
        shoff, = struct.unpack_from("<Q", ident, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ident, 0x3A)
        sh = struct.Struct("<IIQQQQIIQQ")
    elif ident[4] == 1:  # ELFCLASS32
        shoff, = struct.unpack_from("<I", ident, 0x20)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ident, 0x2E)
        sh = struct.Struct("<IIIIIIIIII")
    else:
        return None
    if shoff == 0 or shentsize < sh.size:
        return []
    if shnum == 0 or shstrndx == 0xFFFF:  # extended numbering: the real values in entry 0
        first = sh.unpack(pread_exact(fd, sh.size, base + shoff))
        shnum = shnum or first[5]
        shstrndx = first[6] if shstrndx == 0xFFFF else shstrndx
    if shnum > 1 << 20 or shstrndx >= shnum:
        raise DevcodeError(f"implausible section table ({shnum} sections, names in {shstrndx})")
    if limit is not None and shoff + shentsize * shnum > limit:
        raise DevcodeError("section table runs past the image")
    table = pread_exact(fd, shentsize * shnum, base + shoff)
    headers = [sh.unpack_from(table, i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx]
    if limit is not None and strtab[4] + strtab[5] > limit:
        raise DevcodeError("section names run past the image")
    names = pread_exact(fd, strtab[5], base + strtab[4])
    out = []
    for index, h in enumerate(headers):
        end = names.find(b"\0", h[0])
        name = names[h[0]:end if end >= 0 else None].decode("latin-1")
        if h[1] != 8:  # SHT_NOBITS has no bytes in the file
            out.append(Section(name, h[4], h[5], h[1], h[2], index, h[6]))
    return out


@dataclass(frozen=True)
class ElfHeader:
    """What the dynamic loader compares before it maps a file: class, machine and type."""

    cls64: bool
    machine: int  # e_machine: 62 x86-64, 183 AArch64, 3 i386
    type: int  # e_type: 2 executable, 3 shared object (or PIE executable)


def elf_header(fd: int) -> ElfHeader | None:
    """The header of a little-endian ELF file (None: not one)."""
    ident = os.pread(fd, 20, 0)
    if len(ident) < 20 or ident[:4] != ELF_MAGIC or ident[5] != 1 or ident[4] not in (1, 2):
        return None
    etype, machine = struct.unpack_from("<HH", ident, 16)
    return ElfHeader(ident[4] == 2, machine, etype)


def find_magic(fd: int, magics: tuple[bytes, ...], start: int, end: int, align: int,
          chunk_size: int = SCAN_CHUNK) -> int | None:
    """The first offset in [start, end) where one of ``magics`` begins, looking only at
    offsets ``start + k * align``; reads in chunks, never the whole range at once."""
    pos = start
    overlap = max(len(m) for m in magics) - 1
    while pos < end:
        chunk = os.pread(fd, min(chunk_size + overlap, end - pos), pos)
        if not chunk:
            return None
        hits = []
        for m in magics:
            i = chunk.find(m)
            while i >= 0 and (pos + i - start) % align:
                i = chunk.find(m, i + 1)
            if i >= 0:
                hits.append(i)
        if hits:
            return pos + min(hits)
        pos += max(len(chunk) - overlap, 1)
    return None
