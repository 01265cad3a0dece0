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
* **Libraries a package loads before its extensions** (:data:`PACKAGE_LOADS`, each verified in
  the real image by the package's own loader): ``import tvm_ffi`` loads
  ``tvm_ffi/lib/libtvm_ffi.so`` ``RTLD_GLOBAL`` (``tvm_ffi/__init__.py``) before xgrammar's
  bindings; CuTe DSL's ``cute.runtime.load_module`` loads ``libcute_dsl_runtime.so``
  (``ctypes.CDLL``) before the module tokenspeed-mla ships; ``import transformer_engine``
  (``transformer_engine/common/__init__.py``) loads, each ``RTLD_GLOBAL``, every cuDNN
  library, NVRTC, cuRAND, cuBLAS(Lt) and the CUDA runtime from the nvidia wheels, then its core
  ``libtransformer_engine.so``, before its torch extension (whose ``nvte_*`` symbols the core
  library defines). A load names globs tried in order, as TE's loader does; every file of the
  first that matches is loaded.
* **Alternatives** (:data:`ALTERNATIVES`): files of which a package loads one, chosen at run
  time; only the one(s) this image takes must load, the others are named as not taken.
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
from typing import Callable

PRELOAD_FUNCTION = "_preload_cuda_deps"
PRELOAD_LIST = "cuda_libs"
PRELOAD_ONE = "_preload_cuda_lib"


def torch_preload_list(init_py: str) -> list[tuple[str, str, bool]]:
    """(folder, glob, required) in the order torch preloads them, read from ``init_py``
    (``torch/__init__.py``); [] when it has no such function (a CPU-only or older torch)."""
    try:
        with open(init_py, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return []
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
               and n.name == PRELOAD_FUNCTION), None)
    if fn is None:
        return []
    out: list[tuple[str, str, bool]] = []
    for node in ast.walk(fn):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.List):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == PRELOAD_LIST for t in targets):
                out += [(e.elts[0].value, e.elts[1].value, True) for e in node.value.elts
                        if isinstance(e, ast.Tuple) and len(e.elts) == 2
                        and all(isinstance(x, ast.Constant) and isinstance(x.value, str)
                                for x in e.elts)]
    for node in ast.walk(fn):  # the optional ones, called after the list's loop
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == PRELOAD_ONE and \
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


def torch_preloads(torch_dir: str, search: list[str]) -> tuple[list[str], str | None]:
    """The files torch's ``_preload_cuda_deps`` loads, in order, searching ``search`` (the
    interpreter's ``sys.path``) as torch does; and the required one it stopped at, if any
    (torch swallows that error: what came before it stays loaded)."""
    major = torch_cuda_major(torch_dir)
    out = []
    for folder, pattern, required in torch_preload_list(os.path.join(torch_dir, "__init__.py")):
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


# TransformerEngine 2.19's loader (transformer_engine/common/__init__.py): for each CUDA library,
# the first of these layouts under <purelib>/nvidia that has one, every file of it
# (``_load_cuda_library_from_python``: cu13/NAME/lib/lib*, cu13/lib/libNAME*,
# NAME/lib/lib*, cuda_NAME/lib/lib*; TE hard-codes its CUDA major, read here as cu<N>).
# A toolkit under CUDA_HOME or /usr/local/cuda would be taken first for cuDNN, NVRTC and cuRAND;
# the images ship none.
def _te_cuda(name: str) -> tuple[str, ...]:
    so = ".so.*[0-9]"
    return (f"nvidia/cu[0-9]*/{name}/lib/lib*{so}", f"nvidia/cu[0-9]*/lib/lib{name}*{so}",
            f"nvidia/{name}/lib/lib*{so}", f"nvidia/cuda_{name}/lib/lib*{so}")


# cudnn, nvrtc, curand (_load_cuda_library); then, without a toolkit's nvrtc and curand, cublas,
# cudart and cudnn again (strict); then the core library, RTLD_GLOBAL | RTLD_LAZY.
TE_CORE = "transformer_engine/wheel_lib/libtransformer_engine.so"
TE_CUDA_LOADS: tuple[tuple[tuple[str, ...], bool], ...] = tuple(
    (_te_cuda(n), True) for n in ("cudnn", "nvrtc", "curand", "cublas", "cudart"))

Load = tuple[str | tuple[str, ...], bool]

# consumer glob (relative to its site directory) -> (library glob relative to a site directory,
# or globs tried in order; loaded RTLD_GLOBAL) the package loads first, in order. Each was
# checked in the real image by the package's own loader (docs/abi-real-stack.md,
# docs/megatron.md).
PACKAGE_LOADS: dict[str, tuple[Load, ...]] = {
    # xgrammar/base.py imports tvm_ffi, whose __init__ loads libtvm_ffi.so RTLD_GLOBAL
    "xgrammar/*.so": (("tvm_ffi/lib/libtvm_ffi.so", True),),
    # tokenspeed_mla/fmha_binary.py: cute.runtime.load_module(..., enable_tvm_ffi=True) imports
    # tvm_ffi, CDLL-s the CuTe DSL runtime (find_runtime_libraries), then loads the module
    "tokenspeed_mla/objs/*.so": (("tvm_ffi/lib/libtvm_ffi.so", True),
                                 ("nvidia_cutlass_dsl/lib/libcute_dsl_runtime.so", False)),
    # cuda-core's tensor bridge takes the AOTI C ABI from libtorch: cuda.core._memoryview
    # (_get_tensor_bridge) CDLL-s torch._C RTLD_GLOBAL first (cuda/core/_include/aoti_shim.h)
    "cuda/core/*/_tensor_bridge*.so": (("torch/_C.*.so", True),),
    # sgl-deep-gemm: deep_gemm/__init__.py imports tvm_ffi (libtvm_ffi.so RTLD_GLOBAL) before
    # its _C module (checked by dlopen in the real cuda-x86_64-sglang image:
    # docs/acceptance-sglang.md)
    "deep_gemm/_C*.so": (("tvm_ffi/lib/libtvm_ffi.so", True),),
    # scipy's auditwheel-vendored libgfortran has no RUNPATH: it is only ever loaded as a
    # dependency of scipy's Fortran extensions (interpolate/_fitpack, linalg/_fblas ...), whose
    # RPATH reaches scipy.libs/ and brings its sibling libquadmath into the same load (each of
    # them dlopen-s in the real image: docs/acceptance-sglang.md)
    "scipy.libs/libgfortran-*.so*": (("scipy.libs/libquadmath-*.so*", False),),
    # TransformerEngine: its core library after the CUDA libraries its loader opens; its torch
    # extension (load_framework_extension) after both
    TE_CORE: TE_CUDA_LOADS,
    "transformer_engine/wheel_lib/transformer_engine_torch*.so": (*TE_CUDA_LOADS,
                                                                   (TE_CORE, True)),
}


def _first_match(lib: str | tuple[str, ...], roots: list[str]) -> list[str]:
    """Every file of the first glob (of ``lib``'s, in order) that matches under a root."""
    for pattern in (lib,) if isinstance(lib, str) else lib:
        for r in roots:
            found = [p for p in sorted(glob.glob(os.path.join(r, pattern))) if os.path.isfile(p)]
            if found:
                return found
    return []


def package_loads(rel: str, roots: list[str]) -> list[tuple[str, bool]]:
    """What the package of ``rel`` loads before it (realpaths that exist, global flag)."""
    out = []
    for pattern, loads in PACKAGE_LOADS.items():
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
    # the variants this image takes (from torch's version); None: the first that loads
    pick: Callable[[str | None], set[str]] | None = None


def _torch_variant(torch_dir: str | None) -> set[str]:
    ver = torch_version(torch_dir) if torch_dir else None
    return {f"{ver[0]}{ver[1]}"} if ver else set()


ALTERNATIVES = (
    Alternatives("torchcodec", r"torchcodec/libtorchcodec_(?:core|custom_ops)(?P<v>\d+)\.so",
                 "one per FFmpeg major version; torchcodec tries 9, 8, 7, 6, 5, 4 and keeps the "
                 "first that loads (torchcodec/_internally_replaced_utils.py)"),
    Alternatives("torch-c-dlpack-ext",
                 r"torch_c_dlpack_ext/libtorch_c_dlpack_addon_torch(?P<v>\d+)-(?:cpu|cuda)\.so",
                 "one per torch minor; torch_c_dlpack_ext/core.py loads the one for the "
                 "installed torch and raises ImportError without one, which tvm_ffi catches",
                 _torch_variant),
    Alternatives("numba", r"numba/np/ufunc/(?P<v>tbbpool|omppool|workqueue)\.[^/]*so",
                 "numba's threading layers; it takes the first that loads (tbb, omp, "
                 "workqueue) unless NUMBA_THREADING_LAYER names one"),
)


def alternative(rel: str) -> tuple[Alternatives, str] | None:
    """The alternatives entry ``rel`` belongs to and its variant."""
    for alt in ALTERNATIVES:
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
