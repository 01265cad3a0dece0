"""Pre-flight: /dev/shm, memlock, /dev/infiniband, /dev/kfd + /dev/dri (ROCm), libibverbs.

Stdlib only. ``decide_*`` are pure; ``probe_*`` read the machine.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import sys

from ..manifest import GpuExpectation
from ..phase import Run, Step, skip
from ..report import FAIL, PASS, WARN, Check, threshold

PHASE = "preflight"
GiB = 2**30
SHM_MIN = 1 * GiB
RAY_SHM_FRACTION = 0.3


def decide_shm(total: int | None, ram: int | None, gpus_expected: bool) -> Check:
    """/dev/shm size: below 1 GiB NCCL can fail to initialise (fail when GPUs are expected,
    warn otherwise); below 30% of RAM Ray puts its object store in /tmp (warn)."""
    cid = "preflight.shm"
    if total is None:
        return Check(cid, PHASE, FAIL, reason="/dev/shm is missing")
    gib = total / GiB
    basis = "NCCL needs >= 1 GiB (Docker default is 64 MiB: use --shm-size or --ipc=host)"
    thr = threshold(">=", 1.0, basis)
    if total < SHM_MIN:
        status = FAIL if gpus_expected else WARN
        why = "GPUs expected" if gpus_expected else "no GPU expected, so only a warning"
        return Check(cid, PHASE, status, value=gib, unit="GiB", threshold=thr,
                     reason=f"/dev/shm is {gib:.2f} GiB < 1 GiB ({why})")
    if ram and total < RAY_SHM_FRACTION * ram:
        return Check(cid, PHASE, WARN, value=gib, unit="GiB", threshold=thr,
                     reason=f"/dev/shm below 30% of RAM ({ram / GiB:.0f} GiB): Ray will put "
                            "its object store in /tmp")
    return Check(cid, PHASE, PASS, value=gib, unit="GiB", threshold=thr, reason="")


def decide_memlock(soft: int, unlimited: int, rdma_devices: bool) -> Check:
    """memlock: unlimited passes; a limit is a failure when RDMA devices are present (NCCL
    cannot register memory for IB), a warning otherwise."""
    cid = "preflight.memlock"
    thr = threshold("==", "unlimited", "NCCL docs: --ulimit memlock=-1")
    if soft == unlimited:
        return Check(cid, PHASE, PASS, value="unlimited", threshold=thr)
    kib = soft // 1024
    if rdma_devices:
        return Check(cid, PHASE, FAIL, value=kib, unit="KiB", threshold=thr,
                     reason="memlock is limited while /dev/infiniband is present: "
                            "RDMA memory registration will fail")
    return Check(cid, PHASE, WARN, value=kib, unit="KiB", threshold=thr,
                 reason="memlock is limited (fine on one node; set --ulimit memlock=-1 for IB)")


def decide_infiniband(devices: list[str] | None) -> Check:
    """/dev/infiniband: recorded when present; absent is a (not required) skip."""
    cid = "preflight.infiniband"
    if not devices:
        return skip(cid, PHASE, "no /dev/infiniband (no RDMA device passed in; "
                                "multi-node NCCL would use sockets)", applies=False)
    return Check(cid, PHASE, PASS, required=False, applies=False, value=sorted(devices))


def decide_rocm_devices(kfd: bool, dri: bool, accelerator: str,
                        expect: GpuExpectation) -> Check | None:
    """ROCm targets need /dev/kfd and /dev/dri in the container (None on other targets)."""
    if accelerator != "rocm":
        return None
    cid = "preflight.rocm_devices"
    missing = [p for p, ok in (("/dev/kfd", kfd), ("/dev/dri", dri)) if not ok]
    if not missing:
        return Check(cid, PHASE, PASS, value=["/dev/kfd", "/dev/dri"])
    if expect.expected:
        return Check(cid, PHASE, FAIL, value=missing,
                     reason=f"missing {', '.join(missing)} (pass --device /dev/kfd "
                            "--device /dev/dri, or apptainer --rocm)")
    return skip(cid, PHASE, expect.skip_reason or "GPUs not expected", applies=expect.applies)


def decide_libibverbs(found: str | None, accelerator: str) -> Check:
    """libibverbs in the image: without it NCCL/RCCL silently fall back to sockets across
    nodes (a warning: single-node work is unaffected)."""
    cid = "preflight.libibverbs"
    if accelerator == "cpu":
        return skip(cid, PHASE, "cpu target: RDMA is not used", applies=False)
    if found:
        return Check(cid, PHASE, PASS, required=False, value=found)
    return Check(cid, PHASE, WARN, required=False,
                 reason="libibverbs.so.1 cannot be loaded: NCCL/RCCL will use sockets "
                        "between nodes (install libibverbs1 librdmacm1 in the image)")


def decide_node_devices(listed: str | None, present: dict[str, bool]) -> Check:
    """The device paths the Slurm job found on the node and bound into the container
    (``VERL_ENV_NODE_DEVICES``: NVL72's IMEX channels) must be there inside it; recorded."""
    cid = "preflight.node_devices"
    wanted = [d for d in (listed or "").split(",") if d.strip()]
    if not wanted:
        return skip(cid, PHASE, "no node devices listed by the job (no IMEX channels on this "
                                "node, or not run by the generated Slurm job)", applies=False)
    missing = [d for d in wanted if not present.get(d)]
    if missing:
        return Check(cid, PHASE, FAIL, value=wanted,
                     reason=f"the node has {', '.join(missing)} but the container does not "
                            "(multi-node NVLink needs the IMEX channels inside)")
    return Check(cid, PHASE, PASS, value=wanted, reason="every node device is in the container")


def probe_shm(path: str = "/dev/shm") -> int | None:
    """Total size of /dev/shm in bytes, or None if missing."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def probe_ram() -> int | None:
    """Physical memory in bytes."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def probe_ib_devices(path: str = "/dev/infiniband") -> list[str] | None:
    """Entries of /dev/infiniband, or None if absent."""
    try:
        return os.listdir(path)
    except OSError:
        return None


def probe_libibverbs() -> str | None:
    """The soname that loads, or None."""
    for name in ("libibverbs.so.1", "libibverbs.so"):
        try:
            ctypes.CDLL(name)
            return name
        except OSError:
            continue
    return None


def plan(run: Run) -> list[Step]:
    """The preflight steps."""
    acc, expect = run.accelerator, run.expect

    def shm(r: Run) -> Check:
        r.fact("platform.machine", platform.machine())
        r.fact("platform.kernel", platform.release())
        r.fact("versions.python", platform.python_version())
        r.fact("platform.executable", sys.executable)
        return decide_shm(probe_shm(), probe_ram(), expect.expected)

    def memlock(r: Run) -> Check:
        soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        return decide_memlock(soft, resource.RLIM_INFINITY, bool(probe_ib_devices()))

    def rocm(r: Run) -> Check:
        c = decide_rocm_devices(os.path.exists("/dev/kfd"), os.path.isdir("/dev/dri"), acc,
                                expect)
        assert c is not None
        return c

    steps = [
        Step(("preflight.shm",), shm),
        Step(("preflight.memlock",), memlock),
        Step(("preflight.infiniband",), lambda r: decide_infiniband(probe_ib_devices()),
             required=False, applies=False),
    ]
    if acc == "rocm":
        steps.append(Step(("preflight.rocm_devices",), rocm, required=expect.expected,
                          applies=expect.applies))
    listed = os.environ.get("VERL_ENV_NODE_DEVICES")
    steps.append(Step(("preflight.node_devices",), lambda r: decide_node_devices(
        listed, {d: os.path.exists(d) for d in (listed or "").split(",") if d}),
        required=bool(listed), applies=bool(listed)))
    steps.append(Step(("preflight.libibverbs",), lambda r: decide_libibverbs(
        probe_libibverbs(), acc), required=False, applies=acc != "cpu"))
    return steps
