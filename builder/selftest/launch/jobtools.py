"""Small helpers the generated Slurm job runs inside the image (``builder/templates/job/``).

``python3 -m verl_env_selftest.launch.jobtools ray-wait NODES TIMEOUT``
    poll the Ray GCS at ``$RAY_ADDRESS`` until NODES nodes are alive (exit 0) or TIMEOUT seconds
    pass (exit 1); print the nodes and the cluster's CPU and GPU totals.
``python3 -m verl_env_selftest.launch.jobtools report FILE...``
    summarise self-test JSON reports, failing checks first (always exit 0).

Standard library only, except ``ray`` for ``ray-wait`` (imported there, from the image).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def ray_wait(want: int, limit: float) -> int:
    import ray  # the image's Ray

    deadline = time.monotonic() + limit
    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
    while True:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        if len(alive) >= want or time.monotonic() > deadline:
            break
        time.sleep(2)
    names = sorted("%s:%s" % (n["NodeManagerAddress"], n["NodeManagerPort"]) for n in alive)
    print("ray: %d/%d nodes alive: %s" % (len(alive), want, ", ".join(names)), flush=True)
    res = ray.cluster_resources()
    print("ray: cluster CPU=%s GPU=%s" % (res.get("CPU", 0), res.get("GPU", 0)), flush=True)
    return 0 if len(alive) >= want else 1


def _bad(check: dict[str, Any]) -> bool:
    return check.get("status") == "fail" or (check.get("status") == "skip"
                                             and bool(check.get("required")))


def report(paths: list[str]) -> int:
    for path in paths:
        try:
            with open(path) as handle:
                rep = json.load(handle)
        except (OSError, ValueError):
            continue
        checks = rep.get("checks", [])
        print("self-test report %s: %s, world %s, %d checks"
              % (path.rsplit("/", 1)[-1], rep.get("overall"), rep.get("world_size"), len(checks)))
        for check in [c for c in checks if _bad(c)][:20]:
            print("  %s %s: %s" % (check.get("status"), check.get("id"),
                                   str(check.get("reason") or "")[:140]))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "ray-wait":
        return ray_wait(int(argv[1]), float(argv[2]))
    if argv and argv[0] == "report":
        return report(argv[1:])
    print("usage: jobtools ray-wait NODES TIMEOUT | jobtools report FILE...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
