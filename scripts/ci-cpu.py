#!/usr/bin/env python3
"""Where a whole test run's CPU goes: sample every process's CPU time while the run lasts.

    scripts/ci-cpu.py OUT.json STOPFILE [--every 2]    # start beside `CI=true bash .ci/run`
    touch STOPFILE                                     # when the run ended: OUT.json is written

Every ``--every`` seconds it reads ``/proc/*/stat`` and keeps, per process (pid and start time),
its user+system CPU seconds since the sampling started, a category (QEMU-emulated, mksquashfs, uv, dockerd, the
self-test, pytest...: from the executable, the command name and the command line) and the test
group it runs under (the nearest ancestor started with ``--basetemp=.../<group>``, as
scripts/test.sh starts each group; ``-`` for daemons a group's engine re-parented, such as the
processes of containers and build steps). The machine's own CPU total over the same time, from
``/proc/stat``, is written beside it: what the samples miss (processes shorter than one interval,
the kernel) is the difference. Never a timed assert: the numbers go to docs/testing.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time

TICK = os.sysconf("SC_CLK_TCK")
NAMED = ("mksquashfs", "unsquashfs", "dockerd", "containerd-shim", "containerd", "buildkit",
         "runc", "uv", "debootstrap", "dpkg", "slurmctld", "slurmd", "slurmstepd", "ch-run",
         "enroot", "squashfuse", "cc1plus", "gcc", "nvcc", "ptxas", "raylet", "gcs_server",
         "registry", "shellcheck", "hadolint", "cuobjdump", "tar", "gzip", "zstd")


def read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def category(pid: str, comm: str) -> str:
    """What a process is, for the summary."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    cmd = read(f"/proc/{pid}/cmdline").replace("\0", " ")
    if "qemu" in exe:
        return "qemu (emulated): " + comm
    for name in NAMED:
        if comm.startswith(name) or exe.endswith("/" + name):
            return name
    for needle, name in (("pytest", "pytest"), ("verl_env_selftest", "self-test"),
                         ("build-env", "build-env"), ("-m builder", "build-env"),
                         ("incheck", "train-check"), ("ray", "ray (python)")):
        if needle in cmd:
            return name
    return comm


def group(pid: int) -> str:
    """The test group a process runs under (its ancestor's --basetemp), else '-'."""
    for _ in range(40):
        for arg in read(f"/proc/{pid}/cmdline").split("\0"):
            if arg.startswith("--basetemp="):
                return arg.rstrip("/").rsplit("/", 1)[-1]
        stat = read(f"/proc/{pid}/stat")
        if not stat:
            return "?"
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        if pid <= 1:
            return "-"
    return "?"


def machine_cpu() -> float:
    """The machine's busy CPU seconds so far (all but idle and iowait)."""
    fields = [int(x) for x in read("/proc/stat").splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICK


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("stop")
    ap.add_argument("--every", type=float, default=2.0)
    a = ap.parse_args()
    seen: dict[str, list] = {}  # "pid-starttime" -> [category, cpu seconds, group]
    base: dict[str, float] = {}  # what processes running at the start had used before it
    t0, m0 = time.monotonic(), machine_cpu()
    first = True
    while not os.path.exists(a.stop):
        for pid in filter(str.isdigit, os.listdir("/proc")):
            stat = read(f"/proc/{pid}/stat")
            if not stat:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat.rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / TICK
            key = f"{pid}-{fields[19]}"
            if first:
                base[key] = cpu
            if key in seen:
                seen[key][1] = cpu - base.get(key, 0.0)
            else:
                seen[key] = [category(pid, comm), cpu - base.get(key, 0.0), group(int(pid))]
        first = False
        time.sleep(a.every)
    by_category: dict[str, float] = {}
    by_group: dict[str, float] = {}
    for cat, cpu, grp in seen.values():
        by_category[cat] = by_category.get(cat, 0.0) + cpu
        by_group[grp] = by_group.get(grp, 0.0) + cpu
    result = {
        "wall_s": round(time.monotonic() - t0), "machine_cpu_s": round(machine_cpu() - m0),
        "sampled_cpu_s": round(sum(by_category.values())), "cpus": os.cpu_count(),
        "by_category": {k: round(v) for k, v in sorted(by_category.items(), key=lambda x: -x[1])},
        "by_group": {k: round(v) for k, v in sorted(by_group.items(), key=lambda x: -x[1])},
    }
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
