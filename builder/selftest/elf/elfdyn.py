"""The dynamic linking facts of an ELF shared object, as the dynamic loader sees them: its
``DT_NEEDED`` names, ``DT_SONAME``, ``DT_RPATH``/``DT_RUNPATH``, the symbols it exports and the
symbols it needs, with their versions (``.gnu.version``, ``.gnu.version_d``,
``.gnu.version_r``). Read from the section table (:mod:`.elfread`); stdlib only.

Layouts (the System V gABI and the LSB's symbol versioning chapter; ``<elf.h>``):

* ``Elf64_Sym`` ``<IBBHQQ`` (name, info, other, shndx, value, size); ``Elf32_Sym`` ``<IIIBBH``.
  ``info >> 4`` is the binding (1 global, 2 weak, 10 GNU unique), ``other & 3`` the visibility
  (0 default, 3 protected export; 1 internal, 2 hidden do not), ``shndx`` 0 is undefined.
* ``Elf64_Dyn`` ``<qQ`` / ``Elf32_Dyn`` ``<iI`` (tag, value); strings in the section that
  ``sh_link`` names (``.dynstr``).
* ``.gnu.version``: one ``uint16`` per dynamic symbol; ``& 0x7fff`` the version index (0 local,
  1 global: unversioned), ``0x8000`` hidden (only a reference to that exact version binds it).
* ``Elf_Verdef`` ``<HHHHIII`` (version, flags, ndx, cnt, hash, aux, next), its first
  ``Elf_Verdaux`` ``<II`` (name, next) names the version; flag 1 is the file's base version.
* ``Elf_Verneed`` ``<HHIII`` (version, cnt, file, aux, next), each ``Elf_Vernaux`` ``<IHHII``
  (hash, flags, other, name, next): ``other`` is the index ``.gnu.version`` uses, flag 2 weak.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

from .elfread import DevcodeError, ElfHeader, Section, elf_header, elf_sections, pread_exact

SHT_RELA, SHT_DYNAMIC, SHT_REL, SHT_DYNSYM = 4, 6, 9, 11
SHT_VERDEF, SHT_VERNEED, SHT_VERSYM = 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF
DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH = 1, 14, 15, 29
STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 1, 2, 10
VER_FLG_BASE, VER_FLG_WEAK = 1, 2
SEP = b"\0"  # between a symbol's name and its version in an export or reference key


@dataclass(frozen=True)
class VersionNeed:
    """One ``.gnu.version_r`` entry: the object needs ``version`` of the library ``file``."""

    file: str
    version: str
    weak: bool = False


@dataclass
class DynInfo:
    """What the loader uses of one ELF file. Symbol names are bytes (as in the file).

    ``exports``: every defined global/weak symbol of default or protected visibility by name
    (unless its version is hidden) and, when the file defines versions, ``name\\0version``.
    ``refs``: the undefined non-weak symbols, ``name`` or ``name\\0version`` (a version from
    ``.gnu.version_r``); ``ref_file``: for a versioned one, the library its version names."""

    header: ElfHeader
    soname: str | None = None
    needed: list[str] = field(default_factory=list)
    rpath: list[str] = field(default_factory=list)
    runpath: list[str] | None = None
    verdefs: set[str] = field(default_factory=set)
    verneed: list[VersionNeed] = field(default_factory=list)
    exports: set[bytes] = field(default_factory=set)
    names: set[bytes] = field(default_factory=set)
    refs: set[bytes] = field(default_factory=set)
    ref_file: dict[bytes, str] = field(default_factory=dict)

    _sorted: list[bytes] | None = field(default=None, repr=False, compare=False)

    def sorted_names(self) -> list[bytes]:
        """:attr:`names` sorted (once)."""
        if self._sorted is None:
            self._sorted = sorted(self.names)
        return self._sorted

    @property
    def versioned(self) -> bool:
        """The file defines versions: a versioned reference must then name one it defines."""
        return bool(self.verdefs)


def _cstr(table: bytes, offset: int) -> bytes:
    end = table.find(b"\0", offset)
    return table[offset:end if end >= 0 else None]


def _read(fd: int, sec: Section) -> bytes:
    return pread_exact(fd, sec.size, sec.offset)


def _strings(fd: int, secs: list[Section], sec: Section, cache: dict[int, bytes]) -> bytes:
    if sec.link not in cache:
        target = next((s for s in secs if s.index == sec.link), None)
        if target is None:
            raise DevcodeError(f"{sec.name}: its string table (section {sec.link}) is missing")
        cache[sec.link] = _read(fd, target)
    return cache[sec.link]


def _dynamic(info: DynInfo, data: bytes, strtab: bytes) -> None:
    fmt = "<qQ" if info.header.cls64 else "<iI"
    for tag, val in struct.iter_unpack(fmt, data[:len(data) - len(data) % struct.calcsize(fmt)]):
        if tag == 0:
            break
        if tag in (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH):
            text = _cstr(strtab, val).decode("utf-8", "surrogateescape")
            if tag == DT_NEEDED:
                info.needed.append(text)
            elif tag == DT_SONAME:
                info.soname = text
            elif tag == DT_RPATH:
                info.rpath += [p for p in text.split(":") if p]
            else:
                info.runpath = (info.runpath or []) + [p for p in text.split(":") if p]


def _verdefs(data: bytes, strtab: bytes) -> dict[int, tuple[str, int]]:
    """Version index -> (name, flags)."""
    out: dict[int, tuple[str, int]] = {}
    pos = 0
    while pos + 20 <= len(data) and len(out) < 1 << 16:
        _v, flags, ndx, cnt, _h, aux, nxt = struct.unpack_from("<HHHHIII", data, pos)
        if cnt and pos + aux + 8 <= len(data):
            name, = struct.unpack_from("<I", data, pos + aux)
            out[ndx] = (_cstr(strtab, name).decode("latin-1"), flags)
        if not nxt:
            break
        pos += nxt
    return out


def _verneeds(data: bytes, strtab: bytes) -> dict[int, VersionNeed]:
    """Version index -> what it needs."""
    out: dict[int, VersionNeed] = {}
    pos = 0
    while pos + 16 <= len(data) and len(out) < 1 << 16:
        _v, cnt, file, aux, nxt = struct.unpack_from("<HHIII", data, pos)
        fname = _cstr(strtab, file).decode("utf-8", "surrogateescape")
        apos = pos + aux
        for _ in range(cnt):
            if apos + 16 > len(data):
                break
            _hash, flags, other, name, anext = struct.unpack_from("<IHHII", data, apos)
            out[other] = VersionNeed(fname, _cstr(strtab, name).decode("latin-1"),
                                     bool(flags & VER_FLG_WEAK))
            if not anext:
                break
            apos += anext
        if not nxt:
            break
        pos += nxt
    return out


def _symbols(info: DynInfo, data: bytes, strtab: bytes, versym: bytes | None,
             defs: dict[int, tuple[str, int]], needs: dict[int, VersionNeed]) -> None:
    fmt = "<IBBHQQ" if info.header.cls64 else "<IIIBBH"
    size = struct.calcsize(fmt)
    count = len(data) // size
    vers = struct.unpack(f"<{count}H", versym[:2 * count]) if versym and \
        len(versym) >= 2 * count else None
    for i, ent in enumerate(struct.iter_unpack(fmt, data[:count * size])):
        if i == 0:
            continue
        if info.header.cls64:
            st_name, st_info, other, shndx = ent[0], ent[1], ent[2], ent[3]
        else:
            st_name, st_info, other, shndx = ent[0], ent[3], ent[4], ent[5]
        bind = st_info >> 4
        if bind not in (STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE):
            continue
        name = _cstr(strtab, st_name)
        v = vers[i] if vers else 1
        ndx = v & 0x7FFF
        if shndx == 0:
            if bind == STB_WEAK or not name:
                continue
            need = needs.get(ndx) if ndx > 1 else None
            key = name + SEP + need.version.encode() if need else name
            info.refs.add(key)
            if need:
                info.ref_file[key] = need.file
            continue
        if other & 3 in (1, 2):  # internal, hidden: not exported
            continue
        info.names.add(name)
        ver = defs.get(ndx) if ndx > 1 else None
        if ver is not None:
            info.exports.add(name + SEP + ver[0].encode())
        if not v & 0x8000:
            info.exports.add(name)


def read_dynamic(path: str) -> DynInfo | None:
    """The dynamic linking facts of the ELF file at ``path`` (None: not a little-endian ELF
    file). Raises OSError when it cannot be read, DevcodeError when it is malformed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        header = elf_header(fd)
        if header is None:
            return None
        secs = elf_sections(fd) or []
        info = DynInfo(header)
        strings: dict[int, bytes] = {}
        by_type = {s.type: s for s in secs if s.type in (SHT_DYNAMIC, SHT_DYNSYM, SHT_VERDEF,
                                                           SHT_VERNEED, SHT_VERSYM)}
        if SHT_DYNAMIC in by_type:
            sec = by_type[SHT_DYNAMIC]
            _dynamic(info, _read(fd, sec), _strings(fd, secs, sec, strings))
        defs: dict[int, tuple[str, int]] = {}
        needs: dict[int, VersionNeed] = {}
        if SHT_VERDEF in by_type:
            sec = by_type[SHT_VERDEF]
            defs = _verdefs(_read(fd, sec), _strings(fd, secs, sec, strings))
            info.verdefs = {n for n, _flags in defs.values()}
        if SHT_VERNEED in by_type:
            sec = by_type[SHT_VERNEED]
            needs = _verneeds(_read(fd, sec), _strings(fd, secs, sec, strings))
            info.verneed = list(needs.values())
        if SHT_DYNSYM in by_type:
            sec = by_type[SHT_DYNSYM]
            versym = _read(fd, by_type[SHT_VERSYM]) if SHT_VERSYM in by_type else None
            _symbols(info, _read(fd, sec), _strings(fd, secs, sec, strings), versym, defs,
                     needs)
        return info
    finally:
        os.close(fd)


def relocated(path: str, names: set[bytes]) -> set[bytes]:
    """Which of ``names`` (undefined symbols of the file at ``path``) a dynamic relocation
    refers to. The loader looks a symbol up only to apply a relocation (``elf/dl-reloc.c``): an
    undefined ``.dynsym`` entry no relocation names (GCC 13's ``.globl
    _ZSt21ios_base_library_initv``, a link-time marker) is never looked up, and ``ldd -r`` does
    not report it either. Read only for a file with unbound symbols."""
    fd = os.open(path, os.O_RDONLY)
    try:
        header = elf_header(fd)
        secs = elf_sections(fd) or []
        dynsym = next((s for s in secs if s.type == SHT_DYNSYM), None)
        if header is None or dynsym is None:
            return set()
        fmt = "<IBBHQQ" if header.cls64 else "<IIIBBH"
        size = struct.calcsize(fmt)
        wide = 8 if header.cls64 else 4
        indices: set[int] = set()
        for sec in secs:
            if sec.type not in (SHT_RELA, SHT_REL) or sec.link != dynsym.index:
                continue
            step = (3 if sec.type == SHT_RELA else 2)
            data = _read(fd, sec)
            words = memoryview(data[:len(data) - len(data) % (wide * step)]).cast(
                "Q" if header.cls64 else "I")
            shift = 32 if header.cls64 else 8
            indices |= {info >> shift for info in set(words[1::step])}
        table = _read(fd, dynsym)
        strtab = _strings(fd, secs, dynsym, {})
        out = set()
        for i in indices:
            if 0 < i and (i + 1) * size <= len(table):
                name = _cstr(strtab, struct.unpack_from("<I", table, i * size)[0])
                if name in names:
                    out.add(name)
        return out
    finally:
        os.close(fd)
