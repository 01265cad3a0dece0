"""TransformerEngine's core library against the cuBLAS the Megatron locks pin, read with the ABI
phase's own ELF reader and binding rules: every ``@libcublasLt.so.13`` / ``@libcublas.so.13``
symbol ``libtransformer_engine.so`` (``transformer-engine-cu13`` 2.19.0) needs must be exported
by the locked ``nvidia-cublas`` wheel. torch 2.11's own pin (13.1.0.3) lacks
``cublasLtGroupedMatrixLayoutInit_internal`` (TE's grouped GEMM); the reviewed override moves it
to 13.2.0.9, the first release that exports it (docs/megatron.md).

Both wheels are downloaded once, by exact version, checked against the lock's sha256, into the
wheel cache the device-code tests share; the tests skip only when the index cannot be reached.
Also the matrix data behind it: the override and NCCL EP's reviewed ``abi_allow``."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest

from builder.selftest.elf.abimodel import bind
from builder.selftest.elf.elfdyn import read_dynamic
from builder.matrix.spec import load_matrix
from tests.megatron.test_te_coverage_real import _te_wheel
from tests.support import wheels

REPO = Path(__file__).resolve().parents[2]
TARGETS = ("cuda-x86_64-megatron", "cuda-arm64-megatron")
NCCL_EP = "transformer_engine/wheel_lib/libnccl_ep.so"


def locked(target: str, name: str) -> tuple[str, set[str]]:
    """(version, sha256 set) of ``name`` in the target's lock."""
    text = (REPO / "locks" / f"{target}.txt").read_text()
    m = re.search(rf"^{re.escape(name)}==(\S+)((?: \\\n\s+--hash=sha256:[0-9a-f]{{64}})+)",
                  text, re.M)
    assert m, f"{name} not in locks/{target}.txt"
    return m.group(1), set(re.findall(r"sha256:([0-9a-f]{64})", m.group(2)))


def _cublas_wheel(version: str, hashes: set[str]) -> Path:
    """The locked cuBLAS wheel, checked against the lock's hashes."""
    try:
        return wheels.download("nvidia-cublas", version, hashes,
                               pattern=f"nvidia_cublas-{version}-*x86_64.whl",
                               platform_tag="manylinux_2_27_x86_64")
    except wheels.IndexUnreachable as e:
        pytest.skip(str(e))


def _extract(wheel: Path, suffix: str, into: Path) -> Path:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(suffix))
        return Path(z.extract(name, into))


@pytest.mark.network
@pytest.mark.slow
def test_locked_cublas_exports_what_te_core_needs(tmp_path: Path) -> None:
    version, hashes = locked("cuda-x86_64-megatron", "nvidia-cublas")
    cublas = _cublas_wheel(version, hashes)
    core = read_dynamic(str(_extract(_te_wheel(), "wheel_lib/libtransformer_engine.so",
                                     tmp_path)))
    assert core is not None
    libs = {f: read_dynamic(str(_extract(cublas, f"lib/{f}", tmp_path)))
            for f in ("libcublasLt.so.13", "libcublas.so.13")}
    for file, lib in libs.items():
        assert lib is not None
        wanted = {k for k in core.refs if core.ref_file.get(k) == file}
        assert wanted, f"libtransformer_engine.so needs nothing of {file}?"
        missing = sorted(k.split(b"\x00", 1)[0].decode() for k in bind(wanted, [lib]))
        assert not missing, f"nvidia-cublas {version} {file} lacks {missing}"


def test_megatron_targets_carry_the_reviewed_cublas_override_and_lock_it() -> None:
    m = load_matrix(REPO / "matrix.yaml")
    for name in TARGETS:
        t = m.targets[name]
        ov = {o.name: o.version for o in t.overrides}
        assert ov.get("nvidia-cublas") == "13.2.0.9", name
        assert locked(name, "nvidia-cublas")[0] == "13.2.0.9", name
        head = (REPO / "locks" / f"{name}.txt").read_text().split("\n# regenerate", 1)[0]
        assert "# override: nvidia-cublas==13.2.0.9 (" in head, name


def test_megatron_targets_allow_nccl_ep_and_keep_the_stacks_allowances() -> None:
    m = load_matrix(REPO / "matrix.yaml")
    for name, below in zip(TARGETS, ("cuda-x86_64", "cuda-arm64")):
        allow = dict(m.targets[name].abi_allow)
        assert "NCCL 2.30.4" in allow.get(NCCL_EP, ""), name
        base = dict(m.targets[below].abi_allow)
        assert base and all(allow.get(k) == v for k, v in base.items()), name
