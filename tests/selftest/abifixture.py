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
# A torch symbol no torch release defines: an extension "built against a newer torch".
NEWER = """
namespace c10 { namespace impl { int verl_env_newer_torch_only(int); } }
extern "C" int PyInit__C(void) { return c10::impl::verl_env_newer_torch_only(1); }
"""
NEWER_STUB = "namespace c10 { namespace impl { int verl_env_newer_torch_only(int x) " \
             "{ return x; } } }\n"
NEWER_SYMBOL = "_ZN3c104impl25verl_env_newer_torch_onlyEi"
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
