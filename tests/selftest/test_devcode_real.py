"""The device-code reader against the vendors' own tools on real files, and the coverage phase
end to end:

* a shared object compiled here by NVIDIA's ``nvcc`` (PyPI ``nvidia-cuda-nvcc``, CUDA 13) for a
  gencode list that mixes SASS and PTX and the ``a``/``f`` variants, read by us and by NVIDIA's
  ``cuobjdump --list-elf --list-ptx`` (PyPI ``nvidia-cuda-cuobjdump``);
* NVIDIA's real ``libcurand.so`` (PyPI ``nvidia-curand``), the same comparison;
* a real ROCm library, JAX's ROCm PJRT plugin (PyPI ``jax-rocm7-pjrt``; zstd-compressed offload
  bundles), against LLVM's ``clang-offload-bundler --list`` (Debian ``clang-tools-22``);
* the self-test's ``coverage`` phase in a fresh venv holding the nvcc-built library.

Wheels are cached in /var/tmp/verl-env-wheels (tests/support/wheels.py); the tests skip only
when the package index cannot be reached, or on a machine the x86_64 wheels cannot run on.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder.selftest.phases.coverage import scan
from builder.selftest.elf import offload
from builder.selftest.elf.devcode import CudaImage, read_device_code
from tests.support import wheels

from .helpers import clean_env

KERNEL = r"""
extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" int launch(float a, const float* x, float* y, int n) {
  axpy<<<(n + 255) / 256, 256>>>(a, x, y, n);
  return 0;
}
"""
# gencode lists: what nvcc is asked for, and the images that must come out of it.
MIXED = ["arch=compute_80,code=sm_80", "arch=compute_90a,code=sm_90a",
         "arch=compute_100a,code=[sm_100a,compute_100a]",
         "arch=compute_120,code=[sm_120,compute_120]"]
MIXED_IMAGES = {"sm_80", "sm_90a", "sm_100a", "compute_100a", "sm_120", "compute_120"}
FAMILY = ["arch=compute_80,code=[sm_86,compute_80]",
          "arch=compute_100f,code=[sm_100f,compute_100f]",
          "arch=compute_103a,code=sm_103a"]
FAMILY_IMAGES = {"sm_86", "compute_80", "sm_100f", "compute_100f", "sm_103a"}


def _need(names: tuple[str, ...], into: str) -> Path:
    why = wheels.supported()
    if why:
        pytest.skip(why)
    try:
        return wheels.unpack(names, into)
    except wheels.IndexUnreachable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def cuda_bin() -> Path:
    """bin/ of the CUDA 13 toolkit assembled from NVIDIA's PyPI wheels (nvcc, cuobjdump)."""
    return _need(wheels.NVCC_WHEELS, "cuda-13.5.37") / "nvidia" / "cu13" / "bin"


def nvcc(cuda_bin: Path, out: Path, gencodes: list[str]) -> Path:
    """Compile KERNEL into a shared object with real nvcc (host compiler: the system g++)."""
    if shutil.which("g++") is None:
        pytest.fail("g++ not installed (scripts/os-packages.sh installs it)")
    src = out.parent / "axpy.cu"
    src.write_text(KERNEL)
    cmd = [str(cuda_bin / "nvcc"), "-shared", "-Xcompiler", "-fPIC", "-o", str(out), str(src)]
    for g in gencodes:
        cmd += ["-gencode", g]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="session")
def mixed_so(cuda_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return nvcc(cuda_bin, tmp_path_factory.mktemp("nvcc-mixed") / "libaxpy.so", MIXED)


def cuobjdump(cuda_bin: Path, path: Path) -> tuple[list[str], list[str]]:
    """NVIDIA's listing: (ELF/SASS arch names, PTX arch names), in file order."""
    proc = subprocess.run([str(cuda_bin / "cuobjdump"), "--list-elf", "--list-ptx", str(path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    elf = re.findall(r"^ELF file\s+\d+: .*\.(sm_\w+)\.cubin$", proc.stdout, re.M)
    ptx = re.findall(r"^PTX file\s+\d+: .*\.(sm_\w+)\.ptx$", proc.stdout, re.M)
    assert elf or ptx, proc.stdout + proc.stderr
    return elf, ptx


def as_cuobjdump(images: list[CudaImage]) -> tuple[list[str], list[str]]:
    """Our reading in cuobjdump's names: cuobjdump calls every image sm_XY, and names a
    family-specific cubin without its ``f`` (a family PTX keeps it)."""
    elf = [f"sm_{i.arch}{'a' if i.variant == 'a' else ''}" for i in images if i.kind == "sass"]
    ptx = [f"sm_{i.arch}{i.variant}" for i in images if i.kind == "ptx"]
    return elf, ptx


@pytest.mark.parametrize("gencodes, expected", [(MIXED, MIXED_IMAGES), (FAMILY, FAMILY_IMAGES)],
                         ids=["mixed", "family"])
def test_nvcc_library_matches_cuobjdump(cuda_bin: Path, tmp_path: Path, gencodes: list[str],
                                        expected: set[str]) -> None:
    so = nvcc(cuda_bin, tmp_path / "libaxpy.so", gencodes)
    code = read_device_code(str(so))
    assert code is not None and not code.problems
    assert {i.name for i in code.cuda} == expected  # what nvcc was asked for, variants included
    assert as_cuobjdump(code.cuda) == cuobjdump(cuda_bin, so)
    assert all(i.ptx_isa and i.ptx_isa >= (9, 0) for i in code.cuda if i.kind == "ptx")


def test_real_nvidia_library_matches_cuobjdump(cuda_bin: Path, tmp_path: Path) -> None:
    lib = _need(("nvidia-curand",), "curand-10.4.5.25") / "nvidia" / "cu13" / "lib" / \
        "libcurand.so.10"
    t0 = time.monotonic()
    code = read_device_code(str(lib))
    ours_s = time.monotonic() - t0
    assert code is not None and not code.problems
    t0 = time.monotonic()
    theirs = cuobjdump(cuda_bin, lib)
    print(f"\nlibcurand.so.10 ({lib.stat().st_size >> 20} MiB): {len(code.cuda)} registered images "
          f"in {len(code.cuda_groups)} fat binaries, {len(code.cuda_loaded)} more fat binaries "
          f"in its data, read in {ours_s * 1000:.1f} ms "
          f"(cuobjdump {time.monotonic() - t0:.2f} s)")
    assert as_cuobjdump(code.cuda) == theirs
    assert len(code.cuda) > 100 and ours_s < 50  # read in ms: this catches a hang only
    # The fat binaries curand loads itself (in .data; cuobjdump does not look there): found
    # independently here (readelf's section table, a plain search for the header), cut out,
    # and a sample listed by cuobjdump, which reads a bare fat binary file too.
    blobs = []
    for name, offset, size in progbits(lib):
        if name == ".nv_fatbin":
            continue
        with open(lib, "rb") as f:
            f.seek(offset)
            data = f.read(size)
        for m in re.finditer(re.escape(bytes.fromhex("50ed55ba01001000")), data):
            blobs.append(data[m.start():m.start() + 16 + int.from_bytes(
                data[m.start() + 8:m.start() + 16], "little")])
    assert len(blobs) == len(code.cuda_loaded) > 1000
    for i in range(0, len(blobs), len(blobs) // 12):
        part = tmp_path / f"loaded{i}.fatbin"
        part.write_bytes(blobs[i])
        assert as_cuobjdump(code.cuda_loaded[i]) == cuobjdump(cuda_bin, part), i


def progbits(path: Path) -> list[tuple[str, int, int]]:
    """(name, offset, size) of every PROGBITS section, as binutils' readelf sees them."""
    out = subprocess.run(["readelf", "-SW", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return [(m.group(1), int(m.group(2), 16), int(m.group(3), 16)) for m in
            re.finditer(r"\]\s+(\S+)\s+PROGBITS\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)", out)]


def bundler() -> str:
    for cand in ("clang-offload-bundler-22", "/usr/lib/llvm-22/bin/clang-offload-bundler"):
        if shutil.which(cand):
            return cand
    pytest.skip("LLVM's clang-offload-bundler 22 is not installed (Debian clang-tools-22; "
                "scripts/os-packages.sh installs it)")


def hip_section(path: Path) -> tuple[int, int]:
    """(offset, size) of .hip_fatbin, as binutils' readelf sees it."""
    out = subprocess.run(["readelf", "-SW", str(path)], capture_output=True, text=True,
                         check=True).stdout
    m = re.search(r"\.hip_fatbin\s+\S+\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)", out)
    assert m, out
    return int(m.group(1), 16), int(m.group(2), 16)


@pytest.mark.parametrize("decoder", ["zstandard", "pure-python"])
def test_real_rocm_library_matches_clang_offload_bundler(tmp_path: Path, decoder: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    tool = bundler()
    if decoder == "zstandard":
        pytest.importorskip("zstandard", reason="the test extra installs zstandard")
    else:  # what an image without zstandard (and before Python 3.14) uses
        monkeypatch.setattr(offload, "_zstd", lambda: offload.decompress_prefix)
    so = _need(("jax-rocm7-pjrt",), "jax-rocm7-pjrt-0.12.0") / "jax_plugins" / "xla_rocm7" / \
        "xla_rocm_plugin.so"
    t0 = time.monotonic()
    code = read_device_code(str(so))
    ours_s = time.monotonic() - t0
    assert code is not None and not code.problems, code and code.problems[:3]
    # LLVM's reading: cut the section (located by readelf) into its bundles and list each.
    offset, size = hip_section(so)
    with open(so, "rb") as f:
        f.seek(offset)
        sec = f.read(size)
    theirs: list[str] = []
    starts = [m.start() for m in re.finditer(b"CCOB", sec) if m.start() % 4096 == 0]
    assert len(starts) == code.containers
    for n, start in enumerate(starts):
        total = int.from_bytes(sec[start + 8:start + 16], "little")  # CCOB v3 total size
        part = tmp_path / f"b{n}.co"
        part.write_bytes(sec[start:start + total])
        out = subprocess.run([tool, "--list", "--type=o", f"--input={part}"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        theirs += [t for t in out.stdout.split() if not t.startswith("host-")]
    print(f"\nxla_rocm_plugin.so ({so.stat().st_size >> 20} MiB): {len(code.hip)} code objects "
          f"in {code.containers} bundles, read in {ours_s * 1000:.0f} ms ({decoder})")
    # clang-offload-bundler lists a bundle's entries in its own (hashed) order: compare as
    # multisets over all 45 bundles
    assert sorted(i.triple for i in code.hip) == sorted(theirs)
    assert {"gfx942", "gfx950", "gfx90a"} <= {i.target for i in code.hip}


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="session")
def venv_with_ext(mixed_so: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv whose site-packages holds a distribution 'fakeext' with the nvcc-built
    library as its extension module, and a host-only library beside it."""
    venv = tmp_path_factory.mktemp("cov-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig;print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    (site / "fakeext").mkdir()
    shutil.copy(mixed_so, site / "fakeext" / "_C.so")
    (site / "fakeext-1.0.dist-info").mkdir()
    (site / "fakeext-1.0.dist-info" / "RECORD").write_text(
        "fakeext/_C.so,sha256=x,1\nfakeext-1.0.dist-info/RECORD,,\n")
    return py


def run_coverage(py: Path, st_path: Path, tmp_path: Path, gpus: list[str]) -> tuple[int, dict, str]:
    m = tmp_path / "manifest.json"
    m.write_text(json.dumps({"schema": "verl-env/manifest/v1", "target": "fx", "accelerator":
                             "cuda", "arch": "x86_64", "gpus": gpus}))
    report = tmp_path / "report.json"
    proc = subprocess.run([str(py), "-m", "verl_env_selftest", "--phases", "coverage",
                           "--manifest", str(m), "--json", str(report), "--expect-gpus", "0"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=clean_env(PYTHONPATH=str(st_path)))
    return proc.returncode, json.loads(report.read_text()), proc.stdout + proc.stderr


def test_phase_fails_on_a_gpu_without_code(venv_with_ext: Path, st_path: Path,
                                           tmp_path: Path) -> None:
    rc, report, out = run_coverage(venv_with_ext, st_path, tmp_path, ["sm_80", "sm_90", "sm_103"])
    checks = {c["id"]: c for c in report["checks"]}
    assert rc == 1 and report["overall"] == "fail", out
    c = checks["coverage.fakeext"]
    assert c["status"] == "fail" and c["required"]
    assert c["reason"] == ("fakeext: fakeext/_C.so has no code for sm_103 (has compute_100a,"
                           "compute_120,sm_100a,sm_120,sm_80,sm_90a)")
    assert c["value"] == {"sm_80": "native", "sm_90": "native", "sm_103": "none"}
    assert "fakeext       fakeext/_C.so  native  native  NONE" in out


def test_phase_passes_on_the_gpus_it_has(venv_with_ext: Path, st_path: Path,
                                         tmp_path: Path) -> None:
    gpus = ["sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    rc, report, out = run_coverage(venv_with_ext, st_path, tmp_path, gpus)
    checks = {c["id"]: c for c in report["checks"]}
    assert rc == 0 and report["overall"] == "pass", out
    assert checks["coverage.fakeext"]["status"] == "pass"
    assert checks["coverage.fakeext"]["value"] == {g: "native" for g in gpus}
    scan_v = checks["coverage.scan"]["value"]
    assert scan_v["libraries"] == 1 and scan_v["table"][0]["library"] == "fakeext/_C.so"
    assert os.path.realpath(str(venv_with_ext.parent.parent)) in scan_v["roots"][0]
    # sm_121 runs the sm_120 SASS; a later major (a future sm_130) only the compute_120 PTX,
    # after a JIT compile: a warning that names the library and the PTX, not a pass
    rc, report, out = run_coverage(venv_with_ext, st_path, tmp_path, ["sm_121", "sm_130"])
    jit = {c["id"]: c for c in report["checks"]}["coverage.fakeext"]
    assert rc == 0 and jit["status"] == "warn", out
    assert jit["value"] == {"sm_121": "native", "sm_130": "ptx-jit"}
    assert "fakeext/_C.so on sm_130 by JIT from compute_120" in jit["reason"]


def test_scan_time_on_a_large_tree() -> None:
    """The whole cached wheel tree (nvcc, curand, the ROCm plugin: ~1 GiB of ELF files) and
    this interpreter's site-packages are read in seconds."""
    if not wheels.CACHE.is_dir():
        pytest.skip("no wheel cache yet")
    from builder.selftest.phases.coverage import site_dirs

    roots = [str(wheels.CACHE)] + site_dirs()
    t0 = time.monotonic()
    libs, files = scan(roots, "cuda", ["sm_90", "sm_100"])
    elapsed = time.monotonic() - t0
    print(f"\nscan: {files} ELF files, {len(libs)} with CUDA device code, {elapsed:.2f} s")
    assert elapsed < 100  # 10x headroom: catches a hang, not a speed claim
