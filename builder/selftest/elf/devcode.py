"""Read the device code of an ELF shared object without reading the whole file: the ELF header
and section headers, then only the headers inside ``.nv_fatbin`` (the CUDA fat binaries the
runtime registers, :mod:`.fatbin`) and ``.hip_fatbin`` (HIP offload bundles, :mod:`.offload`).
A CUDA library may also keep fat binaries in its data sections and load them itself (cuFFT,
cuBLASLt, cuDNN): for a library with registered code those sections are searched once, in
chunks, for well-formed containers. ``__nv_relfatbin`` (relocatable objects for a later device
link) is not code that runs and is not read. A small registered cubin without any ``.text``
section is a device-link stub (no kernel) and is marked ``empty``. Stdlib only.

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
from dataclasses import dataclass, field

from .elfread import DevcodeError, elf_sections
from .fatbin import CudaImage, find_loaded_fatbins, read_fatbins
from .offload import HipImage, read_bundles

CUDA_SECTIONS = (".nv_fatbin",)
HIP_SECTIONS = (".hip_fatbin",)
__all__ = ["CudaImage", "DevcodeError", "DeviceCode", "HipImage", "read_device_code"]


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
