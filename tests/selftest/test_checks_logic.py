"""Pure logic of imports, versions, CPU, GPU, Ray and the all-reduce verdict."""

from __future__ import annotations

import pytest

from builder.selftest.phases import gpu, imports, rayphase, versions
from builder.selftest.manifest import resolve_expectation
from .helpers import catalog_manifest
from builder.selftest.launch.ranks import SpawnResult, decide_allreduce, human_bytes

BUILD_HOST = resolve_expectation(None, "cuda", 0)
EIGHT = resolve_expectation(None, "cuda", 8)


def test_decide_import() -> None:
    ok = imports.decide_import("imports.vllm", "vllm", None, "0.24.0")
    assert ok.status == "pass" and ok.value == "0.24.0"
    bad = imports.decide_import("imports.vllm._C", "vllm._C", "ImportError: undefined symbol", None)
    assert bad.status == "fail" and bad.required and "undefined symbol" in bad.reason


def test_import_plan_follows_manifest() -> None:
    from builder.selftest.phase import Run

    run = Run(ctx={"manifest": {"imports": {"vllm": "vllm", "verl": "verl",
                                            "flash-attn": "flash_attn"},
                                "extensions": catalog_manifest()["extensions"]}})
    ids = [s.id for s in imports.plan(run)]
    assert ids == ["imports.flash-attn", "imports.verl", "imports.verl.single_controller",
                   "imports.vllm", "imports.vllm._C"]
    assert imports.plan(Run(ctx={"manifest": {"imports": {}}})) == []


class TestVersions:
    def test_pin(self) -> None:
        assert versions.decide_pin("torch", "2.13.0", "2.13.0+cpu").status == "pass"
        miss = versions.decide_pin("verl", "0.9.1", None)
        assert miss.status == "fail" and "not installed" in miss.reason
        wrong = versions.decide_pin("ray", "2.60.0", "2.59.0")
        assert wrong.status == "fail" and wrong.threshold["value"] == "2.60.0"
        prov = versions.decide_pin("vllm", "0.9.2", "0.9.2", kind="provided")
        assert prov.id == "versions.provided.vllm" and "provided" in prov.threshold["basis"]

    def test_evaluate_requirements(self) -> None:
        req = pytest.importorskip("packaging.requirements").Requirement
        have = {"ray": "2.60.0", "tensordict": "0.9.0", "numpy": "2.1.0"}
        reqs = ["ray[default]>=2.41.0", "tensordict>=0.8.0,<=0.10.0,!=0.9.0", "numpy<2.0.0",
                "codetiming", "vllm>=0.8.5; extra == 'vllm'",
                "pywin32; sys_platform == 'win32'"]
        applied, bad = versions.evaluate_requirements(reqs, have.get, req)
        assert applied == 4
        assert bad == ["tensordict 0.9.0 not in !=0.9.0,<=0.10.0,>=0.8.0",
                       "numpy 2.1.0 not in <2.0.0", "codetiming missing (needs any)"]

    def test_prereleases_are_allowed(self) -> None:
        req = pytest.importorskip("packaging.requirements").Requirement
        assert versions.evaluate_requirements(["torch>=2.9"], {"torch": "2.10.0a0+git"}.get,
                                              req) == (1, [])

    def test_verl_requires_decisions(self) -> None:
        s = versions.decide_verl_requires(None, True)
        assert s.status == "skip" and s.required and s.reason == "verl is not installed"
        s = versions.decide_verl_requires("0.9.1", False)
        assert s.status == "skip" and s.required and "packaging is not installed" in s.reason
        assert versions.decide_verl_requires("0.9.1", True, 30, []).status == "pass"
        f = versions.decide_verl_requires("0.9.1", True, 30, ["numpy 2.1 not in <2"])
        assert f.status == "fail" and f.value == 1

    @pytest.mark.parametrize("v, status", [("2.39.0", "fail"), ("2.40.0", "pass"),
                                           ("2.60.0", "pass"), (None, "fail")])
    def test_ray_min(self, v: str | None, status: str) -> None:
        assert versions.decide_ray_min(v).status == status

    @pytest.mark.parametrize("acc, cuda, hip, want_cuda, status", [
        ("cpu", None, None, None, "pass"),
        ("cuda", None, None, "13.0", "fail"),          # CPU torch in a CUDA image
        ("cuda", "13.0", None, "13.0", "pass"),
        ("cuda", "12.8", None, "13.0", "fail"),        # major mismatch
        ("cuda", "13.1", None, "13.0", "warn"),        # minor mismatch
        ("rocm", None, "6.4.1", None, "pass"),
        ("rocm", "13.0", None, None, "fail"),
    ])
    def test_torch_build(self, acc: str, cuda: str | None, hip: str | None,
                         want_cuda: str | None, status: str) -> None:
        assert versions.decide_torch_build(acc, cuda, hip, want_cuda, None).status == status

    def test_version_tuple(self) -> None:
        assert versions.version_tuple("2.40.0rc1") == (2, 40, 0)
        assert versions.version_tuple("junk") == ()


class TestAllreduceDecision:
    def res(self, **kw) -> SpawnResult:
        base = dict(backend="gloo", world=2, timeout=10.0,
                    results=[{"wrong": 0, "check_numel": 1 << 20, "expected": 3.0,
                              "busbw": 1.5, "bw_bytes": 16 << 20}] * 2, rcs=[0, 0])
        base.update(kw)
        return SpawnResult(**base)

    def test_pass(self) -> None:
        c = decide_allreduce("cpu.gloo_allreduce", "cpu", self.res(), transport="gloo/tcp")
        assert c.status == "pass" and c.value == 0 and "2 ranks over gloo/tcp" in c.reason
        assert "busbw 1.50 GB/s at 16 MiB" in c.reason

    def test_hung(self) -> None:
        c = decide_allreduce("x", "cpu", self.res(hung=[0, 1], results=[None, None]))
        assert c.status == "fail" and "did not finish within 10 s" in c.reason

    def test_crashed_rank(self) -> None:
        c = decide_allreduce("x", "cpu", self.res(results=[{"wrong": 0}, None], rcs=[0, -11],
                                                  tails={1: "Segmentation fault"}))
        assert c.status == "fail" and "rank 1 killed by SIGSEGV" in c.reason

    def test_wrong_elements(self) -> None:
        r = [{"wrong": 7, "check_numel": 4, "expected": 3.0, "observed_first": 2.0}] * 2
        c = decide_allreduce("x", "cpu", self.res(results=r))
        assert c.status == "fail" and c.value == 7

    def test_human_bytes(self) -> None:
        assert human_bytes(1 << 30) == "1 GiB" and human_bytes(100) == "100 B"


class TestGpu:
    def test_device_count(self) -> None:
        s = gpu.decide_device_count(0, BUILD_HOST)
        assert s.status == "skip" and not s.required and s.reason == "no GPU visible (build host)"
        assert gpu.decide_device_count(8, EIGHT).status == "pass"
        two = resolve_expectation(2, "cuda", 0)
        assert gpu.decide_device_count(0, two).status == "fail"
        assert gpu.decide_device_count(1, two).status == "fail"
        assert gpu.decide_device_count(4, two).status == "pass"
        cpu_t = gpu.decide_device_count(0, resolve_expectation(None, "cpu", 0))
        assert cpu_t.status == "skip" and not cpu_t.applies

    @pytest.mark.parametrize("cap, arch, hit", [
        ((9, 0), ["sm_80", "sm_90"], "sm_90"),
        ((8, 6), ["sm_80"], "sm_80"),                       # same major, lower minor
        ((8, 0), ["sm_86"], None),                          # higher minor does not run
        ((9, 0), ["sm_80"], None),                          # other major, no PTX
        ((9, 0), ["sm_80", "compute_80"], "compute_80"),    # PTX JIT forward
        ((9, 0), ["sm_90a"], "sm_90a"),
        ((10, 0), ["sm_90a"], None),                        # arch-specific: exact only
        ((10, 3), ["sm_100f"], "sm_100f"),                  # family-specific
        ((12, 0), ["sm_100", "sm_120"], "sm_120"),
        ((12, 0), ["sm_100"], None),
    ])
    def test_cuda_arch(self, cap: tuple[int, int], arch: list[str], hit: str | None) -> None:
        assert gpu.cuda_arch_covered(cap, arch) == hit

    def test_decide_arch(self) -> None:
        assert gpu.decide_arch(0, "H100", (9, 0), None, ["sm_90"]).status == "pass"
        bad = gpu.decide_arch(1, "B200", (10, 0), None, ["sm_90"])
        assert bad.status == "fail" and bad.id == "gpu.arch.1" and "no kernel image" in bad.reason
        rocm = gpu.decide_arch(0, "MI300X", (9, 4), "gfx942:sramecc+:xnack-", ["gfx90a", "gfx942"])
        assert rocm.status == "pass" and rocm.value == "gfx942"
        assert gpu.decide_arch(0, "MI355X", (9, 5), "gfx950", ["gfx942"]).status == "fail"

    def test_kernel(self) -> None:
        assert gpu.decide_kernel(0, 1e-6, None, 70.0).status == "pass"
        assert gpu.decide_kernel(0, 0.5, None).status == "fail"
        e = gpu.decide_kernel(3, None, "RuntimeError: no kernel image is available")
        assert e.status == "fail" and e.id == "gpu.kernel.3"

    MAPS = """\
7f00-7f01 r-xp 00000000 08:01 1 /opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
7f01-7f02 r--p 00001000 08:01 1 /opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
7f03-7f04 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5
7f05-7f06 r-xp 00000000 08:01 3 /usr/lib/libc.so.6
7f07-7f08 rw-p 00000000 00:00 0 [heap]
"""

    def test_loaded_libraries(self) -> None:
        assert gpu.loaded_libraries(self.MAPS) == [
            "/opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
            "/usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5"]
        assert gpu.loaded_libraries("7f-7f r-xp 0 0:0 1 /opt/rocm/lib/librccl.so.1\n") == [
            "/opt/rocm/lib/librccl.so.1"]

    @pytest.mark.parametrize("code, text", [(22105, "2.21.5"), (2708, "2.7.8"),
                                            (22703, "2.27.3")])
    def test_decode_nccl_version(self, code: int, text: str) -> None:
        assert gpu.decode_nccl_version(code) == text

    def test_nccl_library(self) -> None:
        one = ["/venv/nvidia/nccl/lib/libnccl.so.2"]
        ok = gpu.decide_nccl_library(one, "2.27.3", "2.27.3", {"nvidia-nccl-cu13": "2.27.3"},
                                     True, True)
        assert ok.status == "pass" and ok.value["version"] == "2.27.3"
        dup = gpu.decide_nccl_library(one + ["/usr/lib/libnccl.so.2"], "2.27.3", "2.27.3", {},
                                      True, True)
        assert dup.status == "fail" and "more than one" in dup.reason
        wheel = gpu.decide_nccl_library(one, "2.21.5", "2.21.5", {"nvidia-nccl-cu12": "2.27.3"},
                                        True, True)
        assert wheel.status == "fail" and "wheel is 2.27.3" in wheel.reason
        torch_mm = gpu.decide_nccl_library(one, "2.21.5", "2.27.3", {}, True, True)
        assert torch_mm.status == "fail"
        static = gpu.decide_nccl_library([], None, "2.27.3", {}, False, True)
        assert static.status == "pass" and static.value["file"].startswith("static")
        none = gpu.decide_nccl_library([], None, None, {}, True, True)
        assert none.status == "fail"

    def test_driver(self) -> None:
        assert gpu.decode_cuda_version(12040) == "12.4"
        assert gpu.decide_driver("13.0", "13.0", "580.65", False).status == "pass"
        old = gpu.decide_driver("12.8", "13.0", "570.1", False)
        assert old.status == "fail" and "needs 13.0" in old.reason
        assert gpu.decide_driver("13.0", "13.1", "580.1", False).status == "warn"
        assert gpu.decide_driver(None, "13.0", None, False).status == "fail"
        r = gpu.decide_driver(None, "6.4.1", "6.10.5", True)
        assert r.status == "skip" and not r.required


class TestRay:
    def test_start(self) -> None:
        assert rayphase.decide_start(42, None, "2.60.0").status == "pass"
        assert rayphase.decide_start(None, "RuntimeError: GCS", None).status == "fail"
        assert rayphase.decide_start(41, None, "2.60.0").status == "fail"

    def test_gpu_task_skips(self) -> None:
        s = rayphase.decide_gpu_task(BUILD_HOST, 0, None, None, None)
        assert s.status == "skip" and not s.required and s.reason == "no GPU visible (build host)"
        s = rayphase.decide_gpu_task(resolve_expectation(2, "cuda", 0), 0, None, None, None)
        assert s.status == "skip" and s.required

    def test_gpu_task(self) -> None:
        task = {"count": 1, "ok": True, "visible": "3"}
        assert rayphase.decide_gpu_task(EIGHT, 8, 8.0, task, None).status == "pass"
        assert rayphase.decide_gpu_task(EIGHT, 8, 4.0, task, None).status == "fail"
        many = {"count": 8, "ok": True, "visible": None}
        assert rayphase.decide_gpu_task(EIGHT, 8, 8.0, many, None).status == "fail"
        assert rayphase.decide_gpu_task(EIGHT, 8, 8.0, many, None, noset=True).status == "pass"
        assert rayphase.decide_gpu_task(EIGHT, 8, None, None, "Timeout").status == "fail"


def test_compiled_extension_without_a_driver_is_a_skip_not_a_pass() -> None:
    err = "ImportError: libcuda.so.1: cannot open shared object file: No such file or directory"
    c = imports.decide_extension("imports.vllm._C", "vllm._C_stable_libtorch", err, None,
                                 gpus_expected=False)
    assert c.status == "skip" and not c.required and "libcuda.so" in c.reason
    c = imports.decide_extension("imports.vllm._C", "vllm._C_stable_libtorch", err, None,
                                 gpus_expected=True)
    assert c.status == "fail"
    c = imports.decide_extension("imports.vllm._C", "vllm._C", "ImportError: undefined symbol: x",
                                 None, gpus_expected=False)
    assert c.status == "fail"  # a broken build is a failure, driver or not
    ok = imports.decide_extension("imports.vllm._C", "vllm._C", None, None, gpus_expected=False)
    assert ok.status == "pass"


def test_first_existing_extension_name() -> None:
    assert imports.first_existing(("no_such_mod_x", "json")) == "json"
    assert imports.first_existing(("no_such_mod_x", "no_such_mod_y")) == "no_such_mod_x"
