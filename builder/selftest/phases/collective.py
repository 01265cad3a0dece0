"""Collective phase, standalone: one NCCL/RCCL rank per visible GPU (FileStore rendezvous),
exact all-reduce correctness, then bus bandwidth at ``--bw-size`` (default 1 GiB) judged
against the reference table, and the transport NCCL reports.

Under torchrun/srun the collective spans all ranks instead: see ``distributed.py``.
"""

from __future__ import annotations

import os
from typing import Any

from .bandwidth import (WARN_FRAC, FAIL_FRAC, decide_busbw, decide_transport,
                        describe_transport, guess_interconnect, lookup_reference,
                        parse_nccl_log)
from ..phase import Run, Step, gpu_skip, rank_timeout, skip
from ..launch.ranks import decide_allreduce, spawn_local
from ..report import Check

PHASE = "collective"
IDS = ("collective.nccl_allreduce", "collective.busbw", "collective.transport")
DEFAULT_GPU_BW = 1 << 30
CHECK_BYTES_MAX = 64 << 20


def judge(run: Run, correctness: Check, busbw: float | None, world: int, nodes: int,
          gpu_name: str, logs: list[dict[str, Any]], backend: str, gpus_per_node: int,
          rdma_present: bool) -> list[Check]:
    """Correctness, bandwidth and transport records from one collective run (also used by
    ``distributed.py``)."""
    req = run.expect.expected and backend == "nccl"
    transport = describe_transport(logs, nodes, backend)
    network = next((p["network"] for p in logs if p.get("network")), None)
    run.fact("report.transport", transport)
    run.fact("report.world_size", world)
    version = next((p["version"] for p in logs if p.get("version")), None)
    if version:
        run.fact("versions.nccl_loaded", version)
    if backend == "gloo":
        key = f"gloo/tcp x{world}"
        ref = None
    else:
        inter = guess_interconnect(gpu_name, nodes, network)
        key = f"{gpu_name} x{gpus_per_node} x {nodes} node(s), {inter}"
        ref = lookup_reference(run.options.get("bw_ref", []), gpu_name, gpus_per_node, nodes,
                               inter)
        run.fact("platform.interconnect", inter)
    bw = decide_busbw(busbw if correctness.status == "pass" else None, world, ref, key,
                      required=req, warn_frac=float(run.options.get("bw_warn_frac", WARN_FRAC)),
                      fail_frac=float(run.options.get("bw_fail_frac", FAIL_FRAC)),
                      detail="NVLS set up" if any(p.get("nvls") for p in logs) else "")
    return [correctness, bw, decide_transport(transport, nodes, rdma_present, req)]


def nccl_step(run: Run) -> list[Check]:
    """Spawn one rank per visible GPU and judge the run."""
    import torch  # type: ignore[import-not-found]

    expect = run.expect
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible == 0:
        why = f"no GPU visible ({expect.count or 'some'} expected)"
        return [skip(cid, PHASE, why, required=True) for cid in IDS]
    opts = run.options
    bw_bytes = int(opts.get("bw_size") or DEFAULT_GPU_BW)
    res = spawn_local("nccl", visible, [str(i) for i in range(visible)],
                      min(bw_bytes, CHECK_BYTES_MAX), bw_bytes, int(opts.get("bw_iters", 20)),
                      int(opts.get("bw_warmup", 5)), rank_timeout(run, PHASE),
                      workdir=run.ctx.get("workdir"))
    logs = [parse_nccl_log(t) for t in res.nccl_logs]
    rdma = os.path.isdir("/dev/infiniband")
    correctness = decide_allreduce(IDS[0], PHASE, res, required=True,
                                   transport=describe_transport(logs, 1, "nccl"))
    first = res.results[0] if res.results and res.results[0] else {}
    return judge(run, correctness, first.get("busbw"), visible, 1,
                 str(first.get("device_name") or torch.cuda.get_device_name(0)), logs, "nccl",
                 visible, rdma)


def plan(run: Run) -> list[Step]:
    """Skipped (with the expectation's reason) when GPUs are not expected."""
    expect = run.expect
    if not expect.expected:
        return [Step((cid,), (lambda r, cid=cid: gpu_skip(cid, PHASE, expect)), required=False,
                     applies=expect.applies) for cid in IDS]
    return [Step(IDS, nccl_step)]
