"""The ABI phase's model of what the process loads before an extension, each on objects
compiled here (``abifixture.build_loading``) or on synthetic text, each found on the real
cuda-x86_64 stack (docs/abi-real-stack.md): torch's CUDA preloads, the scope of the load that
brought an object in, libraries a package loads itself first, alternatives a package chooses
between, modules for another interpreter, undefined symbols no relocation names, and the
matrix's reviewed ``abi_allow``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from builder import catalog, shipped
from builder.selftest.elf import abiload, abimodel
from builder.selftest.manifest import PAYLOAD_LOADER_RULES

from builder.selftest.phases import abi
from builder.selftest.report import FAIL, PASS

from . import abifixture as fx
from .helpers import catalog_manifest, loader_rules

PRELOAD = loader_rules().preload

needs_cc = pytest.mark.skipif(fx.compilers() is not None, reason=str(fx.compilers()))
EXT = {"ext": {"ext/_C.so": "needs_nvrtc"}}


@pytest.fixture(scope="module")
def objs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if fx.compilers():
        pytest.skip(str(fx.compilers()))
    return fx.build_loading(tmp_path_factory.mktemp("abi-loading"))


def phase(root: Path, allow: dict[str, str] | None = None, accelerator: str = "cuda") -> dict:
    run = abi.Run({"manifest": {"accelerator": accelerator, "abi_allow": allow or {},
                                "abi_loader": catalog_manifest()["abi_loader"]},
                   "options": {}})
    return {c.id: c for c in abi.check_abi(run, [str(root)])}


# ---------------------------------------------------------------- torch's CUDA preloads


def test_the_preload_list_is_read_from_torchs_own_source(tmp_path: Path) -> None:
    init = tmp_path / "__init__.py"
    init.write_text(fx.TORCH_INIT)
    assert abiload.torch_preload_list(str(init), PRELOAD) == [
        ("cuda_nvrtc", "libnvrtc.so.*[0-9]", True), ("cufile", "libcufile.so.*[0-9]", True),
        ("nvtx", "libnvToolsExt.so.*[0-9]", False)]
    (tmp_path / "version.py").write_text(fx.TORCH_VERSION)
    assert abiload.torch_cuda_major(str(tmp_path)) == "13"
    assert abiload.torch_version(str(tmp_path)) == (2, 11)
    init.write_text("def other():\n    pass\n")
    assert abiload.torch_preload_list(str(init), PRELOAD) == []


def test_preloads_are_searched_as_torch_does_and_stop_at_a_missing_required_one(
        tmp_path: Path) -> None:
    torch = tmp_path / "site" / "torch"
    torch.mkdir(parents=True)
    (torch / "__init__.py").write_text(fx.TORCH_INIT)
    (torch / "version.py").write_text(fx.TORCH_VERSION)
    lib = tmp_path / "site" / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnvrtc.so.13").write_bytes(b"x")
    # nvrtc from nvidia/cu13/lib, then cufile is required and absent: torch stops there
    assert abiload.torch_preloads(str(torch), [str(tmp_path / "site")], PRELOAD) == \
        ([str(lib / "libnvrtc.so.13")], "libcufile.so.*[0-9]")
    (lib / "libcufile.so.0").write_bytes(b"x")
    assert abiload.torch_preloads(str(torch), [str(tmp_path / "site")], PRELOAD) == \
        ([str(lib / "libnvrtc.so.13"), str(lib / "libcufile.so.0")], None)


@needs_cc
def test_an_extension_gets_the_nvrtc_torch_preloaded(objs: dict[str, Path],
                                                     tmp_path: Path) -> None:
    """vLLM's and torchcodec's extensions name libnvrtc.so.13 with no search path: the copy
    torch preloaded from nvidia/cu13/lib (because its global deps brought in libcudart)."""
    checks = phase(fx.loading_site(objs, tmp_path / "cuda", EXT))
    assert checks["abi.ext"].status == PASS, checks["abi.ext"].reason
    loader = checks["abi.scan"].value["loader"]
    assert loader["torch_preloaded"] == ["libnvrtc.so.13", "libcufile.so.0"]
    assert "with 2 CUDA libraries it preloads" in checks["abi.scan"].reason
    # a torch whose global deps do not bring in libcudart preloads nothing
    cpu = phase(fx.loading_site(objs, tmp_path / "cpu", EXT, cuda=False))
    assert cpu["abi.ext"].status == FAIL
    assert "ext/_C.so: needs libnvrtc.so.13, which the loader cannot find" in \
        cpu["abi.ext"].reason


@needs_cc
def test_an_object_torch_loaded_is_judged_in_that_loads_scope(objs: dict[str, Path],
                                                              tmp_path: Path) -> None:
    """libtorch_nvshmem.so uses c10::cuda without naming libc10_cuda.so: torch._C's load
    brings both in, so the loader bound it in that scope. The same object loaded alone fails."""
    root = fx.loading_site(objs, tmp_path / "t", {"alone": {"alone/libnvshm.so": "nvshm"}})
    checks = phase(root)
    assert checks["abi.torch"].status == PASS, checks["abi.torch"].reason
    assert checks["abi.alone"].status == FAIL
    assert "alone/libnvshm.so: undefined symbol c10_cuda_device_count" in \
        checks["abi.alone"].reason


# ------------------------------------------------------------- what a package loads first


@needs_cc
def test_a_library_the_package_loads_first_is_in_scope(objs: dict[str, Path],
                                                       tmp_path: Path) -> None:
    """xgrammar's bindings name libtvm_ffi.so, which ``import tvm_ffi`` loads RTLD_GLOBAL
    from its own wheel first (the catalogue's abi loads, carried by the manifest); without
    tvm_ffi they fail."""
    members = {"xgrammar": {"xgrammar/libxgrammar_bindings.so": "needs_tvm"},
               "apache-tvm-ffi": {"tvm_ffi/lib/libtvm_ffi.so": "tvm"}}
    assert phase(fx.loading_site(objs, tmp_path / "a", members))["abi.xgrammar"].status == PASS
    del members["apache-tvm-ffi"]
    c = phase(fx.loading_site(objs, tmp_path / "b", members))["abi.xgrammar"]
    assert c.status == FAIL and "needs libtvm_ffi.so, which the loader cannot find" in c.reason
    # the same object anywhere else gets no such help
    other = {"other": {"other/libxgrammar_bindings.so": "needs_tvm"},
             "apache-tvm-ffi": {"tvm_ffi/lib/libtvm_ffi.so": "tvm"}}
    assert phase(fx.loading_site(objs, tmp_path / "c", other))["abi.other"].status == FAIL


@needs_cc
def test_a_load_rule_added_only_in_the_manifest_makes_an_extension_loadable(
        objs: dict[str, Path], tmp_path: Path) -> None:
    """The loader's rules are data: a package no code knows (its extension needs a library
    its own runtime package loads first) loads with one ``abi_loader`` rule in the manifest,
    and fails without it; a manifest without the section says what that loses."""
    members = {"newpkg": {"newpkg/_bindings.so": "needs_tvm"},
               "newpkg-runtime": {"newpkg_rt/lib/libtvm_ffi.so": "tvm"}}
    site = fx.loading_site(objs, tmp_path, members)
    rule = {"loads": {"newpkg/*.so": [{"lib": ["newpkg_rt/lib/libtvm_ffi.so"], "global": True}]}}

    def run(manifest: dict) -> dict:
        r = abi.Run({"manifest": {"accelerator": "cuda", **manifest}, "options": {}})
        return {c.id: c for c in abi.check_abi(r, [str(site)])}

    with_rule = run({"abi_loader": rule})
    assert with_rule["abi.newpkg"].status == PASS, with_rule["abi.newpkg"].reason
    assert with_rule["abi.scan"].value["loader_rules"] == "manifest"
    assert "no abi_loader rules" not in with_rule["abi.scan"].reason
    c = run({"abi_loader": {}})["abi.newpkg"]
    assert c.status == FAIL and "needs libtvm_ffi.so, which the loader cannot find" in c.reason
    bare = run({})
    assert bare["abi.newpkg"].status == FAIL
    assert bare["abi.scan"].value["loader_rules"] is False
    assert "the manifest carries no abi_loader rules" in bare["abi.scan"].reason


def test_without_manifest_rules_the_payloads_copy_of_the_catalogue_is_used(
        objs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An image whose manifest has no ``abi_loader`` (built before the rules travelled with
    it, or not by verl-env) is held with the catalogue's rules the self-test was shipped with
    (``loader_rules.json`` in its payload, :func:`builder.shipped.selftest_files`); a manifest
    that has the section, even empty, is taken as it is."""
    members = {"newpkg": {"newpkg/_bindings.so": "needs_tvm"},
               "newpkg-runtime": {"newpkg_rt/lib/libtvm_ffi.so": "tvm"}}
    site = fx.loading_site(objs, tmp_path, members)
    payload = tmp_path / PAYLOAD_LOADER_RULES
    payload.write_text(json.dumps({"loads": {"newpkg/*.so": [
        {"lib": ["newpkg_rt/lib/libtvm_ffi.so"], "global": True}]}}))
    monkeypatch.setattr(abi, "PAYLOAD_RULES", str(payload))

    def run(manifest: dict) -> dict:
        r = abi.Run({"manifest": {"accelerator": "cuda", **manifest}, "options": {}})
        return {c.id: c for c in abi.check_abi(r, [str(site)])}

    bare = run({})
    assert bare["abi.newpkg"].status == PASS, bare["abi.newpkg"].reason
    assert bare["abi.scan"].value["loader_rules"] == abi.PAYLOAD
    assert "the catalogue's rules shipped with this self-test were used" in bare["abi.scan"].reason
    assert run({"abi_loader": {}})["abi.newpkg"].status == FAIL


def test_the_payload_carries_the_catalogues_loader_rules() -> None:
    files = dict(shipped.selftest_files())
    assert json.loads(files[PAYLOAD_LOADER_RULES]) == catalog.shipped().abi_loader()
    assert list(files) == sorted(files)


def test_rules_read_from_a_manifest_leave_malformed_entries_out() -> None:
    got = abiload.rules({"abi_loader": {
        "loads": {"a/*.so": [{"lib": "x/libx.so", "global": True}, {"lib": []}], "b": "no"},
        "alternatives": [{"pattern": "p/(?P<v>\\d+)\\.so", "how": "h", "pick": "torch-minor"},
                         {"pattern": "(unclosed"}, {"pattern": "no-group"}],
        "preload": {"function": "f", "list": 3}}})
    assert got.present and got.loads == (("a/*.so", ((("x/libx.so",), True),)),)
    assert [(a.pattern, a.pick) for a in got.alternatives] == [("p/(?P<v>\\d+)\\.so",
                                                                "torch-minor")]
    assert got.preload is None
    assert abiload.rules({}) is abiload.NO_RULES and not abiload.NO_RULES.present
    unknown = abiload.Alternatives("p", "x(?P<v>1)", "h", pick="no-such-strategy")
    assert abiload.picked(unknown, None) is None


def test_sglangs_package_loads_deep_gemm_and_scipys_vendored_gfortran(objs: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    """Found on the real cuda-x86_64-sglang image: deep_gemm's _C after ``import tvm_ffi``, and
    scipy's vendored libgfortran (no RUNPATH) in the load of its sibling libquadmath."""
    members = {"sgl_deep_gemm": {"deep_gemm/_C.so": "needs_tvm"},
               "apache-tvm-ffi": {"tvm_ffi/lib/libtvm_ffi.so": "tvm"}}
    assert phase(fx.loading_site(objs, tmp_path / "a", members))["abi.sgl-deep-gemm"].status \
        == PASS
    del members["apache-tvm-ffi"]
    assert phase(fx.loading_site(objs, tmp_path / "b", members))["abi.sgl-deep-gemm"].status \
        == FAIL
    # libquadmath stands in as the object whose soname the vendored library needs
    scipy = {"scipy": {"scipy.libs/libgfortran-8f1e9814.so.5.0.0": "needs_tvm",
                       "scipy.libs/libquadmath-828275a7.so.0.0.0": "tvm"}}
    assert phase(fx.loading_site(objs, tmp_path / "c", scipy))["abi.scipy"].status == PASS
    alone = {"scipy": {"scipy.libs/libgfortran-8f1e9814.so.5.0.0": "needs_tvm"}}
    assert phase(fx.loading_site(objs, tmp_path / "d", alone))["abi.scipy"].status == FAIL


# ------------------------------------------------------------------------- alternatives


@needs_cc
def test_alternatives_pass_when_the_one_taken_loads(objs: dict[str, Path],
                                                    tmp_path: Path) -> None:
    """numba's threading layers: tbb needs a library the image lacks, workqueue loads:
    numba takes workqueue, tbb is named as not taken, never failed."""
    tag = "cpython-311-x86_64-linux-gnu"
    members = {"numba": {f"numba/np/ufunc/tbbpool.{tag}.so": "needs_absent",
                         f"numba/np/ufunc/workqueue.{tag}.so": "plain"}}
    c = phase(fx.loading_site(objs, tmp_path / "a", members))["abi.numba"]
    assert c.status == PASS, c.reason
    assert f"tbbpool.{tag}.so: alternative not taken (numba's threading layers" in c.reason
    assert "this image takes workqueue" in c.reason
    assert list(c.value["not_taken"]) == [f"numba/np/ufunc/tbbpool.{tag}.so"]
    # when none loads, every variant keeps its problems
    members["numba"][f"numba/np/ufunc/workqueue.{tag}.so"] = "needs_absent"
    c = phase(fx.loading_site(objs, tmp_path / "b", members))["abi.numba"]
    assert c.status == FAIL and "needs libabsent.so.1" in c.reason


@needs_cc
def test_alternatives_picked_by_torch_version(objs: dict[str, Path], tmp_path: Path) -> None:
    """torch_c_dlpack_ext ships an addon per torch minor: only the one for this torch (2.11)
    is judged; those for other torch releases are not taken whatever they need."""
    d = "torch_c_dlpack_ext/libtorch_c_dlpack_addon_torch"
    members = {"torch_c_dlpack_ext": {f"{d}29-cuda.so": "needs_absent",
                                      f"{d}211-cuda.so": "plain"}}
    c = phase(fx.loading_site(objs, tmp_path / "a", members))["abi.torch-c-dlpack-ext"]
    assert c.status == PASS and "this image takes 211" in c.reason, c.reason
    members["torch_c_dlpack_ext"][f"{d}211-cuda.so"] = "needs_absent"
    c = phase(fx.loading_site(objs, tmp_path / "b", members))["abi.torch-c-dlpack-ext"]
    assert c.status == FAIL and "torch211-cuda.so: needs libabsent.so.1" in c.reason


# ------------------------------------------------- another interpreter, unrelocated symbols


@needs_cc
def test_a_module_for_another_python_is_reported_not_checked(objs: dict[str, Path],
                                                             tmp_path: Path) -> None:
    members = {"ext": {"ext/_C.cpython-399-x86_64-linux-gnu.so": "needs_absent",
                       "ext/_C.abi3.so": "plain"}}
    checks = phase(fx.loading_site(objs, tmp_path, members))
    scan = checks["abi.scan"]
    assert scan.value["other_interpreter"] == ["ext/_C.cpython-399-x86_64-linux-gnu.so"]
    assert "1 built for another Python, never imported by this one, not checked" in scan.reason
    assert checks["abi.ext"].status == PASS and checks["abi.ext"].value["objects"] == 1
    assert abiload.other_interpreter("_C.cpython-311-x86_64-linux-gnu.so",
                                     "cpython-311-x86_64-linux-gnu") is None
    assert abiload.other_interpreter("x.abi3.so", "cpython-311-x86_64-linux-gnu") is None


@needs_cc
def test_an_undefined_symbol_no_relocation_names_is_never_looked_up(
        objs: dict[str, Path], tmp_path: Path) -> None:
    """GCC 13 leaves ``.globl _ZSt21ios_base_library_initv`` undefined in every C++ object
    it builds, with no relocation: the loader never looks it up, ``ldd -r`` does not report it;
    an older libstdc++ (Debian bookworm's) does not define it and every such object loads."""
    path = str(objs["marker"])
    info = abimodel.read_dynamic(path)
    assert info is not None and b"verl_env_marker_never_looked_up" in info.refs
    checks = phase(fx.loading_site(objs, tmp_path, {"mk": {"mk/_C.so": "marker"}}))
    assert checks["abi.mk"].status == PASS, checks["abi.mk"].reason
    proc, _src = abi.make_process(sys.executable, [], {})
    assert abimodel.unbound_alone(proc, os.path.realpath(path)) == (set(), [])


# --------------------------------------------------------------------------- abi_allow


@needs_cc
def test_a_reviewed_allowance_names_the_object_and_why(objs: dict[str, Path],
                                                       tmp_path: Path) -> None:
    members = {"tc": {"tc/libheic.so": "needs_absent", "tc/libother.so": "needs_absent"}}
    root = fx.loading_site(objs, tmp_path, members)
    why = "HEIC decoding needs the system libheif, which the image does not ship"
    c = phase(root, {"tc/libheic.so": why})["abi.tc"]
    assert c.status == FAIL  # the other object is not allowed
    assert "(allowed) tc/libheic.so: needs libabsent.so.1, which the loader cannot find " \
           f"(+1 more) (matrix abi_allow: {why})" in c.reason
    assert c.reason.startswith("tc: tc/libother.so: needs libabsent.so.1")
    ok = phase(root, {"tc/lib*.so": why})["abi.tc"]
    assert ok.status == PASS and ok.reason.count("(allowed)") == 2
    assert set(ok.value["allowed"]) == {"tc/libheic.so", "tc/libother.so"}
    assert ok.value["problems"] == []


def test_nothing_is_allowed_without_a_problem() -> None:
    r = abi.ObjectResult("x", "x/a.so")
    assert abi.allowance("x/a.so", {"x/*.so": "a reason long enough"}) == "a reason long enough"
    assert abi.decide_dist("x", [r]).status == PASS and "(allowed)" not in \
        abi.decide_dist("x", [r]).reason
