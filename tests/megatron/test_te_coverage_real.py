"""The coverage phase on TransformerEngine's real core wheel (``transformer-engine-cu13``
2.19.0, the Megatron targets' pin), against NVIDIA's own ``cuobjdump`` (PyPI
``nvidia-cuda-cuobjdump``): what the phase reads is what NVIDIA's tool lists, the targets'
``gpus`` are covered except where the matrix's reviewed allowance says why, and without that
allowance the phase fails naming the library and the GPU.

The 276 MB wheel is downloaded once by exact version and sha256 into the wheel cache the
device-code tests share (tests/support/wheels.py); the tests skip only when the package index
cannot be reached, or on a machine the x86_64 tools cannot run on.
"""

from __future__ import annotations

import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from builder.selftest.phases.coverage import allowance, decide_dist, scan
from builder.selftest.elf.devcode import read_device_code
from builder.selftest.elf.fatbin import CudaImage
from builder.matrix.spec import load_matrix
from tests.support import wheels

pytestmark = [pytest.mark.network, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TE = ("transformer-engine-cu13", "2.19.0",
      "transformer_engine_cu13-2.19.0-py3-none-manylinux_2_28_x86_64.whl",
      "31a3afd47832160c64653ac4b7b34dfbb3b06a84681eb9474a501b2cd1912756")
LIBS = ("transformer_engine/wheel_lib/libtransformer_engine.so",
        "transformer_engine/wheel_lib/libnccl_ep.so")


def _te_wheel() -> Path:
    name, version, filename, sha = TE
    try:
        return wheels.download(name, version, {sha}, pattern=filename,
                               platform_tag="manylinux_2_28_x86_64")
    except wheels.IndexUnreachable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def te_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel's libraries and its RECORD, laid out as in a site directory."""
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(_te_wheel()) as z:
        for n in z.namelist():
            if n in LIBS or n.endswith(".dist-info/RECORD"):
                z.extract(n, site)
    return site


@pytest.fixture(scope="module")
def cuobjdump() -> Path:
    why = wheels.supported()
    if why:
        pytest.skip(why)
    try:
        tree = wheels.unpack(("nvidia-cuda-cuobjdump",), "cuobjdump-13.5.37")
    except wheels.IndexUnreachable as e:
        pytest.skip(str(e))
    return tree / "nvidia" / "cu13" / "bin" / "cuobjdump"


def _cuobjdump(tool: Path, lib: Path) -> tuple[list[str], list[str]]:
    """NVIDIA's listing: (ELF/SASS arch names, PTX arch names), in file order."""
    proc = subprocess.run([str(tool), "--list-elf", "--list-ptx", str(lib)],
                          capture_output=True, text=True, timeout=600)
    elf = re.findall(r"^ELF file\s+\d+: .*\.(sm_\w+)\.cubin$", proc.stdout, re.M)
    ptx = re.findall(r"^PTX file\s+\d+: .*\.(sm_\w+)\.ptx$", proc.stdout, re.M)
    assert elf or ptx, proc.stdout + proc.stderr
    return elf, ptx


def _as_cuobjdump(images: list[CudaImage]) -> tuple[list[str], list[str]]:
    """Our reading in cuobjdump's names (it names a family cubin without its ``f``)."""
    elf = [f"sm_{i.arch}{'a' if i.variant == 'a' else ''}" for i in images if i.kind == "sass"]
    ptx = [f"sm_{i.arch}{i.variant}" for i in images if i.kind == "ptx"]
    return elf, ptx


@pytest.mark.parametrize("lib", LIBS)
def test_the_phase_reads_what_cuobjdump_lists(te_site: Path, cuobjdump: Path, lib: str) -> None:
    code = read_device_code(str(te_site / lib))
    assert code is not None and not code.problems
    assert _as_cuobjdump(code.cuda) == _cuobjdump(cuobjdump, te_site / lib)


@pytest.mark.parametrize("name", ["cuda-x86_64-megatron", "cuda-arm64-megatron"])
def test_the_megatron_targets_gpus_are_covered_with_reviewed_allowances(
        te_site: Path, name: str) -> None:
    t = load_matrix(REPO / "matrix.yaml").target(name)
    gpus, allow = list(t.gpus), dict(t.coverage_allow)
    libs, files = scan([str(te_site)], "cuda", gpus)
    assert files == 2 and {lib.path for lib in libs} == set(LIBS)
    assert {lib.dist for lib in libs} == {"transformer-engine-cu13"}
    for lib in libs:
        lib.allowed = allowance(lib.path, allow)
    check = decide_dist("transformer-engine-cu13", libs, gpus)
    assert check.status in ("pass", "warn"), check.reason
    core = next(lib for lib in libs if lib.path.endswith("libtransformer_engine.so"))
    assert all(core.decisions[g].status == "native" for g in gpus), core.decisions


def test_without_the_allowance_the_phase_names_the_library_and_gpu(te_site: Path) -> None:
    """Found reading the real wheel: libnccl_ep.so has no code for sm_80 (A100), which
    cuda-x86_64-megatron lists; only the reviewed coverage_allow entry lets it pass."""
    t = load_matrix(REPO / "matrix.yaml").target("cuda-x86_64-megatron")
    libs, _ = scan([str(te_site)], "cuda", list(t.gpus))
    check = decide_dist("transformer-engine-cu13", libs, list(t.gpus))
    assert check.status == "fail"
    assert "transformer_engine/wheel_lib/libnccl_ep.so has no code for sm_80" in check.reason
