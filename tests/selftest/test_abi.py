"""The ABI phase (``builder/selftest/phases/abi.py``): the pure rules on synthetic data, then shared
objects compiled here (``abifixture``): an extension built against one ``libc10.so`` beside
another fails naming the distribution, the ``.so``, the demangled symbol and the library; the
same tree with the matching library passes; versions a library lacks are caught; the driver's
library is named, never failed or passed; and the loader model agrees with ``ldd -r``."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from builder.selftest.elf import abimodel, ldsearch

from builder.selftest.phases import abi
from builder.selftest.elf.elfdyn import SEP, DynInfo, read_dynamic
from builder.selftest.elf.elfread import ElfHeader
from builder.selftest.report import FAIL, PASS, SKIP

from . import abifixture as fx
from . import elfbytes
from .helpers import clean_env

HEADER = ElfHeader(True, 62, 3)
needs_cc = pytest.mark.skipif(fx.compilers() is not None, reason=str(fx.compilers()))
needs_ldd = pytest.mark.skipif(shutil.which("ldd") is None, reason="no ldd on this machine")


def info(exports: set[bytes] = frozenset(), names: set[bytes] | None = None,
         verdefs: set[str] = frozenset(), refs: set[bytes] = frozenset()) -> DynInfo:
    d = DynInfo(HEADER)
    d.exports, d.verdefs, d.refs = set(exports), set(verdefs), set(refs)
    d.names = set(names) if names is not None else {e.split(SEP)[0] for e in exports}
    return d


# ----------------------------------------------------------------------------- pure rules


def test_bind_follows_the_loaders_version_rules() -> None:
    libc = info({b"puts", b"puts\0GLIBC_2.2.5", b"old\0GLIBC_2.0"}, verdefs={"GLIBC_2.2.5"})
    plain = info({b"c10_fn"})  # defines no versions
    refs = {b"puts", b"puts\0GLIBC_2.2.5", b"puts\0GLIBC_2.99", b"old", b"old\0GLIBC_2.0",
            b"c10_fn", b"c10_fn\0V1", b"gone"}
    # a hidden (non-default) version binds only a reference to that exact version; a library
    # without versions satisfies a versioned reference by name
    assert abimodel.bind(refs, [libc, plain]) == {b"puts\0GLIBC_2.99", b"old", b"gone"}
    assert abimodel.bind(refs, []) == refs


def test_family_is_the_outer_namespace() -> None:
    assert abimodel.family(fx.TORCH_CHECK.encode()) == b"_ZN3c10"
    assert abimodel.family(b"_ZNK5torch3jit4Node4kindEv") == b"_ZNK5torch"
    assert abimodel.family(b"PyObject_GetAttr") == b"PyObject"
    assert abimodel.family(b"__cxa_throw") == b"__cxa"


def test_expected_provider_by_version_file_then_namespace() -> None:
    c10 = info({b"_ZN3c107Warning4warnEv", b"_ZN3c104impl5helpEv"})
    other = info({b"_ZN5torch1fEv"})
    ext = info(refs={fx.TORCH_CHECK.encode(), b"f\0GLIBC_2.99"})
    ext.ref_file[b"f\0GLIBC_2.99"] = "libc.so.6"
    scope = [("/t/libtorch.so", other), ("/t/libc10.so", c10), ("/x/ext.so", ext)]
    names = {"libc10.so": "/t/libc10.so", "libc.so.6": "/lib/libc.so.6"}
    assert abimodel.expected_provider(fx.TORCH_CHECK.encode(), ext, scope, names) == \
        ("libc10.so", "/t/libc10.so")
    assert abimodel.expected_provider(b"f\0GLIBC_2.99", ext, scope, names) == \
        ("libc.so.6", "/lib/libc.so.6")
    assert abimodel.expected_provider(b"zzz_q", ext, scope, names) == (None, None)


def test_ld_cache_parsing() -> None:
    strings = b"libz.so.1\0/lib/x86_64-linux-gnu/libz.so.1\0"
    head = ldsearch.NEW_MAGIC + struct.pack("<II", 1, len(strings)) + b"\0" * 20
    entry_at = len(head)
    strings_at = entry_at + 24
    data = head + struct.pack("<iIIIQ", 0x303, strings_at, strings_at + 10, 0, 0) + strings
    want = [("libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1")]
    assert ldsearch.parse_ld_cache(data) == want
    # after an old-format cache, offsets count from the new header
    assert ldsearch.parse_ld_cache(b"ld.so-1.7.0" + struct.pack("<I", 0) + data) == want
    assert ldsearch.parse_ld_cache(b"garbage") == []
    text = ("2 libs found in cache `/etc/ld.so.cache'\n"
            "\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1\n")
    assert ldsearch.parse_ldconfig_p(text) == [("libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1")]


@pytest.mark.skipif(not (os.path.isfile(ldsearch.LD_CACHE) and shutil.which("ldconfig")),
                    reason="no /etc/ld.so.cache or ldconfig here")
def test_ld_cache_reads_as_ldconfig_p_does() -> None:
    with open(ldsearch.LD_CACHE, "rb") as f:
        mine = ldsearch.parse_ld_cache(f.read())
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    assert mine and mine == ldsearch.parse_ldconfig_p(out)


def test_search_order_and_origin(tmp_path: Path) -> None:
    for d in ("rp", "env", "run", "dflt"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "libx.so").write_bytes(b"x")
    s = ldsearch.Searcher({"liby.so": [str(tmp_path / "dflt" / "libx.so")]},
                          [str(tmp_path / "env")], [str(tmp_path / "dflt")], lambda p: True)
    rp, run = [[str(tmp_path / "rp")]], [str(tmp_path / "run")]
    assert s.find("libx.so", rp, None) == str(tmp_path / "rp" / "libx.so")
    assert s.find("libx.so", rp, run) == str(tmp_path / "env" / "libx.so")  # RUNPATH: no RPATH
    s.ld_library_path = []
    assert s.find("libx.so", rp, run) == str(tmp_path / "run" / "libx.so")
    assert s.find("libx.so", [], None) == str(tmp_path / "dflt" / "libx.so")
    assert s.find("liby.so", [], None) == str(tmp_path / "dflt" / "libx.so")  # the cache
    assert s.find("libnone.so", rp, None) is None and "libnone.so" in s.tried
    assert ldsearch.expand("$ORIGIN/../lib:${ORIGIN}", "/a/b") == "/a/b/../lib:/a/b"
    assert ldsearch.env_paths("/a::/b") == ["/a", ".", "/b"]


def test_decisions_name_everything() -> None:
    ok = abi.ObjectResult("numpy", "numpy/_core/_m.so", refs=40)
    bad = abi.ObjectResult("fakeext", "fakeext/_C.so", refs=3, problems=[
        abi.Problem("fakeext/_C.so", "symbol", fx.TORCH_CHECK, expected="libc10.so",
                    expected_path="/s/torch/lib/libc10.so", demangled=fx.TORCH_CHECK_DEMANGLED),
        abi.Problem("fakeext/_C.so", "missing", "libfoo.so.2")])
    c = abi.decide_dist("fakeext", [bad])
    assert c.status == FAIL and c.required
    assert c.reason == (f"fakeext: fakeext/_C.so: undefined symbol {fx.TORCH_CHECK_DEMANGLED} "
                        f"[{fx.TORCH_CHECK}], expected from libc10.so (/s/torch/lib/libc10.so); "
                        "fakeext/_C.so: needs libfoo.so.2, which the loader cannot find")
    p = abi.decide_dist("numpy", [ok])
    assert p.status == PASS and "40 undefined symbols" in p.reason
    unread = abi.ObjectResult("x", "x/a.so", problems=[abi.Problem("x/a.so", "unreadable", "e")])
    s = abi.decide_dist("x", [unread])
    assert s.status == SKIP and s.required
    assert abi.decide_driver([ok]) is None
    drv = abi.ObjectResult("torch", "torch/lib/libtorch_cuda.so", driver={"libcuda.so.1": 2})
    d = abi.decide_driver([drv, ok])
    assert d is not None and d.status == SKIP and not d.required and not d.applies
    assert d.reason == ("resolved at run time by the driver: libcuda.so.1 (needed by "
                        "torch/lib/libtorch_cuda.so)")


def test_driver_owes_only_its_symbols() -> None:
    ext = info(refs={b"cuInit", b"_ZN3c104warnEv"})
    assert abi.driver_owes(b"cuInit", ["libcuda.so.1"], ext) == "libcuda.so.1"
    assert abi.driver_owes(b"_ZN3c104warnEv", ["libcuda.so.1"], ext) is None
    assert abi.driver_owes(b"cuInit", [], ext) is None


# ----------------------------------------------------------------- compiled here (gcc/g++)


@pytest.fixture(scope="module")
def objs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if fx.compilers():
        pytest.skip(str(fx.compilers()))
    return fx.build(tmp_path_factory.mktemp("abi-build"))


def by_id(checks: list) -> dict:
    return {c.id: c for c in checks}


def phase(root: Path, accelerator: str = "cpu") -> dict:
    run = abi.Run({"manifest": {"accelerator": accelerator}, "options": {}})
    return by_id(abi.check_abi(run, [str(root)]))


@needs_cc
def test_extension_built_against_another_torch_fails(objs: dict[str, Path],
                                                     tmp_path: Path) -> None:
    checks = phase(fx.site(objs, tmp_path, "v2", versioned=False))
    c = checks["abi.fakeext"]
    assert c.status == FAIL and c.required
    lib = f"({tmp_path / 'torch' / 'lib' / 'libc10.so'})"
    demangled = fx.TORCH_CHECK_DEMANGLED if shutil.which("c++filt") else fx.TORCH_CHECK
    for so in ("fakeext/_C.so", "fakeext/_rp.so"):
        assert f"{so}: undefined symbol {demangled}" in c.reason
    assert c.reason.startswith("fakeext: ") and f"expected from libc10.so {lib}" in c.reason
    assert [p["what"] for p in c.value["problems"]] == [fx.TORCH_CHECK] * 2
    assert checks["abi.torch"].status == PASS and checks["abi.scan"].status == PASS
    assert "torch loaded first" in checks["abi.scan"].reason


@needs_cc
def test_a_gpu_familys_finding_fails_too(objs: dict[str, Path], tmp_path: Path) -> None:
    """The phase blocks on every family: on cuda and rocm the same finding fails, as on cpu
    (it was advisory there until the real cuda-x86_64 stack passed: docs/abi-real-stack.md)."""
    assert not hasattr(abi, "ADVISORY")
    for acc in ("cuda", "rocm"):
        c = phase(fx.site(objs, tmp_path / acc, "v2", versioned=False), acc)["abi.fakeext"]
        assert c.status == FAIL and c.required
        assert c.reason.startswith("fakeext: fakeext/_C.so: undefined symbol ")


@needs_cc
def test_the_same_tree_with_the_matching_torch_passes(objs: dict[str, Path],
                                                      tmp_path: Path) -> None:
    checks = phase(fx.site(objs, tmp_path, "v1", versioned=False))
    assert {i: c.status for i, c in checks.items()} == \
        {"abi.scan": PASS, "abi.fakeext": PASS, "abi.torch": PASS}
    v = checks["abi.scan"].value
    assert v["objects"] == 5 and v["loader"]["torch_local"] and v["loader"]["torch_global"]


@needs_cc
def test_extension_without_libc10_needed_or_torch_fails(objs: dict[str, Path],
                                                        tmp_path: Path) -> None:
    """Without torch in the tree neither extension finds libc10.so (``_C.so`` has no search
    path, ``_rp.so``'s RPATH names the missing torch/lib)."""
    root = fx.site(objs, tmp_path, "v1", versioned=False)
    shutil.rmtree(root / "torch")
    c = phase(root)["abi.fakeext"]
    assert c.status == FAIL
    for so in ("_C", "_rp"):
        assert f"fakeext/{so}.so: needs libc10.so, which the loader cannot find" in c.reason


@needs_cc
def test_absent_versions_are_caught(objs: dict[str, Path], tmp_path: Path) -> None:
    checks = phase(fx.site(objs, tmp_path, "v1"))
    g, x = checks["abi.fakeglibc"], checks["abi.fakecxx"]
    assert g.status == FAIL and x.status == FAIL
    assert "fakeglibc/_C.so: version GLIBC_2.99 of libc.so.6 not found" in g.reason
    assert "undefined symbol gnu_get_libc_version@GLIBC_2.99, expected from libc.so.6" in g.reason
    assert "fakecxx/_C.so: version CXXABI_1.3.99 of libstdc++.so.6 not found" in x.reason
    assert "__cxa_fake_probe@CXXABI_1.3.99, expected from libstdc++.so.6" in x.reason


@needs_cc
def test_the_drivers_library_is_named_never_passed(objs: dict[str, Path],
                                                   tmp_path: Path) -> None:
    root = fx.site(objs, tmp_path, "v1", versioned=False, driver=True)
    checks = phase(root, "cuda")
    d = checks["abi.driver"]
    assert d.status == SKIP and not d.applies
    assert d.reason == ("resolved at run time by the driver: libcuda.so.1 (needed by "
                        "fakecuda/_C.so)")
    assert checks["abi.fakecuda"].status == PASS
    cpu = phase(root, "cpu")  # no driver on a cpu target: the library is simply missing
    assert "abi.driver" not in cpu and cpu["abi.fakecuda"].status == FAIL
    assert "needs libcuda.so.1, which the loader cannot find" in cpu["abi.fakecuda"].reason


# ------------------------------------------------------------------- agreement with ldd -r


def ldd_r(path: str) -> tuple[set[str], set[str]]:
    """(undefined symbol names of ``path`` itself, libraries not found) as ``ldd -r`` says."""
    proc = subprocess.run(["ldd", "-r", path], capture_output=True, text=True, timeout=120)
    syms, missing = set(), set()
    for line in (proc.stdout + proc.stderr).splitlines():
        m = re.match(r"\s*undefined symbol: ([^,\s]+)(?:, version \S+)?\s+\((.*)\)$", line)
        if m and os.path.realpath(m.group(2)) == os.path.realpath(path):
            syms.add(m.group(1))
        m = re.match(r"\s*(\S+) => not found", line)
        if m:
            missing.add(m.group(1))
    return syms, missing


def alone(paths: list[str]) -> dict[str, tuple[set[str], set[str]]]:
    proc, _src = abi.make_process(sys.executable, [], {})
    out = {}
    for p in paths:
        syms, missing = abimodel.unbound_alone(proc, os.path.realpath(p))
        out[p] = (syms, set(missing))
    return out


@needs_cc
@needs_ldd
def test_agrees_with_ldd_r_on_the_fixture(objs: dict[str, Path], tmp_path: Path) -> None:
    root = fx.site(objs, tmp_path, "v2", driver=True)
    paths = sorted(str(p) for p in root.rglob("*.so"))
    mine = alone(paths)
    theirs = {p: ldd_r(p) for p in paths}
    assert mine == theirs
    assert theirs[str(root / "fakeext" / "_rp.so")][0] == {fx.TORCH_CHECK}
    assert theirs[str(root / "fakeext" / "_C.so")][1] == {"libc10.so"}
    assert theirs[str(root / "fakeglibc" / "_C.so")][0] == {"gnu_get_libc_version"}


@needs_ldd
def test_agrees_with_ldd_r_on_real_libraries(hostpy: str) -> None:
    """The host venv's compiled modules (numpy, torch, Ray, …): the same unresolved symbols
    (the interpreter's, since ``ldd`` loads no python) and missing libraries as ``ldd -r``."""
    site = subprocess.run([hostpy, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['platlib'])"], capture_output=True, text=True, check=True)
    root = site.stdout.strip()
    paths = sorted(p for p in abi.shared_objects(root))
    assert len(paths) >= 20, paths
    mine = alone(paths)
    differ = {p for p in paths if mine[p] != ldd_r(p)}
    assert not differ, {p: (mine[p], ldd_r(p)) for p in sorted(differ)[:3]}
    assert sum(1 for s, _m in mine.values() if s) >= 5  # not vacuous: Py* symbols unbound


# --------------------------------------------------------------------- through the CLI


@needs_cc
def test_cli_phase_fails_then_passes(objs: dict[str, Path], st_path: Path,
                                     tmp_path: Path) -> None:
    m = tmp_path / "manifest.json"
    m.write_text(json.dumps({"schema": "verl-env/manifest/v1", "target": "fx",
                             "accelerator": "cpu", "arch": "x86_64"}))
    for c10, rc_want in (("v2", 1), ("v1", 0)):
        root = fx.site(objs, tmp_path / c10, c10, versioned=False)
        report = tmp_path / f"{c10}.json"
        proc = subprocess.run([sys.executable, "-m", "verl_env_selftest", "--phases", "abi",
                               "--abi-root", str(root), "--manifest", str(m), "--json",
                               str(report), "--expect-gpus", "0"], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path,
                              env=clean_env(PYTHONPATH=str(st_path)))
        out = proc.stdout + proc.stderr
        assert proc.returncode == rc_want, out
        checks = {c["id"]: c for c in json.loads(report.read_text())["checks"]}
        assert checks["abi.fakeext"]["status"] == ("fail" if rc_want else "pass"), out
    assert "FAIL   * abi.fakeext" not in out and "PASS   * abi.fakeext" in out


def test_real_host_venv_resolves_everything(hostpy: str, st_path: Path,
                                            tmp_path: Path) -> None:
    """The phase for real in the host venv's interpreter (torch CPU): nothing unresolved."""
    m = tmp_path / "manifest.json"
    m.write_text(json.dumps({"schema": "verl-env/manifest/v1", "target": "host",
                             "accelerator": "cpu", "arch": "x86_64"}))
    report = tmp_path / "r.json"
    proc = subprocess.run([hostpy, "-m", "verl_env_selftest", "--phases", "abi", "--manifest",
                           str(m), "--json", str(report), "--expect-gpus", "0"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=clean_env(PYTHONPATH=str(st_path)))
    out = proc.stdout + proc.stderr
    rep = json.loads(report.read_text())
    scan = next(c for c in rep["checks"] if c["id"] == "abi.scan")
    print(f"\nabi phase on the host venv: {scan['reason']}")
    assert proc.returncode == 0 and rep["overall"] == "pass", out
    assert scan["value"]["objects"] >= 20 and scan["value"]["loader"]["torch_local"]
    assert not [c for c in rep["checks"] if c["status"] == "fail"]


def test_reads_a_real_library() -> None:
    libc = read_dynamic(os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")) \
        if os.path.exists("/lib/x86_64-linux-gnu/libc.so.6") else None
    if libc is None:
        pytest.skip("no x86-64 glibc at /lib/x86_64-linux-gnu here")
    assert libc.soname == "libc.so.6" and "GLIBC_2.2.5" in libc.verdefs
    assert b"puts" in libc.exports and b"puts\0GLIBC_2.2.5" in libc.exports


DLOPEN = r"""
import ctypes, json, os, sys
sys.path.insert(0, sys.argv[1])
from verl_env_selftest.phases.coverage import shared_objects, site_dirs
import torch  # noqa: F401 - extensions load after torch, as in a training job
failed, n = [], 0
for root in site_dirs():
    for p in shared_objects(root):
        n += 1
        try:
            ctypes.CDLL(p, mode=os.RTLD_NOW)
        except OSError as e:
            failed.append(str(e))
print(json.dumps({"files": n, "failed": failed}))
"""


def test_every_host_venv_library_really_loads(hostpy: str, st_path: Path) -> None:
    """What the phase passes (``test_real_host_venv_resolves_everything``) really loads:
    ``dlopen(RTLD_NOW)`` of every shared object of the host venv after ``import torch``.

    One exception, which is not a symbol matter and which the phase does not judge: Ray's
    ``libjemalloc.so`` uses initial-exec TLS ("cannot allocate memory in static TLS block"
    when ``dlopen``-ed late); Ray only ever ``LD_PRELOAD``-s it into its own daemons."""
    proc = subprocess.run([hostpy, "-c", DLOPEN, str(st_path)], capture_output=True,
                          text=True, timeout=300, env=clean_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    failed = [f for f in res["failed"]
              if not (f.endswith("cannot allocate memory in static TLS block")
                      and "/ray/core/libjemalloc.so" in f)]
    assert res["files"] >= 20 and failed == [], res


@needs_cc
def test_a_truncated_library_is_a_required_skip(objs: dict[str, Path], tmp_path: Path) -> None:
    root = fx.site(objs, tmp_path, "v1", versioned=False)
    so = root / "fakeext" / "_C.so"
    data = so.read_bytes()
    so.write_bytes(data[:64] + b"\0" * 16)  # the header stays, the section table is gone
    c = phase(root)["abi.fakeext"]
    assert c.status == SKIP and c.required and "fakeext/_C.so: cannot be read" in c.reason


@needs_cc
def test_a_library_for_another_machine_is_counted_not_loaded(objs: dict[str, Path],
                                                             tmp_path: Path) -> None:
    root = fx.site(objs, tmp_path, "v1", versioned=False)
    (root / "fakeext" / "_arm.so").write_bytes(elfbytes.elf({".text": b"\0" * 8}, cls64=False))
    checks = phase(root)
    scan = checks["abi.scan"]
    assert scan.value["foreign"] == ["fakeext/_arm.so"] and scan.value["elf_files"] == 6
    assert "1 not loadable here" in scan.reason and checks["abi.fakeext"].status == PASS
