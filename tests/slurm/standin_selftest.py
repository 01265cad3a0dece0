"""A stand-in for ``python -m verl_env_selftest``, used by the Slurm tests only when the real
package (builder/selftest) is not there. Same contract: ``--phases``, ``--json``, ``--manifest``,
exit 0 pass / 1 fail, one verdict agreed by all ranks, rank 0 writes the report. Under srun it
does a real gloo all-reduce across the nodes (MASTER_ADDR/MASTER_PORT from the job script) and,
like the real ``env`` phase, fails when HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES differ.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser(prog="verl_env_selftest (stand-in)")
    for opt in ("--phases", "--json", "--expect-gpus", "--manifest", "--timeout"):
        parser.add_argument(opt)
    args = parser.parse_args()
    node = os.environ.get("SLURMD_NODENAME", "?")
    rank = int(os.environ.get("SLURM_PROCID", 0))
    world = int(os.environ.get("SLURM_STEP_NUM_TASKS", os.environ.get("SLURM_NTASKS", 1)))
    import torch
    import torch.distributed as dist

    hip, cuda = os.environ.get("HIP_VISIBLE_DEVICES"), os.environ.get("CUDA_VISIBLE_DEVICES")
    env_ok = hip is None or cuda is None or hip == cuda
    url = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    dist.init_process_group("gloo", init_method=url, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    sum_ok = total.item() == world * (world + 1) / 2
    mine = {"id": f"env.hip_cuda_visible_devices@{node}", "status": "pass" if env_ok else "fail",
            "reason": "" if env_ok else "HIP_VISIBLE_DEVICES differs from CUDA_VISIBLE_DEVICES"}
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, mine)  # every rank sees every node's record
    dist.destroy_process_group()
    checks = [*gathered, {"id": "collective.gloo_allreduce", "status": "pass" if sum_ok else "fail"}]
    overall = "pass" if all(c["status"] == "pass" for c in checks) else "fail"  # type: ignore[index]
    print(f"stand-in self-test on {node} (rank {rank}/{world}): {overall}", flush=True)
    if args.json and rank == 0:
        with open(args.json, "w") as handle:
            json.dump({"world_size": world, "checks": checks, "overall": overall}, handle)
    return 0 if overall == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
