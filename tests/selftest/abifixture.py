"""Shared objects for the ABI phase's tests, built here with the host's gcc/g++: a fake torch
(``libc10.so`` in two versions, ``libtorch_global_deps.so``, ``torch/_C``), an "extension"
built against version 1, and libraries that need versions their providers do not define.

``site(tmp, c10="v1"|"v2")`` lays out a site directory as pip would, with ``RECORD`` files:

* ``torch/lib/libc10.so`` — v1 exports ``c10::detail::torchCheckFail(...)`` and
  ``c10::Warning::warn()``; v2 only the latter (the symbol an extension built against v1 needs
  is gone, as between two torch releases);
* ``torch/_C.<tag>.so`` (``DT_NEEDED libc10.so``, ``RUNPATH $ORIGIN/lib``) and
  ``torch/lib/libtorch_global_deps.so``, so the phase loads torch first;
* ``fakeext/_C.so``: built against v1, ``DT_NEEDED libc10.so`` and no search path of its own
  (it gets torch's copy, already loaded); ``fakeext/_rp.so`` the same with
  ``RPATH $ORIGIN/../torch/lib`` (so ``ldd -r`` finds it too);
* ``fakeglibc/_C.so``: needs ``gnu_get_libc_version@GLIBC_2.99`` of ``libc.so.6`` (linked
  against a stub that defines that version); ``fakecxx/_C.so``:
  ``__cxa_fake_probe@CXXABI_1.3.99`` of ``libstdc++.so.6``;
* ``fakecuda/_C.so`` (with ``driver=True``): ``cuInit`` from ``libcuda.so.1``, which no image
  ships (the driver's).
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

TORCH_CHECK = "_ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx1112basic_stringIcSt11char_" \
              "traitsIcESaIcEEE"
TORCH_CHECK_DEMANGLED = ("c10::detail::torchCheckFail(char const*, char const*, unsigned int, "
                         "std::__cxx11::basic_string<char, std::char_traits<char>, "
                         "std::allocator<char> > const&)")

C10 = {"v1": """
#include <string>
namespace c10 { namespace detail {
void torchCheckFail(const char*, const char*, unsigned, const std::string&) {}
} struct Warning { static int warn(); }; int Warning::warn() { return 1; } }
""", "v2": """
namespace c10 { struct Warning { static int warn(); }; int Warning::warn() { return 2; } }
"""}
EXT = """
#include <string>
namespace c10 { namespace detail {
void torchCheckFail(const char*, const char*, unsigned, const std::string&);
} struct Warning { static int warn(); }; }
extern "C" int PyInit__C(void) { c10::detail::torchCheckFail("f", "x.cc", 1, "m");
                                 return c10::Warning::warn(); }
"""
# The same, using only what every torch release since 1.x exports from libc10.so
# (c10::detail::torchCheckFail with a std::string message): loads beside a real torch.
GOOD_EXT = """
#include <string>
namespace c10 { namespace detail {
void torchCheckFail(const char*, const char*, unsigned, const std::string&);
} }
extern "C" int PyInit__C(void) { c10::detail::torchCheckFail("f", "x.cc", 1, "m"); return 0; }
"""
# A torch symbol no torch release defines: an extension "built against a newer torch".
NEWER = """
namespace c10 { namespace impl { int verl_env_newer_torch_only(int); } }
extern "C" int PyInit__C(void) { return c10::impl::verl_env_newer_torch_only(1); }
"""
NEWER_STUB = "namespace c10 { namespace impl { int verl_env_newer_torch_only(int x) " \
             "{ return x; } } }\n"
NEWER_SYMBOL = "_ZN3c104impl25verl_env_newer_torch_onlyEi"
NEWER_DEMANGLED = "c10::impl::verl_env_newer_torch_only(int)"
STUB_GLIBC = "void gnu_get_libc_version(void) {}\n"
NEEDS_GLIBC = "extern void gnu_get_libc_version(void);\nint PyInit__C(void) " \
              "{ gnu_get_libc_version(); return 0; }\n"
STUB_CUDA = "int cuInit(unsigned f) { return (int)f; }\n"
NEEDS_CUDA = "extern int cuInit(unsigned);\nint PyInit__C(void) { return cuInit(0); }\n"
STUB_CXX = "void __cxa_fake_probe(void) {}\n"
NEEDS_CXX = "extern void __cxa_fake_probe(void);\nint PyInit__C(void) " \
            "{ __cxa_fake_probe(); return 0; }\n"


def compilers() -> str | None:
    """Why the fixture cannot be built here (None: gcc and g++ are there)."""
    missing = [c for c in ("gcc", "g++") if shutil.which(c) is None]
    return f"no {', '.join(missing)} on this machine" if missing else None


def _cc(tool: str, src: str, out: Path, *args: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    ext = ".cc" if tool == "g++" else ".c"
    source = out.with_name(out.name + ext)
    source.write_text(src)
    subprocess.run([tool, "-shared", "-fPIC", "-O0", "-o", str(out), str(source), *args],
                   check=True, capture_output=True, text=True)
    source.unlink()
    return out


def _stub(src: str, build: Path, soname: str, version: str) -> Path:
    """A link-time stand-in for a system library that defines ``version``."""
    script = build / f"{soname}.map"
    script.write_text(f"{version} {{ global: *; }};\n")
    d = build / f"stub-{version}"
    d.mkdir(parents=True, exist_ok=True)
    return _cc("gcc", src, d / soname, f"-Wl,-soname,{soname}",
               f"-Wl,--version-script,{script}")


def build(build_dir: Path) -> dict[str, Path]:
    """Compile every object once (into ``build_dir``)."""
    b = build_dir
    objs = {f"c10-{v}": _cc("g++", src, b / v / "libc10.so", "-Wl,-soname,libc10.so")
            for v, src in C10.items()}
    objs["global_deps"] = _cc("gcc", "int torch_global_deps_marker(void) { return 0; }\n",
                              b / "libtorch_global_deps.so")
    objs["torch_C"] = _cc("gcc", "extern int PyInit__C(void);\n"
                          "int PyInit__C(void) { return 0; }\n", b / "torch_C.so",
                          f"-L{b / 'v1'}", "-Wl,--no-as-needed", "-lc10",
                          "-Wl,--enable-new-dtags,-rpath,$ORIGIN/lib")
    objs["ext"] = _cc("g++", EXT, b / "ext" / "_C.so", f"-L{b / 'v1'}", "-lc10")
    objs["good"] = _cc("g++", GOOD_EXT, b / "good" / "_C.so", f"-L{b / 'v1'}", "-lc10")
    objs["ext_rpath"] = _cc("g++", EXT, b / "ext" / "_rp.so", f"-L{b / 'v1'}", "-lc10",
                            "-Wl,--disable-new-dtags,-rpath,$ORIGIN/../torch/lib")
    glibc = _stub(STUB_GLIBC, b, "libc.so.6", "GLIBC_2.99")
    objs["glibc"] = _cc("gcc", NEEDS_GLIBC, b / "glibc" / "_C.so", str(glibc))
    cxx = _stub(STUB_CXX, b, "libstdc++.so.6", "CXXABI_1.3.99")
    objs["cxx"] = _cc("gcc", NEEDS_CXX, b / "cxx" / "_C.so", str(cxx))
    newer = _cc("g++", NEWER_STUB, b / "newer-c10" / "libc10.so", "-Wl,-soname,libc10.so")
    objs["newer"] = _cc("g++", NEWER, b / "newer" / "_C.so", str(newer))
    cuda = b / "stub-cuda"
    _cc("gcc", STUB_CUDA, cuda / "libcuda.so.1", "-Wl,-soname,libcuda.so.1")
    objs["driver"] = _cc("gcc", NEEDS_CUDA, b / "driver" / "_C.so", str(cuda / "libcuda.so.1"))
    return objs


def site(objs: dict[str, Path], root: Path, c10: str, versioned: bool = True,
         driver: bool = False) -> Path:
    """A site directory holding the fake torch with ``libc10.so`` ``c10`` and the extensions
    (``versioned``: also the ones needing absent versions; ``driver``: ``fakecuda/_C.so``,
    which needs ``libcuda.so.1`` for ``cuInit``)."""
    tag = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    files = {"torch": {"torch/lib/libc10.so": objs[f"c10-{c10}"],
                       "torch/lib/libtorch_global_deps.so": objs["global_deps"],
                       f"torch/_C{tag}": objs["torch_C"]},
             "fakeext": {"fakeext/_C.so": objs["ext"], "fakeext/_rp.so": objs["ext_rpath"]}}
    if versioned:
        files["fakeglibc"] = {"fakeglibc/_C.so": objs["glibc"]}
        files["fakecxx"] = {"fakecxx/_C.so": objs["cxx"]}
    if driver:
        files["fakecuda"] = {"fakecuda/_C.so": objs["driver"]}
    for dist, members in files.items():
        for rel, src in members.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, root / rel)
        info = root / f"{dist}-1.0.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "RECORD").write_text("".join(f"{rel},sha256=x,1\n" for rel in members)
                                     + f"{dist}-1.0.dist-info/RECORD,,\n")
    return root


# ------------------------------------------------ what the process loads before an extension
# A CUDA torch as the real one loads: libtorch_global_deps.so needs libcudart.so.13 (found by its
# RUNPATH in nvidia/cu13/lib), so torch/__init__.py's _preload_cuda_deps loads nvrtc from there.
TORCH_INIT = '''
def _preload_cuda_deps(err=None):
    cuda_libs: list[tuple[str, str]] = [
        ("cuda_nvrtc", "libnvrtc.so.*[0-9]"),
        ("cufile", "libcufile.so.*[0-9]"),
    ]
    for lib_folder, lib_name in cuda_libs:
        _preload_cuda_lib(lib_folder, lib_name)
    _preload_cuda_lib("nvtx", "libnvToolsExt.so.*[0-9]", required=False)
'''
TORCH_VERSION = "__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\n"
NEEDS_NVRTC = "extern int nvrtcVersion(int*, int*);\nint PyInit__C(void) " \
              "{ return nvrtcVersion(0, 0); }\n"
# c10::cuda as libtorch_nvshmem.so uses it: named by torch/_C's closure, not by the object
NEEDS_C10_CUDA = "extern int c10_cuda_device_count(void);\nint nvshm_entry(void) " \
                 "{ return c10_cuda_device_count(); }\n"
NEEDS_TVM = "extern int TVMFFIGetTypeInfo(int);\nint PyInit__C(void) " \
            "{ return TVMFFIGetTypeInfo(0); }\n"
# an undefined symbol no relocation names (GCC 13's ios_base_library_init marker): never looked up
MARKER = '__asm__(".globl verl_env_marker_never_looked_up");\n' \
         "int PyInit__C(void) { return 0; }\n"
NEEDS_MISSING = "extern int libabsent_fn(void);\nint PyInit__C(void) { return libabsent_fn(); }\n"


def build_loading(b: Path) -> dict[str, Path]:
    """The objects of :func:`loading_site` (compiled once into ``b``)."""
    o: dict[str, Path] = {}
    o["cudart"] = _cc("gcc", "int cudaRuntimeGetVersion(int* v) { return 0; }\n",
                      b / "cu13" / "libcudart.so.13", "-Wl,-soname,libcudart.so.13")
    o["nvrtc"] = _cc("gcc", "int nvrtcVersion(int* a, int* b) { return 0; }\n",
                     b / "cu13" / "libnvrtc.so.13", "-Wl,-soname,libnvrtc.so.13")
    o["cufile"] = _cc("gcc", "int cuFileDriverOpen(void) { return 0; }\n",
                      b / "cu13" / "libcufile.so.0", "-Wl,-soname,libcufile.so.0")
    o["global_deps"] = _cc("gcc", "int torch_global_deps_marker(void) { return 0; }\n",
                           b / "cuda" / "libtorch_global_deps.so", f"-L{b / 'cu13'}",
                           "-Wl,--no-as-needed", "-l:libcudart.so.13",
                           "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../../nvidia/cu13/lib")
    o["c10_cuda"] = _cc("gcc", "int c10_cuda_device_count(void) { return 1; }\n",
                        b / "cuda" / "libc10_cuda.so", "-Wl,-soname,libc10_cuda.so")
    o["nvshm"] = _cc("gcc", NEEDS_C10_CUDA, b / "cuda" / "libnvshm.so", "-Wl,-soname,libnvshm.so")
    o["torch_C"] = _cc("gcc", "int PyInit__C(void) { return 0; }\n", b / "cuda" / "torch_C.so",
                       f"-L{b / 'cuda'}", "-Wl,--no-as-needed", "-lc10_cuda", "-lnvshm",
                       "-Wl,--enable-new-dtags,-rpath,$ORIGIN/lib")
    o["needs_nvrtc"] = _cc("gcc", NEEDS_NVRTC, b / "ext" / "nvrtc_ext.so", f"-L{b / 'cu13'}",
                           "-l:libnvrtc.so.13")
    o["tvm"] = _cc("gcc", "int TVMFFIGetTypeInfo(int i) { return i; }\n",
                   b / "tvm" / "libtvm_ffi.so", "-Wl,-soname,libtvm_ffi.so")
    o["needs_tvm"] = _cc("gcc", NEEDS_TVM, b / "ext" / "bindings.so", f"-L{b / 'tvm'}",
                         "-ltvm_ffi")
    o["marker"] = _cc("gcc", MARKER, b / "ext" / "marker.so")
    absent = _cc("gcc", "int libabsent_fn(void) { return 0; }\n", b / "absent" / "libabsent.so",
                 "-Wl,-soname,libabsent.so.1")
    o["needs_absent"] = _cc("gcc", NEEDS_MISSING, b / "ext" / "absent.so", str(absent))
    o["plain"] = _cc("gcc", "int PyInit__C(void) { return 0; }\n", b / "ext" / "plain.so")
    return o


def loading_site(o: dict[str, Path], root: Path, members: dict[str, dict[str, str]],
                 cuda: bool = True) -> Path:
    """A site directory with a CUDA torch (``cuda``: its global deps need libcudart, so
    torch preloads nvrtc) and ``members``: distribution -> {path in the site: object key}."""
    tag = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    torch = {"torch/lib/libtorch_global_deps.so": "global_deps" if cuda else "plain",
             "torch/lib/libc10_cuda.so": "c10_cuda", "torch/lib/libnvshm.so": "nvshm",
             f"torch/_C{tag}": "torch_C"}
    cu = {"nvidia/cu13/lib/libcudart.so.13": "cudart", "nvidia/cu13/lib/libnvrtc.so.13": "nvrtc",
          "nvidia/cu13/lib/libcufile.so.0": "cufile"}
    for dist, files in {"torch": torch, "nvidia-cu13": cu, **members}.items():
        for rel, key in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(o[key], root / rel)
        info = root / f"{dist}-1.0.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "RECORD").write_text("".join(f"{rel},sha256=x,1\n" for rel in files)
                                     + f"{dist}-1.0.dist-info/RECORD,,\n")
    (root / "torch" / "__init__.py").write_text(TORCH_INIT)
    (root / "torch" / "version.py").write_text(TORCH_VERSION)
    return root
