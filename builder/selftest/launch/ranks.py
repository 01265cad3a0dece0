"""Spawn N local ranks (``rank.py``), wait with a deadline, kill the ones that hang, and
judge the result (``decide_allreduce`` is pure)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from ..phases.bandwidth import expand_debug_file
from . import rank
from .forked import ForkedRank
from ..report import FAIL, PASS, Check, threshold
from ..runner import describe_rc, summarize_log


@dataclass
class SpawnResult:
    """What came back from the ranks."""

    backend: str
    world: int
    timeout: float
    results: list[dict[str, Any] | None] = field(default_factory=list)
    rcs: list[int | None] = field(default_factory=list)
    hung: list[int] = field(default_factory=list)
    tails: dict[int, str] = field(default_factory=dict)
    nccl_logs: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def spawn_local(backend: str, world: int, devices: list[str], check_bytes: int,
                bw_bytes: int, iters: int, warmup: int, timeout: float,
                env_extra: dict[str, str] | None = None, workdir: str | None = None,
                fork: bool = False) -> SpawnResult:
    """Run ``world`` rank processes (device ``devices[r]``) and collect their results.
    Their scratch dir goes under ``workdir`` (the run's, removed by the CLI) when given.
    ``fork``: each rank forked from this process (CPU ranks only, torch imported here
    already: :mod:`.forked`) instead of started as a new interpreter."""
    pkg = __package__ or "verl_env_selftest.launch"
    tmp = tempfile.mkdtemp(prefix="vst-ranks-",
                           dir=workdir if workdir and os.path.isdir(workdir) else None)
    res = SpawnResult(backend, world, timeout)
    env = dict(os.environ)
    if backend == "gloo":
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # all ranks are local
    if backend == "nccl":
        env["NCCL_DEBUG"] = "INFO"
        env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
        env.setdefault("NCCL_DEBUG_FILE", os.path.join(tmp, "nccl.%h.%p.log"))
    env.update(env_extra or {})
    procs: list[subprocess.Popen[bytes] | ForkedRank] = []
    t0 = time.monotonic()
    try:
        for r in range(world):
            args = ["--backend", backend, "--rank", str(r), "--world", str(world),
                    "--store", os.path.join(tmp, "store"), "--device", devices[r],
                    "--check-bytes", str(check_bytes), "--bw-bytes", str(bw_bytes),
                    "--iters", str(iters), "--warmup", str(warmup), "--timeout", str(timeout),
                    "--out", os.path.join(tmp, f"rank{r}.json")]
            log_path = os.path.join(tmp, f"rank{r}.log")
            if fork:
                procs.append(ForkedRank(rank.main, args, log_path, env))
                continue
            with open(log_path, "wb") as log:
                procs.append(subprocess.Popen([sys.executable, "-m", f"{pkg}.rank", *args],
                                              stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, env=env))
        deadline = t0 + timeout
        for r, p in enumerate(procs):
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                res.hung.append(r)
        for r in res.hung:
            procs[r].kill()
            procs[r].wait()
        res.wall_s = time.monotonic() - t0
        for r, p in enumerate(procs):
            res.rcs.append(None if r in res.hung else p.returncode)
            try:
                with open(os.path.join(tmp, f"rank{r}.json"), encoding="utf-8") as f:
                    res.results.append(json.load(f))
            except (OSError, ValueError):
                res.results.append(None)
                with open(os.path.join(tmp, f"rank{r}.log"), encoding="utf-8",
                          errors="replace") as f:
                    res.tails[r] = summarize_log(f.read())
        pattern = env.get("NCCL_DEBUG_FILE")
        files = set(glob.glob(os.path.join(tmp, "nccl.*.log")))
        if pattern and backend == "nccl":
            for rr in res.results:
                if rr:
                    files.add(expand_debug_file(pattern, str(rr.get("host")), int(rr["pid"])))
        for path in sorted(files):
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    res.nccl_logs.append(f.read())
            except OSError:
                pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def human_bytes(n: int) -> str:
    """``1073741824`` → ``1 GiB``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def decide_allreduce(cid: str, phase: str, res: SpawnResult, required: bool = True,
                     transport: str = "") -> Check:
    """Every rank must finish in time and the sum must be exact (0 wrong elements)."""
    thr = threshold("==", 0, "exact: every element equals n(n+1)/2")
    label = f"{res.world} rank{'s' if res.world != 1 else ''} over " + (transport or res.backend)
    if res.hung:
        return Check(cid, phase, FAIL, required=required,
                     reason=f"{label}: rank(s) {res.hung} did not finish within "
                            f"{res.timeout:.0f} s (killed; hung collective)")
    broken = [r for r, out in enumerate(res.results) if out is None]
    if broken:
        r = broken[0]
        rc = res.rcs[r]
        return Check(cid, phase, FAIL, required=required,
                     reason=f"{label}: rank {r} {describe_rc(rc) if rc is not None else ''}: "
                            f"{res.tails.get(r, '')}")
    first = res.results[0] or {}
    wrong = int(first.get("wrong", -1))
    detail = f"{label}, {human_bytes(int(first.get('check_numel', 0)) * 4)} fp32"
    if first.get("busbw") is not None:
        detail += f", busbw {first['busbw']:.2f} GB/s at {human_bytes(first['bw_bytes'])}"
    if wrong != 0:
        return Check(cid, phase, FAIL, required=required, value=wrong, unit="wrong elements",
                     threshold=thr, reason=f"{detail}: expected {first.get('expected')}, "
                                           f"e.g. got {first.get('observed_first')}")
    return Check(cid, phase, PASS, required=required, value=0, unit="wrong elements",
                 threshold=thr, reason=detail)
