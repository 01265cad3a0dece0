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

Prints one markdown table (wall seconds per round, medians, the ratio of medians) and the load
average before and after. Never a timed assert: the numbers go to docs/benchmarks.md.
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
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
