"""What the image's packages load themselves, which the ABI phase must know to judge a shared
object as the process will meet it (stdlib only):

* **torch's CUDA preloads.** ``import torch`` loads ``libtorch_global_deps.so``
  (``RTLD_GLOBAL``); when that brought in ``libcudart``, ``_load_global_deps`` then
  ``ctypes.CDLL``-s (``RTLD_LOCAL``) each library of ``_preload_cuda_deps``'s ``cuda_libs``
  list, the first match of ``nvidia/<folder>/lib/<glob>``, ``nvidia/cu<major>/lib/<glob>`` or
  ``<folder>/lib/<glob>`` along ``sys.path``, stopping at the first required one it cannot find
  (torch 2.11: cuBLASLt, cuBLAS, cuDNN, NVRTC, …, cuFile, then nvToolsExt if present). An
  extension naming ``libnvrtc.so.13`` without a search path gets that loaded copy. The list is
  read from the image's own ``torch/__init__.py`` (``ast``), not copied here.
* **Libraries a package loads before its extensions** (:attr:`Rules.loads`): a library a
  package's own loader opens (``RTLD_GLOBAL`` or not) before one of its shared objects, e.g.
  a runtime library its Python package loads before importing its bindings. A load names globs
  tried in order; every file of the first that matches is loaded.
* **Alternatives** (:attr:`Rules.alternatives`): files of which a package loads one, chosen at
  run time; only the one(s) this image takes must load, the others are named as not taken.

The facts (which package loads what, torch's preload function's names, which files are
alternatives and how each is picked) are reviewed data in the build's catalogue
(``builder/catalog/packages.yaml``), carried into the image manifest's ``abi_loader`` section
by the build; this module keeps the loader's mechanics (globs, matching, picking strategies
by name: :data:`PICKS`). A manifest without the section (an older image, a foreign one) gives
:data:`NO_RULES`: nothing a package loads itself is modelled, and the phase says so.
* **Files for another interpreter**: ``X.cpython-313-x86_64-linux-gnu.so`` is never imported by
  a Python 3.11 (its ``EXT_SUFFIX`` differs): not loadable here, reported, never checked.
"""

from __future__ import annotations

import ast
import fnmatch
import glob
import os
import re
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Preload:
    """The names of torch's CUDA preloading in ``torch/__init__.py``: the function, the list
    of (folder, glob) it walks, and the function it calls for each optional one."""

    function: str
    list: str
    one: str


def torch_preload_list(init_py: str, names: Preload | None) -> list[tuple[str, str, bool]]:
    """(folder, glob, required) in the order torch preloads them, read from ``init_py``
    (``torch/__init__.py``); [] when it has no such function (a CPU-only or older torch) or
    no names are known."""
    if names is None:
        return []
    try:
        with open(init_py, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return []
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
               and n.name == names.function), None)
    if fn is None:
        return []
    out: list[tuple[str, str, bool]] = []
    for node in ast.walk(fn):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.List):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == names.list for t in targets):
                out += [(e.elts[0].value, e.elts[1].value, True) for e in node.value.elts
                        if isinstance(e, ast.Tuple) and len(e.elts) == 2
                        and all(isinstance(x, ast.Constant) and isinstance(x.value, str)
                                for x in e.elts)]
    for node in ast.walk(fn):  # the optional ones, called after the list's loop
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == names.one and \
                len(node.args) == 2 and all(isinstance(a, ast.Constant) for a in node.args):
            required = next((bool(k.value.value) for k in node.keywords
                             if k.arg == "required" and isinstance(k.value, ast.Constant)), True)
            out.append((node.args[0].value, node.args[1].value, required))
    return out


def _version_py(torch_dir: str, name: str, value: str) -> re.Match[str] | None:
    """``name = "value..."`` in ``torch/version.py`` (read, not imported), ``value`` a regular
    expression for the start of the string."""
    try:
        with open(os.path.join(torch_dir, "version.py"), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    return re.search(rf"^{name}\s*(?::[^=]*)?=\s*['\"]{value}", text, re.M)


def torch_cuda_major(torch_dir: str) -> str | None:
    """The CUDA major torch was built for, from ``torch/version.py`` (not imported)."""
    m = _version_py(torch_dir, "cuda", r"(\d+)\.")
    return m.group(1) if m else None


def torch_version(torch_dir: str) -> tuple[int, int] | None:
    """torch's (major, minor) from ``torch/version.py``."""
    m = _version_py(torch_dir, "__version__", r"(\d+)\.(\d+)")
    return (int(m.group(1)), int(m.group(2))) if m else None


def torch_preloads(torch_dir: str, search: list[str],
                   names: Preload | None) -> tuple[list[str], str | None]:
    """The files torch's ``_preload_cuda_deps`` loads, in order, searching ``search`` (the
    interpreter's ``sys.path``) as torch does; and the required one it stopped at, if any
    (torch swallows that error: what came before it stays loaded)."""
    major = torch_cuda_major(torch_dir)
    out = []
    for folder, pattern, required in torch_preload_list(os.path.join(torch_dir, "__init__.py"),
                                                          names):
        found = None
        for path in search:
            cands = sorted(glob.glob(os.path.join(path, "nvidia", folder, "lib", pattern)))
            if major:
                cands += sorted(glob.glob(os.path.join(path, "nvidia", f"cu{major}", "lib",
                                                       pattern)))
            cands += sorted(glob.glob(os.path.join(path, folder, "lib", pattern)))
            if cands:
                found = cands[0]
                break
        if found:
            out.append(os.path.realpath(found))
        elif required:
            return out, pattern
    return out, None


# A library loaded first: globs tried in order (every file of the first that matches), and
# whether it is loaded RTLD_GLOBAL.
Load = tuple[tuple[str, ...], bool]


def _first_match(lib: tuple[str, ...], roots: list[str]) -> list[str]:
    """Every file of the first glob (of ``lib``'s, in order) that matches under a root."""
    for pattern in lib:
        for r in roots:
            found = [p for p in sorted(glob.glob(os.path.join(r, pattern))) if os.path.isfile(p)]
            if found:
                return found
    return []


def package_loads(rel: str, roots: list[str], rules: Rules) -> list[tuple[str, bool]]:
    """What the package of ``rel`` loads before it (realpaths that exist, global flag)."""
    out: list[tuple[str, bool]] = []
    for pattern, loads in rules.loads:
        if not fnmatch.fnmatchcase(rel, pattern):
            continue
        for lib, global_ in loads:
            for path in _first_match(lib, roots):
                real = os.path.realpath(path)
                if (real, global_) not in out:
                    out.append((real, global_))
    return out


@dataclass(frozen=True)
class Alternatives:
    """Files of one package of which it loads one set at run time (``v``: the variant)."""

    package: str
    pattern: str  # regex on the path relative to the site directory, group ``v``
    how: str  # how the package picks, for the report
    # the strategy (:data:`PICKS`) naming the variants this image takes; None: the first
    # that loads
    pick: str | None = None


def _torch_variant(torch_dir: str | None) -> set[str]:
    ver = torch_version(torch_dir) if torch_dir else None
    return {f"{ver[0]}{ver[1]}"} if ver else set()


# How a package picks its variant, by the name the catalogue gives it: torch_dir -> variants.
PICKS: dict[str, Callable[[str | None], set[str]]] = {"torch-minor": _torch_variant}


def picked(alt: Alternatives, torch_dir: str | None) -> set[str] | None:
    """The variants ``alt``'s strategy takes here; None when it takes the first that loads
    (also for a strategy this self-test does not know: the safe reading)."""
    fn = PICKS.get(alt.pick) if alt.pick else None
    return fn(torch_dir) if fn else None


@dataclass(frozen=True)
class Rules:
    """The manifest's ``abi_loader`` section, read: what the image's packages load."""

    loads: tuple[tuple[str, tuple[Load, ...]], ...] = ()
    alternatives: tuple[Alternatives, ...] = ()
    preload: Preload | None = None
    present: bool = False  # the manifest carried the section


NO_RULES = Rules()


def _load(entry: Any) -> Load:
    lib = entry.get("lib") if isinstance(entry, dict) else None
    globs = (lib,) if isinstance(lib, str) else tuple(str(x) for x in lib or ())
    return globs, bool(entry.get("global")) if isinstance(entry, dict) else False


def _regex(pattern: Any) -> bool:
    if not isinstance(pattern, str):
        return False
    try:
        return "v" in re.compile(pattern).groupindex
    except re.error:
        return False


def rules(manifest: dict[str, Any]) -> Rules:
    """The loader rules a manifest carries (:data:`NO_RULES` without an ``abi_loader``
    section); malformed entries are left out."""
    section = manifest.get("abi_loader")
    if not isinstance(section, dict):
        return NO_RULES
    loads = tuple((str(pattern), tuple(l for l in map(_load, libs) if l[0]))
                  for pattern, libs in (section.get("loads") or {}).items()
                  if isinstance(libs, list))
    alts = tuple(Alternatives(str(a.get("package", "")), a["pattern"], str(a.get("how", "")),
                              a.get("pick"))
                 for a in section.get("alternatives") or ()
                 if isinstance(a, dict) and _regex(a.get("pattern")))
    p = section.get("preload")
    preload = Preload(p["function"], p["list"], p["one"]) if isinstance(p, dict) and all(
        isinstance(p.get(k), str) for k in ("function", "list", "one")) else None
    return Rules(loads, alts, preload, present=True)


def alternative(rel: str, rules: Rules) -> tuple[Alternatives, str] | None:
    """The alternatives entry ``rel`` belongs to and its variant."""
    for alt in rules.alternatives:
        m = re.fullmatch(alt.pattern, rel)
        if m:
            return alt, m.group("v")
    return None


_TAGGED = re.compile(r"\.(cpython-\d+[a-z]*-[^./]+)\.so$")


def other_interpreter(name: str, soabi: str | None) -> str | None:
    """The ABI tag of an extension module built for another CPython than ``soabi`` (this
    interpreter's ``SOABI``, e.g. ``cpython-311-x86_64-linux-gnu``); None when it is this
    interpreter's, ``abi3`` or untagged."""
    m = _TAGGED.search(name)
    if m is None or soabi is None or m.group(1) == soabi:
        return None
    return m.group(1)
