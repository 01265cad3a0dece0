#!/usr/bin/env python3
"""Benchmark the gate against importing the same stack in the same image (issue 38's ratio).

    DOCKER_HOST=... scripts/bench-gate.py --image verl-env:cpu-x86_64 [--rounds 3] [--cli build-env]

Side by side in one run, rounds interleaved with alternating order (both sides see the same
load and page cache):

* ``import``: ``docker run --rm --network none IMAGE python3 -c "import torch, verl, ..."``, every
  module the image's manifest imports (``/opt/verl-env/manifest.json``: its ``imports`` map),
  through the docker CLI: what a user's own smoke test of the image costs;
* ``gate``: ``build-env verify IMAGE --json``, the whole gate as every build, ``verify`` and
  cluster node pays it (the container, the self-test's phases, the report read back), with the
  self-test's own duration from its report beside it.

Then, inside one container of the image (no engine or CLI start-up on either side), the same
import against the image's own self-test (``python -m verl_env_selftest``, all phases), wall and
CPU seconds (the container's cgroup: every process, Ray's daemons included), rounds alternating:
the CPU ratio is what a loaded machine moves least.

Prints two markdown tables (per round, medians, the ratio of medians) and the load average
before and after. Never a timed assert: the numbers go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import time


def docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True)


def manifest_imports(image: str) -> list[str]:
    """The modules the image's manifest imports."""
    proc = docker("run", "--rm", "--network", "none", "--entrypoint", "cat", image,
                  "/opt/verl-env/manifest.json")
    if proc.returncode != 0:
        raise SystemExit(f"{image}: no /opt/verl-env/manifest.json (not a verl-env image?): "
                         f"{proc.stderr.strip()[-500:]}")
    return sorted(set(json.loads(proc.stdout).get("imports", {}).values()))


# Runs inside the image: each side's wall and the container cgroup's CPU (v2 or v1) around it.
IN_CONTAINER = """
import json, subprocess, sys, time
def cpu():
    for path, scale in (("/sys/fs/cgroup/cpu.stat", 1e6),
                        ("/sys/fs/cgroup/cpuacct/cpuacct.usage", 1e9)):
        try:
            text = open(path).read()
        except OSError:
            continue
        if path.endswith("cpu.stat"):
            text = next(l.split()[1] for l in text.splitlines() if l.startswith("usage_usec"))
        return int(text) / scale
    return float("nan")
out = {}
for side, argv in json.loads(sys.argv[1]):
    c0, t0 = cpu(), time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{side}: exit {proc.returncode}: {proc.stdout[-1500:]} {proc.stderr[-1500:]}")
    time.sleep(1)  # daemons a side started (Ray's) are gone and counted
    out[side] = [time.monotonic() - t0 - 1, cpu() - c0]
print(json.dumps(out))
"""


def in_one_container(image: str, modules: list[str], rounds: int) -> None:
    """The import against the self-test inside one container, wall and cgroup CPU."""
    sides = [["import", ["python3", "-c", "import " + ", ".join(modules)]],
             ["self-test", ["python3", "-m", "verl_env_selftest", "--expect-gpus", "0"]]]
    walls: dict[str, list[float]] = {"import": [], "self-test": []}
    cpus: dict[str, list[float]] = {"import": [], "self-test": []}
    print("\nIn one container (no engine or CLI start-up):\n")
    print("| round | import: wall / CPU | self-test, all phases: wall / CPU | ratio wall / CPU |")
    print("|---|---|---|---|")
    for r in range(rounds):
        order = sides if r % 2 == 0 else sides[::-1]
        _, out = timed(["docker", "run", "--rm", "--network", "none", "-w", "/opt/verl-env",
                        "--entrypoint", "python3", image, "-c", IN_CONTAINER, json.dumps(order)])
        got = json.loads(out)
        for side, (wall, cpu) in got.items():
            walls[side].append(wall)
            cpus[side].append(cpu)
        (iw, ic), (sw, sc) = got["import"], got["self-test"]
        print(f"| {r + 1} ({order[0][0]} first) | {iw:.1f} / {ic:.1f} s | {sw:.1f} / {sc:.1f} s "
              f"| {sw / iw:.2f}x / {sc / ic:.2f}x |")
    iw, ic, sw, sc = (statistics.median(v) for v in (walls["import"], cpus["import"],
                                                      walls["self-test"], cpus["self-test"]))
    print(f"| median | {iw:.1f} / {ic:.1f} s | {sw:.1f} / {sc:.1f} s "
          f"| **{sw / iw:.2f}x** / **{sc / ic:.2f}x** |")


def timed(argv: list[str]) -> tuple[float, str]:
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)[:200]}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return wall, proc.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cli", default=shutil.which("build-env") or "build-env")
    args = ap.parse_args()
    modules = manifest_imports(args.image)
    import_argv = ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3",
                   args.image, "-c", "import " + ", ".join(modules)]
    gate_argv = [args.cli, "verify", args.image, "--json"]
    print(f"image {args.image}; imports: {', '.join(modules)}")
    print(f"load average before: {os.getloadavg()[0]:.2f}\n")
    timed(import_argv)  # page cache warm for both sides: neither round 1 pays the disk alone
    rows, imp, gate, selftest = [], [], [], []
    for r in range(args.rounds):
        order = ("import", "gate") if r % 2 == 0 else ("gate", "import")
        for side in order:
            if side == "import":
                imp.append(timed(import_argv)[0])
            else:
                wall, out = timed(gate_argv)
                gate.append(wall)
                selftest.append(float(json.loads(out).get("duration_s") or 0))
        rows.append(f"| {r + 1} ({order[0]} first) | {imp[-1]:.1f} s | {gate[-1]:.1f} s "
                    f"({selftest[-1]:.1f} s self-test) | {gate[-1] / imp[-1]:.2f}x |")
    print("| round | import the stack | gate (`verify`) | ratio |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    mi, mg, ms = (statistics.median(v) for v in (imp, gate, selftest))
    print(f"| median | {mi:.1f} s | {mg:.1f} s ({ms:.1f} s self-test) | **{mg / mi:.2f}x** |")
    in_one_container(args.image, modules, args.rounds)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
