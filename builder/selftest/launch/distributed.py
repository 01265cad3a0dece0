"""Multi-rank mode (torchrun or srun, across nodes): one subprocess per rank runs the
collective over all ranks (NCCL/RCCL with GPUs, gloo without), gathers every rank's
records, and the ranks all-reduce their verdicts so they agree on one; rank 0 writes it.

``run_distributed`` is the parent side (stdlib); ``main`` is the subprocess
(``python -m verl_env_selftest.launch.distributed``), which imports torch.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

from ..phases.allreduce import allreduce_test
from ..phases.bandwidth import describe_transport, parse_nccl_log
from ..phases.collective import IDS, judge
from .launcher import RankInfo, dist_env
from ..phase import Run, fault
from .ranks import SpawnResult, decide_allreduce
from ..report import FAIL, SEVERITY, Check, apply_strict, verdict
from ..runner import ACTIVE, kill_session, summarize_log

GLOO_BW = 16 << 20


def host_records(records: list[dict[str, Any]], host: str, suffix: bool) -> list[Check]:
    """A node's local records, ids suffixed ``@host`` when the run spans several hosts."""
    out = []
    for d in records:
        c = Check.from_dict(d)
        if suffix:
            c.id = f"{c.id}@{host}"
        out.append(c)
    return out


def merge(infos: list[dict[str, Any]], collective: list[Check]) -> tuple[list[Check], list[str]]:
    """All ranks' local records (in rank order) plus the collective records; and the hosts."""
    hosts = list(dict.fromkeys(i["host"] for i in infos))
    checks: list[Check] = []
    for i in infos:
        checks += host_records(i["local"], i["host"], len(hosts) > 1)
    return checks + collective, hosts


def _device(torch: Any, info: RankInfo, visible: int) -> tuple[Any, str]:
    """This rank's GPU (its local rank among the visible ones), selected; and its name."""
    idx = info.local_rank % visible
    torch.cuda.set_device(idx)
    return torch.device("cuda", idx), torch.cuda.get_device_name(idx)


def _nccl_logs(log_dir: str) -> list[Any]:
    """This process's NCCL debug logs, parsed."""
    logs = []
    pattern = os.environ.get("NCCL_DEBUG_FILE") or os.path.join(log_dir, "nccl.%h.%p.log")
    for path in glob.glob(pattern.replace("%h", "*").replace("%p", str(os.getpid()))):
        with open(path, encoding="utf-8", errors="replace") as f:
            logs.append(parse_nccl_log(f.read()))
    return logs


def main(argv: list[str] | None = None) -> int:
    """The per-rank collective subprocess."""
    p = argparse.ArgumentParser(prog="verl_env_selftest.launch.distributed")
    p.add_argument("--ctx", required=True)
    p.add_argument("--local", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--log-dir", required=True)
    a = p.parse_args(argv)
    with open(a.ctx, encoding="utf-8") as f:
        ctx = json.load(f)
    with open(a.local, encoding="utf-8") as f:
        local = json.load(f)
    info = RankInfo(**{**ctx["launcher"], "nodelist": tuple(ctx["launcher"]["nodelist"])})
    if fault(f"hang-rank:{info.rank}"):
        while True:
            time.sleep(3600)
    import torch  # type: ignore[import-not-found]
    import torch.distributed as dist  # type: ignore[import-not-found]

    run = Run(ctx=ctx)
    opts, expect = run.options, run.expect
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = expect.expected and visible > 0
    backend = "nccl" if nccl else "gloo"
    device, device_name = _device(torch, info, visible) if nccl else (torch.device("cpu"), "cpu")
    timeout = datetime.timedelta(seconds=float(ctx["dist_timeout"]))
    dist.init_process_group(backend, init_method="env://", rank=info.rank,
                            world_size=info.world_size, timeout=timeout)
    group = dist.new_group(backend="gloo", timeout=timeout) if nccl else None
    bw = int(opts.get("bw_size") or (1 << 30 if nccl else GLOO_BW))
    result, error = None, None
    try:
        result = allreduce_test(
            torch, dist, device, info.rank, info.world_size, min(bw, 64 << 20), bw,
            int(opts.get("bw_iters", 20)) if nccl else 3, int(opts.get("bw_warmup", 5))
            if nccl else 1)
    except Exception as e:  # noqa: BLE001 - reported, then agreed on
        error = f"{type(e).__name__}: {e}"
    logs = _nccl_logs(a.log_dir)
    mine = {"rank": info.rank, "host": socket.gethostname(), "device": device_name,
            "result": result, "error": error, "logs": logs, "local": local,
            "rdma": os.path.isdir("/dev/infiniband")}
    infos: list[Any] = [None] * info.world_size
    dist.all_gather_object(infos, mine, group=group)
    hosts = list(dict.fromkeys(i["host"] for i in infos))
    nodes = len(hosts)
    all_logs = [lg for i in infos for lg in i["logs"]]
    spawn = SpawnResult(backend, info.world_size, float(ctx["dist_timeout"]),
                        results=[i["result"] for i in infos],
                        rcs=[0 if i["error"] is None else 1 for i in infos],
                        tails={i["rank"]: i["error"] for i in infos if i["error"]})
    cid = IDS[0] if nccl else "collective.gloo_allreduce"
    correctness = decide_allreduce(cid, "collective", spawn, required=True,
                                   transport=describe_transport(all_logs, nodes, backend))
    busbw = (infos[0]["result"] or {}).get("busbw")
    collective = judge(run, correctness, busbw, info.world_size, nodes, infos[0]["device"],
                       all_logs, backend, max(info.world_size // nodes, 1),
                       any(i["rdma"] for i in infos))
    strict = bool(opts.get("strict"))
    own = apply_strict(host_records(local, mine["host"], nodes > 1) + collective, strict)
    sev = torch.tensor([SEVERITY[verdict(own)]], dtype=torch.int64)
    dist.all_reduce(sev, op=dist.ReduceOp.MAX, group=group)
    agreed = next(v for v, s in SEVERITY.items() if s == int(sev.item()))
    out: dict[str, Any] = {"overall": agreed, "rank": info.rank}
    if info.rank == 0:
        checks, hosts = merge(infos, collective)
        out.update(checks=[c.to_dict(internal=True) for c in checks], hosts=hosts,
                   world_size=info.world_size, facts=run.facts, backend=backend)
    dist.destroy_process_group()
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f)
    return 0


def run_distributed(info: RankInfo, ctx_path: str, local: list[Check], workdir: str,
                    timeout: float) -> dict[str, Any]:
    """Parent side: run the collective subprocess for this rank with a watchdog. On a hang
    or crash this rank reports a failed collective (the other ranks time out the same way)."""
    pkg = __package__ or "verl_env_selftest.launch"
    local_path = os.path.join(workdir, "local.json")
    out = os.path.join(workdir, "distributed.json")
    log = os.path.join(workdir, "distributed.log")
    with open(local_path, "w", encoding="utf-8") as f:
        json.dump([c.to_dict(internal=True) for c in local], f)
    env = dict(os.environ, **dist_env(info))
    env["NCCL_DEBUG"] = "INFO"
    env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    env.setdefault("NCCL_DEBUG_FILE", os.path.join(workdir, "nccl.%h.%p.log"))
    cmd = [sys.executable, "-m", f"{pkg}.distributed", "--ctx", ctx_path, "--local",
           local_path, "--out", out, "--log-dir", workdir]
    why = None
    with open(log, "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        ACTIVE.add(proc.pid)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_session(proc.pid)
            proc.wait()
            why = (f"phase 'collective' timed out after {timeout:.0f} s across "
                   f"{info.world_size} ranks (killed; hung collective on rank {info.rank})")
            rc = None
        finally:
            kill_session(proc.pid)
            ACTIVE.discard(proc.pid)
    if why is None:
        try:
            with open(out, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            with open(log, encoding="utf-8", errors="replace") as f:
                tail = summarize_log(f.read())
            hint = " (a peer rank hung, crashed or never joined)" if "timeout" in tail.lower() \
                else ""
            why = f"phase 'collective' failed on rank {info.rank} (exit {rc}): {tail}{hint}"
    fail = Check("collective.allreduce", "collective", FAIL, reason=why)
    return {"overall": "fail", "rank": info.rank, "hosts": [socket.gethostname()],
            "world_size": info.world_size, "facts": {},
            "checks": [c.to_dict(internal=True) for c in local + [fail]]}


if __name__ == "__main__":
    sys.exit(main())
