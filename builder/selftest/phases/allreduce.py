"""The all-reduce test itself, run inside each rank (``rank.py`` for locally spawned ranks,
``distributed.py`` under torchrun/srun): exact correctness, then bus bandwidth.

torch is passed in by the caller; this module imports nothing outside the stdlib.
"""

from __future__ import annotations

import time
from typing import Any

from .bandwidth import bus_bandwidth


def allreduce_test(torch: Any, dist: Any, device: Any, rank: int, world: int,
                   check_bytes: int, bw_bytes: int, iters: int, warmup: int,
                   group: Any = None) -> dict[str, Any]:
    """Each rank fills a buffer with rank+1 and sums it: every element must equal
    n(n+1)/2 exactly (wrong elements are summed over ranks). Then ``iters`` back-to-back
    all-reduces of ``bw_bytes`` after ``warmup``; the slowest rank's time per op gives
    algbw and busbw (GB/s). Returns the same numbers on every rank."""
    cuda = getattr(device, "type", str(device)) == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    numel = max(check_bytes // 4, 1)
    x = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(x, group=group)
    expected = world * (world + 1) / 2
    wrong = (x != expected).sum().to(torch.int64).reshape(1)
    dist.all_reduce(wrong, group=group)
    out: dict[str, Any] = {
        "world": world, "check_numel": numel, "expected": expected,
        "wrong": int(wrong.item()), "observed_first": float(x[0].item()),
        "bw_bytes": 0, "iters": 0, "time_per_op_s": None, "algbw": None, "busbw": None,
    }
    del x
    if world < 2 or bw_bytes <= 0 or iters <= 0:
        return out
    buf = torch.zeros(max(bw_bytes // 4, 1), dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(buf, group=group)
    sync()
    dist.barrier(group=group)
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(buf, group=group)
        end.record()
        sync()
        per_op = start.elapsed_time(end) / 1000.0 / iters
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf, group=group)
        per_op = (time.perf_counter() - t0) / iters
    slowest = torch.tensor([per_op], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    per_op = float(slowest.item())
    size = buf.numel() * 4
    algbw, busbw = bus_bandwidth(size, per_op, world)
    out.update(bw_bytes=size, iters=iters, time_per_op_s=per_op, algbw=algbw, busbw=busbw)
    return out
