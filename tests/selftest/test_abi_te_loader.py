"""The ABI phase models TransformerEngine's own loader (transformer_engine/common/__init__.py,
read in the Megatron image): it opens the nvidia wheels' cuDNN, NVRTC, cuRAND, cuBLAS and CUDA
runtime RTLD_GLOBAL, then ``libtransformer_engine.so`` RTLD_GLOBAL, then its torch extension.
So the core library's cuDNN (named without a search path) and the extension's ``nvte_*``
symbols (the core library's, not a DT_NEEDED of the extension) resolve; the same objects
anywhere else do not. Real ELF objects, built here."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from builder.selftest.elf import abiload

from builder.selftest.phases import abi
from builder.selftest.report import FAIL, PASS

from . import abifixture as fx
from .helpers import catalog_manifest, loader_rules

TE_CORE = "transformer_engine/wheel_lib/libtransformer_engine.so"

CORE_C = "extern int cudnnBackendExecute(void);\n" \
         "int nvte_cublas_gemm(void) { return cudnnBackendExecute(); }\n"
EXT_C = "extern int nvte_cublas_gemm(void);\n" \
        "int PyInit_transformer_engine_torch(void) { return nvte_cublas_gemm(); }\n"
TAG = sysconfig.get_config_var("EXT_SUFFIX") or ".so"


@pytest.fixture(scope="module")
def objs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if fx.compilers():
        pytest.skip(str(fx.compilers()))
    b = tmp_path_factory.mktemp("abi-te")
    o = fx.build_loading(b)
    o["cudnn"] = fx._cc("gcc", "int cudnnBackendExecute(void) { return 0; }\n",
                        b / "cudnn" / "libcudnn.so.9", "-Wl,-soname,libcudnn.so.9")
    o["te_core"] = fx._cc("gcc", CORE_C, b / "te" / "libtransformer_engine.so",
                          f"-L{b / 'cudnn'}", "-l:libcudnn.so.9")
    o["te_ext"] = fx._cc("gcc", EXT_C, b / "te" / "transformer_engine_torch.so")
    return o


def phase(root: Path) -> dict:
    run = abi.Run({"manifest": {"accelerator": "cuda", "abi_allow": {},
                                **catalog_manifest()}, "options": {}})
    return {c.id: c for c in abi.check_abi(run, [str(root)])}


def te_site(objs: dict[str, Path], root: Path, lib: str = "transformer_engine/wheel_lib") -> Path:
    # dist-info names as wheels write them (underscores)
    return fx.loading_site(objs, root, {
        "nvidia_cudnn_cu13": {"nvidia/cudnn/lib/libcudnn.so.9": "cudnn"},
        "transformer_engine_cu13": {f"{lib}/libtransformer_engine.so": "te_core"},
        "transformer_engine_torch": {f"{lib}/transformer_engine_torch{TAG}": "te_ext"}})


def test_te_core_and_extension_load_in_te_loaders_scope(objs: dict[str, Path],
                                                       tmp_path: Path) -> None:
    checks = phase(te_site(objs, tmp_path))
    assert checks["abi.transformer-engine-cu13"].status == PASS, \
        checks["abi.transformer-engine-cu13"].reason
    assert checks["abi.transformer-engine-torch"].status == PASS, \
        checks["abi.transformer-engine-torch"].reason


def test_the_same_objects_outside_te_have_no_loader(objs: dict[str, Path],
                                                    tmp_path: Path) -> None:
    """The model is TE's, not a blanket pass: elsewhere the gaps are found."""
    checks = phase(te_site(objs, tmp_path, lib="other/lib"))
    core, ext = checks["abi.transformer-engine-cu13"], checks["abi.transformer-engine-torch"]
    assert core.status == FAIL and "libcudnn.so.9, which the loader cannot find" in core.reason
    assert ext.status == FAIL and "nvte_cublas_gemm" in ext.reason


def test_loads_follow_te_layouts_in_order(tmp_path: Path) -> None:
    """Every file of the first layout that has the library, in TE's order, the core last."""
    for rel in ("nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cu13/lib/libnvrtc-builtins.so.13.0",
                "nvidia/cudnn/lib/libcudnn.so.9", "nvidia/cudnn/lib/libcudnn_ops.so.9",
                "nvidia/cu13/lib/libcudnn_stale.so.9", "nvidia/cu13/lib/libcurand.so.10",
                "nvidia/cu13/lib/libcublas.so.13", "nvidia/cu13/lib/libcublasLt.so.13",
                "nvidia/cu13/lib/libcudart.so.13", "nvidia/cu13/lib/libcudart_static.a",
                TE_CORE):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    ext = f"transformer_engine/wheel_lib/transformer_engine_torch{TAG}"
    got = [Path(p).relative_to(tmp_path).as_posix() + ("" if g else " local")
           for p, g in abiload.package_loads(ext, [str(tmp_path)], loader_rules())]
    # cu13/lib/libcudnn* is TE's second layout: the first would be cu13/cudnn/lib; TE takes
    # cu13/lib/libcudnn* before nvidia/cudnn/lib only when cu13/cudnn is absent, as here
    assert got == ["nvidia/cu13/lib/libcudnn_stale.so.9",
                   "nvidia/cu13/lib/libnvrtc-builtins.so.13.0", "nvidia/cu13/lib/libnvrtc.so.13",
                   "nvidia/cu13/lib/libcurand.so.10", "nvidia/cu13/lib/libcublas.so.13",
                   "nvidia/cu13/lib/libcublasLt.so.13", "nvidia/cu13/lib/libcudart.so.13",
                   TE_CORE]
    assert [p for p, _g in abiload.package_loads(TE_CORE, [str(tmp_path)],
                                                    loader_rules())][-1] \
        .endswith("libcudart.so.13")
