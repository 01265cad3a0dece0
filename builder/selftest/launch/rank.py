"""One locally spawned rank: ``python -m verl_env_selftest.launch.rank --backend gloo|nccl ...``.

Rendezvous through a ``torch.distributed.FileStore`` in a temp dir (no port, so parallel
builds on one host cannot collide). Writes its result as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import time

from ..phases.allreduce import allreduce_test
from ..phase import fault


def main(argv: list[str] | None = None) -> int:
    """Init the process group, run the all-reduce test, write the result."""
    p = argparse.ArgumentParser(prog="verl_env_selftest.launch.rank")
    p.add_argument("--backend", choices=["gloo", "nccl"], required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--device", default="cpu", help="cpu or a CUDA/HIP device index")
    p.add_argument("--check-bytes", type=int, default=4 << 20)
    p.add_argument("--bw-bytes", type=int, default=0)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if fault(f"hang-rank:{a.rank}"):
        while True:
            time.sleep(3600)
    import torch  # type: ignore[import-not-found]
    import torch.distributed as dist  # type: ignore[import-not-found]

    info: dict[str, object] = {"rank": a.rank, "host": socket.gethostname(), "pid": os.getpid()}
    if a.device == "cpu":
        device = torch.device("cpu")
    else:
        idx = int(a.device)
        torch.cuda.set_device(idx)
        device = torch.device("cuda", idx)
        info["device_name"] = torch.cuda.get_device_name(idx)
    store = dist.FileStore(a.store, a.world)
    dist.init_process_group(a.backend, store=store, rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=a.timeout))
    try:
        res = allreduce_test(torch, dist, device, a.rank, a.world, a.check_bytes, a.bw_bytes,
                             a.iters, a.warmup)
    finally:
        dist.destroy_process_group()
    if a.backend == "nccl":
        try:
            info["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - informational only
            pass
    tmp = a.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({**info, **res}, f)
    os.replace(tmp, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
