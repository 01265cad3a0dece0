"""Synthetic bytes for the device-code reader's unit tests: a minimal little-endian ELF file
with named sections, CUDA fat binary containers and HIP offload bundles, laid out as
devcode.py's docstring describes (the real-file tests check that description against NVIDIA's
and LLVM's tools)."""

from __future__ import annotations

import struct
import zlib


def elf(sections: dict[str, bytes], cls64: bool = True) -> bytes:
    """An ELF file (no program headers) holding ``sections`` plus ``.shstrtab``."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n in sections) + b".shstrtab\0"
    ehsize = 64 if cls64 else 52
    body = b""
    offsets = []
    for data in list(sections.values()) + [names]:
        pad = (-(ehsize + len(body))) % 8
        body += b"\0" * pad
        offsets.append(ehsize + len(body))
        body += data
    body += b"\0" * ((-(ehsize + len(body))) % 8)
    shoff = ehsize + len(body)
    sh = struct.Struct("<IIQQQQIIQQ" if cls64 else "<IIIIIIIIII")
    table = sh.pack(*([0] * 10))
    name_off = 1
    for (name, data), off in zip(list(sections.items()) + [(".shstrtab", names)], offsets):
        stype = 3 if name == ".shstrtab" else 1
        table += sh.pack(name_off, stype, 0, 0, off, len(data), 0, 0, 8, 0)
        name_off += len(name) + 1
    shnum = len(sections) + 2
    ident = b"\x7fELF" + bytes([2 if cls64 else 1, 1, 1]) + b"\0" * 9
    if cls64:
        head = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, ehsize, 0, 0,
                                   sh.size, shnum, shnum - 1)
    else:
        head = ident + struct.pack("<HHIIIIIHHHHHH", 3, 3, 1, 0, 0, shoff, 0, ehsize, 0, 0,
                                   sh.size, shnum, shnum - 1)
    return head + body + table


def fatbin_entry(kind: int, arch: int, flags: int = 0x11, payload: bytes = b"\0" * 24,
                 isa: tuple[int, int] = (9, 0), header_size: int = 64) -> bytes:
    """One entry: kind 1 PTX / 2 SASS."""
    major, minor = isa if kind == 1 else (1, 8)
    head = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x101, header_size, len(payload), 0, 0, minor,
                       major, arch, 0, 0, flags, 0, 0)
    return head + b"\0" * (header_size - 64) + payload


def fatbin(*entries: bytes) -> bytes:
    """A fat binary container."""
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def bundle(triples: list[str], payload: bytes = b"\x7fELF" + b"\0" * 60) -> bytes:
    """An uncompressed offload bundle with one (identical) code object per triple."""
    head_len = 32 + sum(24 + len(t) for t in triples)
    out = b"__CLANG_OFFLOAD_BUNDLE__" + struct.pack("<Q", len(triples))
    objs = b""
    for t in triples:
        out += struct.pack("<QQQ", head_len + len(objs), len(payload), len(t)) + t.encode()
        objs += payload
    return out + objs


def ccob(plain: bytes, version: int = 3, method: int = 0, compressed: bytes | None = None) -> bytes:
    """A compressed bundle (method 0 zlib; ``compressed`` given for other methods)."""
    data = zlib.compress(plain) if compressed is None else compressed
    if version == 3:
        head = struct.pack("<4sHHQQQ", b"CCOB", 3, method, 32 + len(data), len(plain), 0)
    elif version == 2:
        head = struct.pack("<4sHHIIQ", b"CCOB", 2, method, 24 + len(data), len(plain), 0)
    else:
        head = struct.pack("<4sHHIQ", b"CCOB", 1, method, len(plain), 0)
    return head + data
