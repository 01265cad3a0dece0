"""Where the dynamic loader (glibc's ``ld.so``) finds a ``DT_NEEDED`` library, in its order
(``ld.so(8)``; ``elf/dl-load.c``: ``_dl_map_object``):

1. a name with a ``/`` is a path;
2. an object already loaded whose soname (or requested name) is the name is reused: torch's
   libraries, loaded before any extension, satisfy an extension's ``libc10.so`` this way;
3. ``DT_RPATH`` of the requesting object, then of the object that loaded it and on up to the
   executable, unless the requesting object has ``DT_RUNPATH``;
4. ``LD_LIBRARY_PATH``;
5. ``DT_RUNPATH`` of the requesting object only;
6. ``/etc/ld.so.cache`` (parsed here; ``ldconfig -p`` when the file cannot be read);
7. the default directories (``/lib``, ``/usr/lib``, their 64-bit and Debian multiarch forms).

``$ORIGIN`` (``${ORIGIN}``) in a path is the directory of the object that names it. A candidate
whose ELF class or machine differs from the process's is passed over, as the loader does.
Stdlib only.
"""

from __future__ import annotations

import os
import struct
import subprocess
from dataclasses import dataclass, field
from typing import Callable

LD_CACHE = "/etc/ld.so.cache"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
# Debian/Ubuntu multiarch triplets by ELF machine; the loader's built-in system directories.
TRIPLETS = {62: "x86_64-linux-gnu", 183: "aarch64-linux-gnu", 3: "i386-linux-gnu",
            21: "powerpc64le-linux-gnu"}


def parse_ld_cache(data: bytes) -> list[tuple[str, str]]:
    """(name, path) entries of an ``ld.so.cache`` in the new format (glibc ≥ 2.32 writes only
    it; older ones append it to the old format). Header: magic and version (20 bytes), number of
    entries, string table length (``<II``), 24 more bytes; entries ``<iIIIQ`` (flags, key, value,
    os version, hwcap); key and value are offsets from the start of the new header."""
    base = data.find(NEW_MAGIC)
    if base < 0 or base + 48 > len(data):
        return []
    nlibs, = struct.unpack_from("<I", data, base + 20)
    out = []
    for i in range(min(nlibs, (len(data) - base - 48) // 24)):
        _flags, key, value, _os, _hw = struct.unpack_from("<iIIIQ", data, base + 48 + 24 * i)
        name, path = _cstr(data, base + key), _cstr(data, base + value)
        if name and path:
            out.append((name, path))
    return out


def _cstr(data: bytes, pos: int) -> str:
    if pos >= len(data):
        return ""
    end = data.find(b"\0", pos)
    return data[pos:end if end >= 0 else None].decode("utf-8", "surrogateescape")


def parse_ldconfig_p(text: str) -> list[tuple[str, str]]:
    """(name, path) from ``ldconfig -p``: ``\\tlibz.so.1 (libc6,x86-64) => /lib/.../libz.so.1``."""
    out = []
    for line in text.splitlines():
        name, sep, path = line.strip().partition(" => ")
        if sep and " (" in name:
            out.append((name.split(" (", 1)[0], path.strip()))
    return out


def load_cache(path: str = LD_CACHE) -> tuple[dict[str, list[str]], str]:
    """The loader's cache, name → paths in cache order, and where it came from."""
    entries: list[tuple[str, str]] = []
    source = "none"
    try:
        with open(path, "rb") as f:
            entries = parse_ld_cache(f.read())
        source = f"{path} ({len(entries)} entries)"
    except OSError:
        pass
    if not entries:
        try:
            proc = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True,
                                  timeout=30, check=False)
            entries = parse_ldconfig_p(proc.stdout)
            source = f"ldconfig -p ({len(entries)} entries)" if entries else source
        except (OSError, subprocess.SubprocessError):
            pass
    cache: dict[str, list[str]] = {}
    for name, p in entries:
        cache.setdefault(name, []).append(p)
    return cache, source


def default_dirs(machine: int, cls64: bool) -> list[str]:
    """The loader's built-in directories for the process's machine."""
    triplet = TRIPLETS.get(machine)
    multi = [f"/lib/{triplet}", f"/usr/lib/{triplet}"] if triplet else []
    wide = ["/lib64", "/usr/lib64"] if cls64 else []
    return multi + wide + ["/lib", "/usr/lib"]


def expand(entry: str, origin: str) -> str:
    """``$ORIGIN``/``${ORIGIN}`` → the directory of the object that names the path."""
    return entry.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)


@dataclass
class Searcher:
    """The loader's search for one process: its cache, ``LD_LIBRARY_PATH`` and default
    directories; ``accept(path)`` says whether a file fits the process (class and machine)."""

    cache: dict[str, list[str]]
    ld_library_path: list[str]
    defaults: list[str]
    accept: Callable[[str], bool]
    tried: dict[str, list[str]] = field(default_factory=dict)  # name -> where it was looked for

    def _first(self, name: str, dirs: list[str], where: list[str]) -> str | None:
        for d in dirs:
            cand = os.path.join(d, name)
            where.append(d)
            if os.path.isfile(cand) and self.accept(cand):
                return cand
        return None

    def find(self, name: str, rpaths: list[list[str]], runpath: list[str] | None) -> \
            str | None:
        """Path of ``name`` for a requester whose own ``DT_RUNPATH`` is ``runpath`` (already
        expanded) and whose chain of ``DT_RPATH`` lists (itself, its loader, …, the
        executable; already expanded) is ``rpaths``; None when not found."""
        if "/" in name:
            return name if os.path.isfile(name) and self.accept(name) else None
        where: list[str] = []
        found = None
        if runpath is None:
            for dirs in rpaths:
                found = found or self._first(name, dirs, where)
        found = found or self._first(name, self.ld_library_path, where)
        found = found or self._first(name, runpath or [], where)
        if not found:
            where.append("ld.so.cache")
            found = next((p for p in self.cache.get(name, [])
                          if os.path.isfile(p) and self.accept(p)), None)
        found = found or self._first(name, self.defaults, where)
        if not found:
            self.tried[name] = where
        return found


def env_paths(value: str | None) -> list[str]:
    """``LD_LIBRARY_PATH``'s directories (an empty entry is the current directory)."""
    if not value:
        return []
    return [p or "." for p in value.replace(";", ":").split(":")]
