"""GPU checks: device count and names, compute capability / gfx arch against
``torch.cuda.get_arch_list()``, one kernel per device, which NCCL/RCCL library file is
actually loaded (from /proc/self/maps) and its version, driver vs CUDA runtime.

``decide_*`` and the parsers are pure; the step functions import torch lazily.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import re
from typing import Any

from ..manifest import GpuExpectation
from ..phase import Run, Step, gpu_skip, skip
from ..report import FAIL, PASS, SKIP, WARN, Check, threshold

PHASE = "gpu"


def decide_device_count(visible: int, expect: GpuExpectation) -> Check:
    """Visible GPUs against the expectation (``--expect-gpus N`` needs at least N)."""
    cid = "gpu.device_count"
    if not expect.expected:
        return Check(cid, PHASE, SKIP, required=False, applies=expect.applies, value=visible,
                     reason=expect.skip_reason or "GPUs not expected")
    want = expect.count
    thr = threshold(">=", want) if want else None
    if visible == 0:
        return Check(cid, PHASE, FAIL, value=0, threshold=thr,
                     reason=f"no GPU visible, {want or 'some'} expected")
    if want and visible < want:
        return Check(cid, PHASE, FAIL, value=visible, threshold=thr,
                     reason=f"{visible} GPU(s) visible, {want} expected")
    return Check(cid, PHASE, PASS, value=visible, threshold=thr)


_ARCH = re.compile(r"^(sm|compute)_(\d+)([a-z]?)$")


def cuda_arch_covered(cap: tuple[int, int], arch_list: list[str]) -> str | None:
    """The arch-list entry that runs on a device of capability ``cap``, or None.

    ``sm_XY`` runs on the same major with minor ≥ Y; ``sm_XYa`` only on exactly X.Y;
    ``sm_XYf`` on the same major with minor ≥ Y; ``compute_XY`` (PTX) JIT-compiles for any
    device ≥ X.Y."""
    major, minor = cap
    for entry in arch_list:
        m = _ARCH.match(entry)
        if not m:
            continue
        kind, digits, suffix = m.groups()
        e_major, e_minor = int(digits[:-1]), int(digits[-1])
        if kind == "compute":
            if suffix == "" and (e_major, e_minor) <= (major, minor):
                return entry
            if suffix and (e_major, e_minor) == (major, minor):
                return entry
            continue
        if suffix == "a":
            if (e_major, e_minor) == (major, minor):
                return entry
        elif e_major == major and e_minor <= minor:
            return entry
    return None


def decide_arch(index: int, name: str, cap: tuple[int, int] | None, gcn_arch: str | None,
                arch_list: list[str]) -> Check:
    """The device's sm_XY (CUDA) or gfx arch (ROCm) must be in torch's arch list."""
    cid = f"gpu.arch.{index}"
    if gcn_arch:
        base = gcn_arch.split(":")[0]
        if base in arch_list:
            return Check(cid, PHASE, PASS, value=base, reason=name)
        return Check(cid, PHASE, FAIL, value=base, threshold=threshold("in", arch_list),
                     reason=f"{name}: {base} not in torch arch list {arch_list}")
    if cap is None:
        return Check(cid, PHASE, FAIL, reason=f"{name}: no compute capability")
    sm = f"sm_{cap[0]}{cap[1]}"
    hit = cuda_arch_covered(cap, arch_list)
    if hit:
        return Check(cid, PHASE, PASS, value=sm, reason=f"{name}; runs {hit}")
    return Check(cid, PHASE, FAIL, value=sm, threshold=threshold("in", arch_list),
                 reason=f"{name}: {sm} is not covered by torch arch list {arch_list} "
                        "(no kernel image)")


def decide_kernel(index: int, max_err: float | None, error: str | None,
                  free_gib: float | None = None) -> Check:
    """A matmul + reduction on the device must run and match the CPU result."""
    cid = f"gpu.kernel.{index}"
    mem = f"; {free_gib:.1f} GiB free" if free_gib is not None else ""
    if error is not None:
        return Check(cid, PHASE, FAIL, reason=error)
    if max_err is None or max_err > 1e-2:
        return Check(cid, PHASE, FAIL, value=max_err, threshold=threshold("<=", 1e-2),
                     reason="matmul result differs from the CPU result" + mem)
    return Check(cid, PHASE, PASS, value=max_err, threshold=threshold("<=", 1e-2),
                 reason="512x512 matmul + sum match the CPU" + mem)


def loaded_libraries(maps_text: str, stems: tuple[str, ...] = ("libnccl", "librccl")) -> list[str]:
    """Distinct mapped files whose name starts with one of ``stems`` (from /proc/self/maps)."""
    found: list[str] = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        if os.path.basename(path).startswith(stems) and ".so" in path and path not in found:
            found.append(path)
    return found


def decode_nccl_version(code: int) -> str:
    """ncclGetVersion's integer: ≥ 2.9 is X*10000+Y*100+Z, older X*1000+Y*100+Z."""
    if code >= 10000:
        return f"{code // 10000}.{(code % 10000) // 100}.{code % 100}"
    return f"{code // 1000}.{(code % 1000) // 100}.{code % 100}"


def decide_nccl_library(paths: list[str], loaded_version: str | None,
                        torch_version: str | None, wheel_versions: dict[str, str],
                        required: bool, applies: bool) -> Check:
    """Exactly one NCCL/RCCL file loaded, its version equal to what torch reports and to the
    nvidia-nccl wheel's version when one is installed (duplicate libraries: PITFALLS #11)."""
    cid = "gpu.nccl_library"
    real = sorted({os.path.realpath(p) for p in paths})
    if len(real) > 1:
        return Check(cid, PHASE, FAIL, required=required, applies=applies, value=real,
                     reason="more than one NCCL/RCCL library loaded in one process")
    version = loaded_version or torch_version
    value = {"file": real[0] if real else "static (in libtorch)", "version": version}
    if torch_version and loaded_version and torch_version != loaded_version:
        return Check(cid, PHASE, FAIL, required=required, applies=applies, value=value,
                     reason=f"loaded library is {loaded_version}, torch reports {torch_version}")
    for dist, wv in sorted(wheel_versions.items()):
        if version and not wv.startswith(version):
            return Check(cid, PHASE, FAIL, required=required, applies=applies, value=value,
                         reason=f"{dist} wheel is {wv} but the process loads {version} "
                                f"from {value['file']}")
    if version is None:
        return Check(cid, PHASE, FAIL, required=required, applies=applies, value=value,
                     reason="no NCCL/RCCL version could be read")
    return Check(cid, PHASE, PASS, required=required, applies=applies, value=value)


def decode_cuda_version(code: int) -> str:
    """cuDriverGetVersion's integer: 12040 → ``12.4``."""
    return f"{code // 1000}.{(code % 1000) // 10}"


def decide_driver(driver_cuda: str | None, runtime: str | None, driver: str | None,
                  rocm: bool) -> Check:
    """The driver must support the CUDA runtime torch was built with: an older major fails
    (e.g. CUDA 13 needs R580+), an older minor warns (minor-version compatibility)."""
    cid = "gpu.driver"
    if rocm:
        return skip(cid, PHASE, "no driver/runtime rule for ROCm (versions recorded)",
                    value={"hip": runtime, "amdgpu": driver})
    value = {"driver": driver, "driver_cuda": driver_cuda, "runtime_cuda": runtime}
    if driver_cuda is None or runtime is None:
        return Check(cid, PHASE, FAIL, value=value,
                     reason="cannot read the driver's CUDA version (libcuda.so.1)")
    have = tuple(int(x) for x in driver_cuda.split(".")[:2])
    want = tuple(int(x) for x in runtime.split(".")[:2])
    thr = threshold(">=", runtime, "driver CUDA version vs torch's CUDA runtime")
    if have[0] < want[0]:
        return Check(cid, PHASE, FAIL, value=value, threshold=thr,
                     reason=f"driver supports CUDA {driver_cuda}, image needs {runtime}")
    if have < want:
        return Check(cid, PHASE, WARN, value=value, threshold=thr,
                     reason=f"driver CUDA {driver_cuda} < runtime {runtime}: minor-version "
                            "compatibility only")
    return Check(cid, PHASE, PASS, value=value, threshold=thr)


def probe_driver_cuda() -> str | None:
    """cuDriverGetVersion via libcuda.so.1."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            return decode_cuda_version(v.value)
    except (OSError, AttributeError):
        pass
    return None


def read_text(path: str) -> str | None:
    """A file's text or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def probe_nccl_library(torch: Any) -> tuple[list[str], str | None, str | None, dict[str, str]]:
    """(mapped files, version from the loaded file, torch's version, nccl wheel versions)."""
    paths = loaded_libraries(read_text("/proc/self/maps") or "")
    loaded = None
    for p in paths:
        try:
            v = ctypes.c_int()
            if ctypes.CDLL(p).ncclGetVersion(ctypes.byref(v)) == 0:
                loaded = decode_nccl_version(v.value)
                break
        except (OSError, AttributeError):
            continue
    try:
        tv = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001 - CPU builds raise AttributeError
        tv = None
    wheels = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith("nvidia-nccl"):
            wheels[name] = dist.version
    return paths, loaded, tv, wheels


def detect_plan(run: Run) -> list[Step]:
    """Internal phase: how many GPUs torch sees (decides ``--expect-gpus auto``)."""

    def detect(r: Run) -> Check:
        import torch  # type: ignore[import-not-found]

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        r.fact("detect.gpu_count", n)
        return Check("gpu.detect", PHASE, PASS, value=n, reason="GPUs torch sees")

    return [Step(("gpu.detect",), detect)]


def plan(run: Run) -> list[Step]:
    """Steps depend on what torch sees: per-device steps only when GPUs are visible."""
    expect = run.expect
    if run.accelerator == "cpu" and not expect.expected:
        ids = ("gpu.device_count", "gpu.arch", "gpu.kernel", "gpu.driver", "gpu.nccl_library")
        return [Step((cid,), (lambda r, cid=cid: gpu_skip(cid, PHASE, expect)), required=False,
                     applies=False) for cid in ids]
    import torch  # type: ignore[import-not-found]

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    rocm = getattr(torch.version, "hip", None) is not None
    gpu_build = rocm or getattr(torch.version, "cuda", None) is not None
    req = expect.expected

    def nccl(r: Run) -> Check:
        if not gpu_build:
            return skip("gpu.nccl_library", PHASE, "CPU-only torch build: no NCCL/RCCL",
                        required=req, applies=expect.applies)
        if visible:
            torch.cuda.init()
        paths, loaded, tv, wheels = probe_nccl_library(torch)
        if tv:
            r.fact("versions.nccl", tv)
        return decide_nccl_library(paths, loaded, tv, wheels, req, expect.applies)

    def count(r: Run) -> Check:
        r.fact("platform.gpu_count", visible)
        return decide_device_count(visible, expect)

    steps = [Step(("gpu.device_count",), count, required=req, applies=expect.applies)]
    if visible == 0 or not req:
        def not_run(cid: str) -> Step:
            def fn(r: Run) -> Check:
                if not req:
                    return gpu_skip(cid, PHASE, expect)
                return skip(cid, PHASE, "no GPU visible", required=True)
            return Step((cid,), fn, required=req, applies=expect.applies)

        steps += [not_run(cid) for cid in ("gpu.arch", "gpu.kernel", "gpu.driver")]
        steps.append(Step(("gpu.nccl_library",), nccl, required=req, applies=expect.applies))
        return steps

    steps += _device_steps(torch, visible, rocm)
    steps += [Step(("gpu.nccl_library",), nccl), _driver_step(torch, rocm)]
    return steps


def _device_steps(torch: Any, visible: int, rocm: bool) -> list[Step]:
    """Per visible device: its architecture against the build's arch list, and a small kernel."""
    arch_list = list(torch.cuda.get_arch_list())
    gpus: list[dict[str, Any]] = []
    steps: list[Step] = []
    for i in range(visible):

        def arch(r: Run, i: int = i) -> Check:
            p = torch.cuda.get_device_properties(i)
            gcn = getattr(p, "gcnArchName", None) if rocm else None
            info = {"index": i, "name": p.name, "cc": f"{p.major}.{p.minor}",
                    "arch": gcn.split(":")[0] if gcn else f"sm_{p.major}{p.minor}",
                    "memory_gib": round(p.total_memory / 2**30, 1)}
            gpus.append(info)
            r.fact("platform.gpus", gpus)
            return decide_arch(i, p.name, (p.major, p.minor), gcn, arch_list)

        def kernel(r: Run, i: int = i) -> Check:
            try:
                dev = torch.device("cuda", i)
                g = torch.Generator().manual_seed(i)
                a, b = torch.randn(512, 512, generator=g), torch.randn(512, 512, generator=g)
                ref = (a @ b).sum(dim=0)
                out = (a.to(dev) @ b.to(dev)).sum(dim=0)
                torch.cuda.synchronize(dev)
                # max error relative to the largest value: robust to TF32 and to sums near 0
                err = float((out.cpu() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
                free, _total = torch.cuda.mem_get_info(i)
                return decide_kernel(i, err, None, free / 2**30)
            except RuntimeError as e:
                return decide_kernel(i, None, f"{type(e).__name__}: {e}")

        steps += [Step((f"gpu.arch.{i}",), arch), Step((f"gpu.kernel.{i}",), kernel)]
    return steps


def _driver_step(torch: Any, rocm: bool) -> Step:
    """The driver against the runtime torch was built with (CUDA or HIP)."""

    def driver(r: Run) -> Check:
        if rocm:
            return decide_driver(None, torch.version.hip,
                                 read_text("/sys/module/amdgpu/version"), True)
        drv = (read_text("/proc/driver/nvidia/version") or "").splitlines()
        m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9.]+)", drv[0]) if drv else None
        r.fact("platform.driver", m.group(1) if m else None)
        return decide_driver(probe_driver_cuda(), torch.version.cuda,
                             m.group(1) if m else None, False)

    return Step(("gpu.driver",), driver)
