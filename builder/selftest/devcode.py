"""Read the device code of an ELF shared object without reading the whole file: the ELF header
and section headers, then only the headers inside the ``.nv_fatbin`` / ``__nv_relfatbin``
(CUDA fat binaries) and ``.hip_fatbin`` (HIP offload bundles) sections. Stdlib only.

CUDA fat binary layout (as nvcc and NVIDIA's ``fatbinary`` write it; the same layout is read by
public readers such as n-eiling/cuda-fatbin-decompression and jiegec/fatbinary, and checked here
against NVIDIA's ``cuobjdump --list-elf --list-ptx`` in the tests). All little-endian:

* container header, 16 bytes: ``u32 magic 0xBA55ED50, u16 version 1, u16 header_size 16,
  u64 size`` (bytes of entries after the header). A section holds one container per
  translation unit, back to back (possibly padded).
* entry header (``header_size`` bytes, at least 64): ``u16 kind`` (1 PTX, 2 ELF/SASS),
  ``u16 version``, ``u32 header_size``, ``u64 size`` (payload bytes that follow the header),
  ``u32 compressed_size``, ``u32 options_offset``, ``u16 minor, u16 major`` (PTX ISA version of
  a PTX entry), ``u32 arch`` (e.g. 90 for sm_90 / compute_90), ``u32 name_offset, u32
  name_len``, ``u64 flags``, ``u64 reserved``, ``u64 uncompressed_size``.
* flags: 0x1 64-bit, 0x2 debug, 0x10 Linux host, 0x2000 payload LZ4-compressed, 0x8000 payload
  zstd-compressed (CUDA 13), 0x100000 arch-specific target (``sm_90a``), 0x200000
  family-specific target (``sm_100f``). The last two were established here by compiling every
  variant with nvcc 13 and reading NVIDIA's ``cuobjdump`` listing of the result.

HIP offload bundle (clang's ``clang-offload-bundler``, LLVM ``OffloadBundler.cpp``):
``"__CLANG_OFFLOAD_BUNDLE__"``, ``u64 count``, then per entry ``u64 offset, u64 size, u64
triple_len, triple``. The compressed form (``"CCOB"``) has ``u16 version, u16 method`` (0 zlib,
1 zstd), then v1 ``u32 uncompressed, u64 hash``; v2 ``u32 total, u32 uncompressed, u64 hash``;
v3 ``u64 total, u64 uncompressed, u64 hash``; the bundle (triples included) is inside the
compressed payload, and only its start is decompressed: zlib by the stdlib, zstd by
``compression.zstd`` (Python 3.14) or ``zstandard`` when present, else by the pure-Python
:mod:`.zstdprefix`. A payload none of them can read is reported, never taken as covered.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from dataclasses import dataclass, field
from typing import Callable

from .zstdprefix import decompress_prefix

ELF_MAGIC = b"\x7fELF"
CUDA_SECTIONS = (".nv_fatbin",)
HIP_SECTIONS = (".hip_fatbin",)
# Data sections of a CUDA library that may hold fat binaries it loads itself (cuModuleLoadData):
# read-only/large data, never code, debug info or relocatable device code (__nv_relfatbin holds
# objects for a later device link, not code that runs as it is).
SKIP_DATA = (".debug", ".eh_frame", ".gcc_except_table", ".got", ".comment", ".note", ".init",
             ".fini", ".dynamic", ".interp", ".plt", ".tbss", ".tdata", "__nv_relfatbin",
             ".nv_fatbin", ".nvFatBinSegment", ".hip_fatbin", ".dyn", ".rela", ".gnu",
             ".symtab", ".strtab", ".shstrtab", "__nv_module_id")
SHT_PROGBITS, SHF_EXECINSTR = 1, 0x4

FATBIN_MAGIC = 0xBA55ED50
FATBIN_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)
KIND_PTX, KIND_SASS = 1, 2
FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000  # sm_90a / compute_90a
FLAG_FAMILY_SPECIFIC = 0x200000  # sm_100f / compute_100f
_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
CCOB_MAGIC = b"CCOB"
_SCAN_CHUNK = 1 << 16  # gaps between containers and bundles are small
_DATA_CHUNK = 1 << 22  # data sections are searched through
_STUB_MAX = 1 << 14  # cubins this large are taken to hold code without looking inside
_MAX_HEADER = 1 << 20  # an uncompressed bundle header larger than this is not a bundle


class DevcodeError(Exception):
    """The file's device code cannot be read (malformed, or no decoder for its compression)."""


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


@dataclass(frozen=True, order=True)
class HipImage:
    """One code object of a HIP offload bundle."""

    triple: str  # e.g. hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-
    target: str  # the target id: gfx942:sramecc+:xnack-, gfx9-4-generic, amdgcnspirv

    @property
    def name(self) -> str:
        """The target id."""
        return self.target


@dataclass
class DeviceCode:
    """What one shared object carries: its images grouped by fat binary container / offload
    bundle (one per translation unit, as the compiler wrote them)."""

    cuda_groups: list[list[CudaImage]] = field(default_factory=list)  # registered: .nv_fatbin
    cuda_loaded: list[list[CudaImage]] = field(default_factory=list)  # in data sections
    hip_groups: list[list[HipImage]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what could not be read, and why

    @property
    def cuda(self) -> list[CudaImage]:
        """Every registered CUDA image (``.nv_fatbin``, what ``cuobjdump`` lists), in order."""
        return [i for g in self.cuda_groups for i in g]

    @property
    def all_cuda_groups(self) -> list[list[CudaImage]]:
        """Registered fat binaries and those the library keeps in its data to load itself."""
        return self.cuda_groups + self.cuda_loaded

    @property
    def hip(self) -> list[HipImage]:
        """Every HIP code object, in file order."""
        return [i for g in self.hip_groups for i in g]

    @property
    def containers(self) -> int:
        """Fat binary containers and offload bundles read."""
        return len(self.cuda_groups) + len(self.cuda_loaded) + len(self.hip_groups)

    @property
    def empty(self) -> bool:
        """No device code found (and nothing that looked like it failed to read)."""
        return not (self.cuda_groups or self.hip_groups or self.problems)


# --------------------------------------------------------------------------- ELF


@dataclass(frozen=True)
class Section:
    name: str
    offset: int
    size: int
    type: int = SHT_PROGBITS
    flags: int = 0

    @property
    def data_candidate(self) -> bool:
        """A data section that may hold fat binaries loaded by the library itself."""
        return (self.type == SHT_PROGBITS and not self.flags & SHF_EXECINSTR and self.size > 0
                and not self.name.startswith(SKIP_DATA))


def _pread(fd: int, size: int, offset: int) -> bytes:
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
        first = sh.unpack(_pread(fd, sh.size, base + shoff))
        shnum = shnum or first[5]
        shstrndx = first[6] if shstrndx == 0xFFFF else shstrndx
    if shnum > 1 << 20 or shstrndx >= shnum:
        raise DevcodeError(f"implausible section table ({shnum} sections, names in {shstrndx})")
    if limit is not None and shoff + shentsize * shnum > limit:
        raise DevcodeError("section table runs past the image")
    table = _pread(fd, shentsize * shnum, base + shoff)
    headers = [sh.unpack_from(table, i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx]
    if limit is not None and strtab[4] + strtab[5] > limit:
        raise DevcodeError("section names run past the image")
    names = _pread(fd, strtab[5], base + strtab[4])
    out = []
    for h in headers:
        end = names.find(b"\0", h[0])
        name = names[h[0]:end if end >= 0 else None].decode("latin-1")
        if h[1] != 8:  # SHT_NOBITS has no bytes in the file
            out.append(Section(name, h[4], h[5], h[1], h[2]))
    return out


def _find(fd: int, magics: tuple[bytes, ...], start: int, end: int, align: int,
          chunk_size: int = _SCAN_CHUNK) -> int | None:
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


# --------------------------------------------------------------------------- CUDA


def read_fatbins(fd: int, sec: Section) -> list[list[CudaImage]]:
    """The entries of every fat binary container in a section, one list per container."""
    groups: list[list[CudaImage]] = []
    end = sec.offset + sec.size
    pos = sec.offset
    while pos + _CONTAINER.size <= end:
        head = _pread(fd, _CONTAINER.size, pos)
        magic, version, hsize, size = _CONTAINER.unpack(head)
        if magic != FATBIN_MAGIC:
            found = _find(fd, (FATBIN_MAGIC_BYTES,), pos + 8 - (pos - sec.offset) % 8, end, 8)
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
         _usize) = _ENTRY.unpack(_pread(fd, _ENTRY.size, pos))
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
            _m, _v, hsize, size = _CONTAINER.unpack(_pread(fd, _CONTAINER.size, at))
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


# --------------------------------------------------------------------------- HIP

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
        import zstandard
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
        found = _find(fd, (BUNDLE_MAGIC, CCOB_MAGIC), nxt, end, 1)
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


# --------------------------------------------------------------------------- one file


def read_device_code(path: str) -> DeviceCode | None:
    """The device code of one file (None: not a little-endian ELF file).

    Raises OSError when the file cannot be opened; malformed device code is recorded in
    ``problems`` (with the section and offset), never silently dropped."""
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            sections = elf_sections(fd)
        except DevcodeError as e:
            return DeviceCode(problems=[f"ELF section table: {e}"])
        if sections is None:
            return None
        code = DeviceCode()
        for sec in sections:
            try:
                if sec.name in CUDA_SECTIONS:
                    code.cuda_groups += read_fatbins(fd, sec)
                elif sec.name in HIP_SECTIONS:
                    groups, problems = read_bundles(fd, sec)
                    code.hip_groups += groups
                    code.problems += problems
            except DevcodeError as e:
                code.problems.append(str(e))
        if code.cuda_groups:  # a CUDA library: also the fat binaries it loads itself
            for sec in sections:
                if sec.data_candidate:
                    code.cuda_loaded += find_loaded_fatbins(fd, sec)
        return code
    finally:
        os.close(fd)
