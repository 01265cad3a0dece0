"""The device-code reader, the compatibility rules and the coverage checks, on synthetic bytes
(real files: test_devcode_real.py)."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import pytest

from builder.selftest.elf import devcode, offload
from builder.selftest.phases.coverage import Library, check_coverage, decide_dist, plan, scan
from builder.selftest.elf.devcode import CudaImage, HipImage, read_device_code
from builder.selftest.elf.devcompat import (NATIVE, NONE, PTX_JIT, SPIRV_JIT, decide_cuda,
                                        decide_rocm)
from builder.selftest.manifest import ManifestError, parse_manifest
from builder.selftest.phase import Run
from builder.selftest.report import Check, render_coverage

from .elfbytes import bundle, ccob, elf, fatbin, fatbin_entry

SASS, PTX = 2, 1
ARCH_A, FAMILY_F, ZSTD = 0x100000, 0x200000, 0x8000


def write(tmp: Path, name: str, data: bytes) -> str:
    p = tmp / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return str(p)


# --------------------------------------------------------------------------- reading


@pytest.mark.parametrize("cls64", [True, False])
def test_reads_fatbin_entries_kinds_variants(tmp_path: Path, cls64: bool) -> None:
    first = fatbin(fatbin_entry(SASS, 80), fatbin_entry(SASS, 90, 0x11 | ARCH_A),
                   fatbin_entry(SASS, 100, 0x11 | FAMILY_F, header_size=120))
    second = fatbin(fatbin_entry(PTX, 120, 0x11 | ZSTD, isa=(9, 1), header_size=80),
                    fatbin_entry(PTX, 100, 0x11 | ARCH_A | ZSTD))
    # containers padded apart, as a linker may align them
    sec = first + b"\0" * 16 + second + b"\0" * 8
    code = read_device_code(write(tmp_path, "a.so", elf({".text": b"\x90" * 10,
                                                          ".nv_fatbin": sec}, cls64)))
    assert code is not None and not code.problems and code.containers == 2
    assert [i.name for i in code.cuda] == ["sm_80", "sm_90a", "sm_100f", "compute_120",
                                           "compute_100a"]
    assert code.cuda[3].ptx_isa == (9, 1)


def test_not_elf_and_no_device_code(tmp_path: Path) -> None:
    assert read_device_code(write(tmp_path, "script.so", b"INPUT(-lfoo)\n")) is None
    code = read_device_code(write(tmp_path, "plain.so", elf({".text": b"\0" * 4})))
    assert code is not None and code.empty


def test_malformed_fatbin_is_a_problem_not_silence(tmp_path: Path) -> None:
    bad = fatbin(fatbin_entry(SASS, 80))[:-8]  # header says more bytes than the section has
    code = read_device_code(write(tmp_path, "bad.so", elf({".nv_fatbin": bad})))
    assert code is not None and code.problems and "runs past the section" in code.problems[0]
    junk_kind = fatbin(fatbin_entry(7, 80))
    code = read_device_code(write(tmp_path, "bad2.so", elf({".nv_fatbin": junk_kind})))
    assert code is not None and "bad fat binary entry (kind 7" in code.problems[0]


def test_reads_only_headers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 64 MiB payload is skipped, not read: the bytes read stay tiny."""
    big = fatbin(fatbin_entry(SASS, 90, payload=b"\0" * (64 << 20)), fatbin_entry(PTX, 90))
    path = write(tmp_path, "big.so", elf({".nv_fatbin": big}))
    read: list[int] = []
    real = devcode.os.pread

    def counting(fd: int, n: int, off: int) -> bytes:
        data = real(fd, n, off)
        read.append(len(data))
        return data

    monkeypatch.setattr(devcode.os, "pread", counting)
    code = read_device_code(path)
    assert code is not None and [i.name for i in code.cuda] == ["sm_90", "compute_90"]
    assert sum(read) < 4096, read


TRIPLES = ["host-x86_64-unknown-linux-gnu-", "hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-",
           "hipv4-amdgcn-amd-amdhsa--gfx90a", "hip-amdgcn-amd-amdhsa-gfx906",
           "hipv4-amdgcn-amd-amdhsa--gfx11-generic"]


@pytest.mark.parametrize("form", ["plain", "ccob-v2-zlib", "ccob-v3-zlib"])
def test_reads_hip_bundles(tmp_path: Path, form: str) -> None:
    b1, b2 = bundle(TRIPLES), bundle(["hipv4-amdgcn-amd-amdhsa--gfx950"])
    if form != "plain":
        version = int(form[6])
        b1, b2 = ccob(b1, version), ccob(b2, version)
    sec = b1 + b"\0" * (4096 - len(b1) % 4096) + b2
    code = read_device_code(write(tmp_path, "h.so", elf({".hip_fatbin": sec})))
    assert code is not None and not code.problems and code.containers == 2
    assert [i.target for i in code.hip] == ["gfx942:sramecc+:xnack-", "gfx90a", "gfx906",
                                            "gfx11-generic", "gfx950"]


def raw_zstd(data: bytes) -> bytes:
    """A zstd frame holding ``data`` in one raw block (single segment, 8-byte content size)."""
    return (b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + len(data).to_bytes(8, "little")
            + ((len(data) << 3) | 1).to_bytes(3, "little") + data)


def test_zstd_bundles_pure_python_and_unreadable(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offload, "_zstd", lambda: offload.decompress_prefix)
    plain = bundle(TRIPLES)
    sec = ccob(plain, 3, method=1, compressed=raw_zstd(plain))
    code = read_device_code(write(tmp_path, "z.so", elf({".hip_fatbin": sec})))
    assert code is not None and not code.problems and len(code.hip) == 4
    corrupt = ccob(plain, 3, method=1, compressed=b"\x28\xb5\x2f\xfd" + b"\0" * 40)
    code = read_device_code(write(tmp_path, "bad.so", elf({".hip_fatbin": corrupt})))
    assert code is not None and not code.hip
    assert "zstd payload not readable: ZstdError" in code.problems[0]
    v1 = ccob(plain, 1, method=0)
    code = read_device_code(write(tmp_path, "v1.so", elf({".hip_fatbin": v1})))
    assert code is not None and "version 1" in code.problems[0]


def test_zlib_ccob_decompresses_only_the_header(tmp_path: Path) -> None:
    big = bundle(TRIPLES, payload=b"\x7fELF" + bytes(range(256)) * 40000)
    sec = ccob(big, 3)
    assert len(zlib.decompress(sec[32:])) == len(big)
    code = read_device_code(write(tmp_path, "zb.so", elf({".hip_fatbin": sec})))
    assert code is not None and len(code.hip) == 4 and not code.problems


# --------------------------------------------------------------------------- rules


def sass(name: str) -> CudaImage:
    arch = int("".join(c for c in name if c.isdigit()))
    return CudaImage("sass", arch, name[-1] if name[-1] in "af" else "")


def ptx(name: str) -> CudaImage:
    img = sass(name)
    return CudaImage("ptx", img.arch, img.variant, (9, 0))


@pytest.mark.parametrize("images, gpu, status, by", [
    ([sass("80")], "sm_80", NATIVE, "sm_80"),
    ([sass("80")], "sm_86", NATIVE, "sm_80"),          # same major, newer minor
    ([sass("80")], "sm_90", NONE, None),               # SASS never crosses a major
    ([sass("86")], "sm_80", NONE, None),               # nor runs on an older minor
    ([sass("90a")], "sm_90", NATIVE, "sm_90a"),
    ([sass("100a")], "sm_103", NONE, None),            # arch-specific: that GPU only
    ([sass("100f")], "sm_103", NATIVE, "sm_100f"),     # family-specific: the family
    ([sass("103f")], "sm_100", NONE, None),
    ([sass("100")], "sm_103", NATIVE, "sm_100"),
    ([sass("120")], "sm_121", NATIVE, "sm_120"),
    ([sass("80"), ptx("80")], "sm_90", PTX_JIT, "compute_80"),
    ([ptx("90")], "sm_120", PTX_JIT, "compute_90"),
    ([ptx("120")], "sm_100", NONE, None),              # PTX only forward
    ([ptx("90a")], "sm_100", NONE, None),              # arch-specific PTX: no JIT elsewhere
    ([ptx("90a")], "sm_90", PTX_JIT, "compute_90a"),
    ([ptx("100f")], "sm_103", PTX_JIT, "compute_100f"),
    ([ptx("100f")], "sm_120", NONE, None),
    ([sass("80"), sass("90"), ptx("90")], "sm_90", NATIVE, "sm_90"),
])
def test_cuda_rules(images: list[CudaImage], gpu: str, status: str, by: str | None) -> None:
    d = decide_cuda(images, gpu)
    assert (d.status, d.by) == (status, by)


def hip(target: str) -> HipImage:
    return HipImage(f"hipv4-amdgcn-amd-amdhsa--{target}", target)


@pytest.mark.parametrize("targets, gpu, status", [
    (["gfx942"], "gfx942", NATIVE),
    (["gfx942:sramecc+:xnack-"], "gfx942", NATIVE),             # GPU mode unspecified
    (["gfx942:xnack-"], "gfx942:xnack+", NONE),                 # modes must agree
    (["gfx942:xnack+", "gfx942:xnack-"], "gfx942:xnack+", NATIVE),
    (["gfx942"], "gfx942:xnack+", NATIVE),                      # code object: either mode
    (["gfx90a"], "gfx942", NONE),
    (["gfx9-4-generic"], "gfx950", NATIVE),
    (["gfx11-generic"], "gfx942", NONE),
    (["amdgcnspirv"], "gfx1201", SPIRV_JIT),
])
def test_rocm_rules(targets: list[str], gpu: str, status: str) -> None:
    assert decide_rocm([hip(t) for t in targets], gpu).status == status


# --------------------------------------------------------------------------- manifest


def manifest(**kw: Any) -> dict[str, Any]:
    return {"schema": "verl-env/manifest/v1", "accelerator": "cuda", **kw}


def test_manifest_gpus() -> None:
    assert parse_manifest(manifest())["gpus"] is None
    assert parse_manifest(manifest(gpus=["sm_80", "sm_100"]))["gpus"] == ["sm_80", "sm_100"]
    assert parse_manifest(manifest(accelerator="rocm", gpus=["gfx942", "gfx950:xnack-"]))
    assert parse_manifest(manifest(accelerator="cpu", gpus=[]))["gpus"] == []
    for bad, needle in [(["gfx942"], "gpus[0] 'gfx942' is not a cuda GPU id"),
                        ("sm_80", "must be a list of strings"),
                        (["sm_80", "sm_80"], "lists a GPU twice"),
                        (["sm_8"], "expected sm_XY")]:
        with pytest.raises(ManifestError, match=__import__("re").escape(needle)):
            parse_manifest(manifest(gpus=bad), "m.json")
    with pytest.raises(ManifestError, match="given for a cpu target"):
        parse_manifest(manifest(accelerator="cpu", gpus=["sm_80"]))


# --------------------------------------------------------------------------- the phase


def make_site(tmp: Path) -> Path:
    site = tmp / "site"
    write(site, "pkg/_C.so", elf({".nv_fatbin": fatbin(fatbin_entry(SASS, 80),
                                                          fatbin_entry(SASS, 90),
                                                          fatbin_entry(PTX, 90))}))
    write(site, "pkg/libhost.so.1", elf({".text": b"\0"}))
    (site / "pkg" / "alias.so").symlink_to("_C.so")
    write(site, "pkg-1.0.dist-info/RECORD", b"pkg/_C.so,sha256=x,1\npkg/libhost.so.1,,\n")
    write(site, "stray/libk.so", elf({".nv_fatbin": fatbin(fatbin_entry(SASS, 80))}))
    write(site, "rocm/libh.so", elf({".hip_fatbin": bundle(TRIPLES)}))
    return site


def run_for(gpus: list[str] | None, accelerator: str = "cuda") -> Run:
    m = parse_manifest(manifest(accelerator=accelerator, **({"gpus": gpus} if gpus else {})))
    return Run(ctx={"manifest": m, "options": {}})


def by_id(checks: list[Check]) -> dict[str, Check]:
    return {c.id: c for c in checks}


def test_phase_decides_per_distribution(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    checks = by_id(check_coverage(run_for(["sm_80", "sm_90", "sm_120"]), [str(site)]))
    scan_c = checks["coverage.scan"]
    assert scan_c.status == "pass" and scan_c.required
    assert scan_c.value["elf_files"] == 4 and scan_c.value["libraries"] == 2
    pkg = checks["coverage.pkg"]
    assert pkg.status == "warn" and pkg.value == {"sm_80": "native", "sm_90": "native",
                                                  "sm_120": "ptx-jit"}
    assert "pkg/_C.so on sm_120 by JIT from compute_90" in pkg.reason
    stray = checks["coverage.unowned"]
    assert stray.status == "fail" and stray.required
    assert stray.reason == "unowned: stray/libk.so has no code for sm_90, sm_120 (has sm_80)"
    assert "coverage.rocm" not in checks  # HIP code is not held against CUDA GPUs
    table = render_coverage(list(checks.values()))
    assert table.splitlines()[1:] == [
        "DISTRIBUTION  LIBRARY        sm_80   sm_90   sm_120",
        "pkg           pkg/_C.so      native  native  jit(ptx)",
        "unowned       stray/libk.so  native  NONE    NONE"]


def test_phase_rocm_and_skips(tmp_path: Path) -> None:
    site = make_site(tmp_path)
    checks = by_id(check_coverage(run_for(["gfx942", "gfx950"], "rocm"), [str(site)]))
    assert checks["coverage.unowned"].status == "fail"
    assert "rocm/libh.so has no code for gfx950" in checks["coverage.unowned"].reason
    none = check_coverage(run_for(None), [str(site)])
    assert [(c.id, c.status, c.required) for c in none] == [("coverage.scan", "skip", True)]
    assert "declares no 'gpus'" in none[0].reason
    cpu = plan(run_for(None, "cpu"))
    assert len(cpu) == 1 and not cpu[0].required and not cpu[0].applies


def test_unreadable_library_is_a_required_skip() -> None:
    lib = Library("pkg", "pkg/x.so", [], problems=[".hip_fatbin+0x0: zstd payload not readable"])
    c = decide_dist("pkg", [lib], ["gfx942"])
    assert c.status == "skip" and c.required and "zstd payload not readable" in c.reason
    libs, files = scan([], "cuda", ["sm_80"])
    assert libs == [] and files == 0


def test_gaps_between_translation_units(tmp_path: Path) -> None:
    """A library that runs on sm_80 as a whole, one of whose fat binaries has only sm_90a code:
    native, with the gap counted and starred."""
    site = tmp_path / "site"
    sec = fatbin(fatbin_entry(SASS, 80), fatbin_entry(SASS, 90)) + \
        fatbin(fatbin_entry(SASS, 90, 0x11 | ARCH_A))
    write(site, "lib/libmix.so", elf({".nv_fatbin": sec}))
    checks = by_id(check_coverage(run_for(["sm_80", "sm_90"]), [str(site)]))
    assert checks["coverage.unowned"].status == "pass"
    row = checks["coverage.scan"].value["table"][0]
    assert row["gpus"] == {"sm_80": "native", "sm_90": "native"}
    assert row["gaps"] == {"sm_80": "1/2"}
    table = render_coverage(list(checks.values())).splitlines()
    assert table[2] == "unowned       lib/libmix.so  native*  native"
    assert table[3].startswith("* some of the library's fat binaries")


def test_stub_cubins_and_fat_binaries_a_library_loads_itself(tmp_path: Path) -> None:
    """cuFFT's shape: its registered fat binary is a device-link stub (an sm_75 cubin without
    any .text section), its kernels are fat binaries in .ldata that it loads itself."""
    stub = elf({".nv.info": b"\0" * 8})
    kernel = elf({".text.axpy": b"\0" * 16})
    loaded = [fatbin(fatbin_entry(SASS, 80, payload=kernel),
                     fatbin_entry(SASS, 90, payload=kernel)),
              fatbin(fatbin_entry(SASS, 100, payload=kernel), fatbin_entry(PTX, 100))]
    junk = b"\x50\xed\x55\xba\x01\x00\x10\x00" + b"\xff" * 8 + b"\x07\x00" * 40  # magic, bad body
    data = b"\x11" * 100 + junk + loaded[0] + b"\0" * 12 + loaded[1] + b"\x22" * 50
    path = write(tmp_path, "site/fft/libfft.so", elf({
        ".nv_fatbin": fatbin(fatbin_entry(SASS, 75, payload=stub)), ".ldata": data,
        ".text": b"\x90" * 8}))
    code = read_device_code(path)
    assert code is not None and not code.problems
    assert [(i.name, i.empty) for i in code.cuda] == [("sm_75", True)]  # what cuobjdump lists
    assert [[i.name for i in g] for g in code.cuda_loaded] == [["sm_80", "sm_90"],
                                                               ["sm_100", "compute_100"]]
    checks = by_id(check_coverage(run_for(["sm_80", "sm_100", "sm_120"]), [str(tmp_path / "site")]))
    c = checks["coverage.unowned"]
    assert c.status == "warn" and c.value == {"sm_80": "native", "sm_100": "native",
                                              "sm_120": "ptx-jit"}
    assert checks["coverage.scan"].value["table"][0]["code"] == ["compute_100", "sm_100", "sm_80",
                                                                 "sm_90"]
    # the same data in a library without registered device code is not searched
    plain = write(tmp_path, "plain/libx.so", elf({".ldata": data}))
    code = read_device_code(plain)
    assert code is not None and code.empty
    # a stub alone is no device code at all: the library is not listed
    only_stub = tmp_path / "stubsite"
    write(only_stub, "libw.so", elf({".nv_fatbin": fatbin(fatbin_entry(SASS, 75, payload=stub))}))
    checks = by_id(check_coverage(run_for(["sm_80"]), [str(only_stub)]))
    assert list(checks) == ["coverage.scan"] and checks["coverage.scan"].value["libraries"] == 0
    assert checks["coverage.scan"].status == "warn"
    assert "no cuda device code under" in checks["coverage.scan"].reason


def test_a_reviewed_exception_names_its_reason_instead_of_failing() -> None:
    """coverage_allow: an arch-specific library (vLLM's FlashMLA, Hopper/Blackwell only) may
    lack code for a declared GPU; the check says so with the matrix's reason, and any other
    library without code still fails."""
    from builder.selftest.phases.coverage import Library, allowance, decide_dist
    from builder.selftest.elf.devcompat import Decision

    allow = {"vllm/_flashmla_C*.so": "FlashMLA kernels: vLLM loads them only on sm_90/sm_100"}
    gpus = ["sm_80", "sm_90"]

    def lib(path: str, sm80: str) -> Library:
        out = Library("vllm", path, ["sm_90a"], {"sm_80": Decision(sm80), "sm_90":
                                                  Decision("native")})
        out.allowed = allowance(path, allow)
        return out

    flashmla = lib("vllm/_flashmla_C.abi3.so", "none")
    check = decide_dist("vllm", [flashmla], gpus)
    assert check.status == "pass" and "allowed by the matrix: FlashMLA" in check.reason
    assert check.value == {"sm_80": "none", "sm_90": "native"}  # the value stays what was read
    other = lib("vllm/_C.abi3.so", "none")
    check = decide_dist("vllm", [flashmla, other], gpus)
    assert check.status == "fail" and "vllm/_C.abi3.so has no code for sm_80" in check.reason
    assert allowance("vllm/_C.abi3.so", allow) is None
