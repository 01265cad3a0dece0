"""The process the ABI phase models: the interpreter, the libraries torch loads before any
extension, and for each shared object the libraries the dynamic loader gives it and whether
every symbol it needs is defined there, with the version it needs.

The model follows glibc's loader (``elf/dl-load.c``, ``elf/dl-deps.c``, ``elf/dl-lookup.c``,
``elf/dl-version.c``):

* An extension is ``dlopen``-ed by the interpreter (``RTLD_NOW``: every symbol is bound at
  load). It sees the **global scope** (the executable and its dependencies, and whatever was
  loaded ``RTLD_GLOBAL``), then its own dependencies, breadth first.
* ``import torch`` first loads ``torch/lib/libtorch_global_deps.so`` with ``RTLD_GLOBAL`` (its
  dependencies join the global scope), then ``torch._C`` (``RTLD_LOCAL``: ``libtorch_python``,
  ``libtorch``, ``libc10`` … are loaded, not global). A later extension whose ``DT_NEEDED``
  names ``libc10.so`` gets that loaded copy by its soname, whatever its own search path says.
* A symbol reference binds to a definition of the same name in scope: an unversioned reference
  to any non-hidden definition; a versioned one (``name@VERSION``) to the definition of that
  version, or to any definition in a library that defines no versions. Weak references may stay
  unbound.
* Each ``.gnu.version_r`` entry names a library and a version it must define (``version
  `GLIBC_2.99' not found``), unless weak or the library defines no versions at all.
"""

from __future__ import annotations

import bisect
import os
import re
from collections import deque
from dataclasses import dataclass, field

from .elfdyn import SEP, DynInfo, read_dynamic, relocated
from .elfread import DevcodeError, ElfHeader, elf_header
from .ldsearch import Searcher, expand


@dataclass
class Closure:
    """What loading one object brings in: objects in load order (realpaths), name → path of
    everything loaded so far, and the names the loader could not find (name, requester)."""

    order: list[str]
    names: dict[str, str]
    missing: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Unbound:
    """A symbol reference no library in scope defines."""

    key: bytes  # name or name\0version
    expected: str | None  # the library that should define it (name as loaded), when known
    expected_path: str | None

    @property
    def name(self) -> str:
        return self.key.split(SEP, 1)[0].decode("utf-8", "surrogateescape")

    @property
    def version(self) -> str | None:
        parts = self.key.split(SEP, 1)
        return parts[1].decode("latin-1") if len(parts) > 1 else None


class Process:
    """The interpreter's process as the loader builds it; reads each ELF file once."""

    def __init__(self, searcher: Searcher, header: ElfHeader):
        self.searcher = searcher
        self.header = header
        self.infos: dict[str, DynInfo] = {}
        self.global_order: list[str] = []
        self.loaded: dict[str, str] = {}  # name or soname -> realpath, of what is loaded
        self.base_rpaths: list[list[str]] = []  # the executable's DT_RPATH (all lookups)
        self.torch_global: str | None = None  # libtorch_global_deps.so, when torch is there
        self.torch_local: list[str] = []  # torch/_C*.so
        self.preloaded: list[str] = []  # what torch preloads (nvidia/*/lib), in its order
        self.preload_stop: str | None = None  # the required preload torch did not find
        # realpath -> the load order (scope) of the dlopen that first brought it in
        self.group: dict[str, list[str]] = {}

    def fits(self, path: str) -> bool:
        """The file is an ELF file of the process's class and machine."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return False
        try:
            h = elf_header(fd)
        finally:
            os.close(fd)
        return h is not None and h.cls64 == self.header.cls64 and \
            h.machine == self.header.machine

    def dyn(self, path: str) -> DynInfo:
        """The dynamic facts of ``path`` (a realpath); OSError / DevcodeError when unreadable."""
        info = self.infos.get(path)
        if info is None:
            got = read_dynamic(path)
            if got is None:
                raise DevcodeError("not a little-endian ELF file")
            info = self.infos[path] = got
        return info

    def closure(self, root: str, names: dict[str, str]) -> Closure:
        """Load ``root`` (a realpath) and its dependencies, breadth first, into a process
        where ``names`` are loaded."""
        out = Closure([root], dict(names))
        seen = {root}
        queue = deque([(root, self.base_rpaths)])
        while queue:
            path, chain = queue.popleft()
            info = self.dyn(path)
            if info.soname:
                out.names.setdefault(info.soname, path)
            origin = os.path.dirname(path)
            runpath = None if info.runpath is None else [expand(p, origin)
                                                          for p in info.runpath]
            mine = [expand(p, origin) for p in info.rpath] if runpath is None else []
            rchain = [mine] + chain if mine else chain
            for name in info.needed:
                dep = out.names.get(name)
                if dep is None:
                    found = self.searcher.find(name, rchain if runpath is None else [], runpath)
                    if found is None:
                        out.missing.append((name, path))
                        continue
                    dep = os.path.realpath(found)
                    out.names[name] = dep
                if dep not in seen:
                    seen.add(dep)
                    out.order.append(dep)
                    queue.append((dep, rchain))
        return out

    def start(self, executable: str) -> None:
        """The process before anything is imported: the executable's closure (global)."""
        exe = os.path.realpath(executable)
        info = self.dyn(exe)
        if info.runpath is None and info.rpath:
            self.base_rpaths = [[expand(p, os.path.dirname(exe)) for p in info.rpath]]
        self.load(exe, True)

    def load(self, path: str, global_: bool) -> Closure:
        """``dlopen(path)`` (a realpath): its closure joins what is loaded, and the global
        scope with ``RTLD_GLOBAL``. Every object it brings in first is checked later in this
        load's scope (:attr:`group`): the loader bound its symbols then, in that scope."""
        c = self.closure(path, self.loaded)
        for p in c.order:
            self.group.setdefault(p, c.order)
        if global_:
            self.global_order += [p for p in c.order if p not in self.global_order]
        self.loaded = c.names
        return c

    def mapped(self, fragment: str) -> bool:
        """A loaded object's file name contains ``fragment`` (``/proc/self/maps``)."""
        return any(fragment in os.path.basename(p) for p in set(self.loaded.values()))

    def extra_scope(self, loads: list[tuple[str, bool]]) -> tuple[dict[str, str], list[str]]:
        """What a package loads itself before its extension (``loads``: realpath, global):
        the names then loaded, and what joins the global scope; the process is unchanged."""
        names, extra = dict(self.loaded), []
        for path, global_ in loads:
            c = self.closure(path, names)
            names = c.names
            extra += [p for p in c.order if global_ and p not in extra]
        return names, extra

def bind(refs: set[bytes], scope: list[DynInfo]) -> set[bytes]:
    """The references no library of ``scope`` defines (the loader's rules, module doc)."""
    left = set(refs)
    for info in scope:
        if not left:
            break
        if info.versioned:
            left -= left & info.exports
        else:
            left -= {k for k in left if k.split(SEP, 1)[0] in info.names}
    return left


_NESTED = re.compile(rb"^_ZN[rVKRO]*(\d+)")


def family(name: bytes) -> bytes:
    """The part of a symbol name its relatives share: the outer namespace of a C++ name
    (``_ZN3c10``), else the text before the first ``_`` (C names: ``cuInit`` → ``cuInit``)."""
    m = _NESTED.match(name)
    if m:
        return name[:m.end() + int(m.group(1))]
    head = name.lstrip(b"_").split(b"_", 1)[0]
    return name[:len(name) - len(name.lstrip(b"_")) + len(head)]


def expected_provider(key: bytes, info: DynInfo, scope: list[tuple[str, DynInfo]],
                      names: dict[str, str]) -> tuple[str | None, str | None]:
    """The library that should define the reference ``key`` of ``info``: the library its
    version names; else the library in scope that defines most symbols of its family (the
    namespace of a C++ name); (None, None) when no library comes close."""
    file = info.ref_file.get(key)
    if file:
        return file, names.get(file)
    fam = family(key.split(SEP, 1)[0])
    best, count = None, 0
    for path, lib in scope:
        if lib is info or len(fam) < 3:
            continue
        n = prefix_count(lib, fam)
        if n > count:
            best, count = path, n
    if best is None:
        return None, None
    soname = scope_name(best, names)
    return soname, best


def prefix_count(lib: DynInfo, prefix: bytes) -> int:
    """How many names ``lib`` exports that start with ``prefix`` (bisect in its sorted names,
    sorted once per library: a failing object's symbols ask every library in its scope)."""
    names = lib.sorted_names()
    return bisect.bisect_left(names, prefix + b"\xff\xff") - bisect.bisect_left(names, prefix)


def scope_name(path: str, names: dict[str, str]) -> str:
    """The name a loaded library goes by (its soname or the name it was asked for)."""
    return next((n for n, p in names.items() if p == path and "/" not in n),
                os.path.basename(path))


def unbound_alone(proc: Process, path: str) -> tuple[set[str], list[str]]:
    """What ``ldd -r PATH`` reports: the object loaded as if it were the program (no
    interpreter, nothing loaded before it): the names of its references no library of its
    closure defines, and the libraries the loader cannot find."""
    c = proc.closure(path, {})
    left = bind(proc.dyn(path).refs, [proc.dyn(p) for p in c.order])
    if left:  # only what a relocation names is ever looked up (elfdyn.relocated)
        named = relocated(path, {k.split(SEP, 1)[0] for k in left})
        left = {k for k in left if k.split(SEP, 1)[0] in named}
    return {k.split(SEP, 1)[0].decode("utf-8", "surrogateescape") for k in left}, \
        sorted({name for name, _req in c.missing})
