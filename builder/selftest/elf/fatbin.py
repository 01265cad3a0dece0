"""CUDA fat binaries: the containers in ``.nv_fatbin`` (registered with the CUDA runtime, what
``cuobjdump`` lists) and those a library keeps in its data sections to load itself. Headers
only; the layout is described in :mod:`.devcode`."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from .elfread import DevcodeError, Section, elf_sections, find_magic, pread_exact

FATBIN_MAGIC = 0xBA55ED50
FATBIN_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)
KIND_PTX, KIND_SASS = 1, 2
FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000  # sm_90a / compute_90a
FLAG_FAMILY_SPECIFIC = 0x200000  # sm_100f / compute_100f
_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")
_DATA_CHUNK = 1 << 22  # data sections are searched through
_STUB_MAX = 1 << 14  # cubins this large are taken to hold code without looking inside


@dataclass(frozen=True, order=True)
class CudaImage:
    """One fat binary entry: SASS (a cubin) or PTX for one architecture."""

    kind: str  # "sass" | "ptx"
    arch: int  # 90 for sm_90; major = arch // 10, minor = arch % 10
    variant: str = ""  # "" | "a" (arch-specific) | "f" (family-specific)
    ptx_isa: tuple[int, int] | None = None  # PTX ISA version of a PTX entry
    empty: bool = False  # a cubin known to hold no kernel (a device-link stub): no code

    @property
    def name(self) -> str:
        """``sm_90a`` for SASS, ``compute_90a`` for PTX."""
        return f"{'sm' if self.kind == 'sass' else 'compute'}_{self.arch}{self.variant}"


def read_fatbins(fd: int, sec: Section) -> list[list[CudaImage]]:
    """The entries of every fat binary container in a section, one list per container."""
    groups: list[list[CudaImage]] = []
    end = sec.offset + sec.size
    pos = sec.offset
    while pos + _CONTAINER.size <= end:
        head = pread_exact(fd, _CONTAINER.size, pos)
        magic, version, hsize, size = _CONTAINER.unpack(head)
        if magic != FATBIN_MAGIC:
            aligned = pos + 8 - (pos - sec.offset) % 8
            found = find_magic(fd, (FATBIN_MAGIC_BYTES,), aligned, end, 8)
            if found is None:
                break
            pos = found
            continue
        if hsize < _CONTAINER.size or pos + hsize + size > end:
            raise DevcodeError(f"{sec.name}+{pos - sec.offset:#x}: fat binary header "
                               f"(version {version}, header {hsize}, size {size}) runs past "
                               "the section")
        groups.append(_entries(fd, sec, pos + hsize, pos + hsize + size))
        pos += hsize + size
    return groups


def _entries(fd: int, sec: Section, pos: int, end: int) -> list[CudaImage]:
    out = []
    while pos + _ENTRY.size <= end:
        (kind, _ver, hsize, size, _csize, _opt, minor, major, arch, _no, _nl, flags, _z,
         _usize) = _ENTRY.unpack(pread_exact(fd, _ENTRY.size, pos))
        if kind not in (KIND_PTX, KIND_SASS) or hsize < _ENTRY.size or pos + hsize + size > end:
            raise DevcodeError(f"{sec.name}+{pos - sec.offset:#x}: bad fat binary entry "
                               f"(kind {kind}, header {hsize}, size {size})")
        variant = ("a" if flags & FLAG_ARCH_SPECIFIC else
                   "f" if flags & FLAG_FAMILY_SPECIFIC else "")
        if kind == KIND_PTX:
            out.append(CudaImage("ptx", arch, variant, (major, minor)))
        else:
            plain = not flags & (FLAG_LZ4 | FLAG_ZSTD)
            empty = plain and size < _STUB_MAX and not _cubin_has_code(fd, pos + hsize, size)
            out.append(CudaImage("sass", arch, variant, empty=empty))
        pos += hsize + size
    return out


def _cubin_has_code(fd: int, pos: int, size: int) -> bool:
    """Whether the cubin at ``pos`` has a ``.text.*`` section (a kernel or device function).
    The device-link stubs some NVIDIA libraries register (cuFFT's: sm_75, no ``.text``) do
    not; anything unreadable is taken to have code."""
    try:
        sections = elf_sections(fd, pos, size)
    except DevcodeError:
        return True
    return sections is None or any(s.name.startswith(".text") for s in sections)


def find_loaded_fatbins(fd: int, sec: Section) -> list[list[CudaImage]]:
    """Fat binaries inside a data section (a library that loads its own modules: cuFFT keeps
    thousands in ``.ldata``, cuBLASLt and cuDNN in ``.cask_resource``). The section is searched
    once, in chunks, for the container magic; a candidate counts only when its header and every
    entry header are well formed, and its payloads are skipped."""
    magic = FATBIN_MAGIC_BYTES + b"\x01\x00\x10\x00"  # magic, version 1, header size 16
    groups: list[list[CudaImage]] = []
    end = sec.offset + sec.size
    pos = nxt = sec.offset  # chunk start; first offset a new container may start at
    while pos < end:
        chunk = os.pread(fd, min(_DATA_CHUNK + len(magic), end - pos), pos)
        if len(chunk) < len(magic):
            break
        i = chunk.find(magic, max(nxt - pos, 0))
        while i >= 0:
            at = pos + i
            _m, _v, hsize, size = _CONTAINER.unpack(pread_exact(fd, _CONTAINER.size, at))
            if 0 < size and at + hsize + size <= end:
                try:
                    groups.append(_entries(fd, sec, at + hsize, at + hsize + size))
                    nxt = at + hsize + size
                except DevcodeError:
                    nxt = at + 4
            else:
                nxt = at + 4
            i = chunk.find(magic, nxt - pos) if nxt - pos < len(chunk) else -1
        pos = max(pos + len(chunk) - len(magic) + 1, nxt)
    return groups
