#!/usr/bin/env python3
"""Benchmark: the commands a user runs most between builds, wall clock of the whole process
(start-up included), against their goals (docs/benchmarks.md): `check` of the shipped site's six
targets (goal 1 s) and `lock` of targets whose inputs did not change (goal 1 s: answered from the
recorded inputs, no resolution), with `lock --refresh` of one target beside it (uv resolves
again; needs the package index) for the ratio. Runs the `build-env` on PATH (or --cli) in a
copy of the shipped site made by `build-env init`; prints one markdown table and the load.

    python scripts/bench-cli.py [--cli build-env] [--repeat 5] [--no-refresh]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(argv: list[str], cwd: Path) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default=shutil.which("build-env") or "build-env")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-refresh", action="store_true", help="skip the resolution (no index)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        site = Path(tmp) / "site"
        subprocess.run([args.cli, "init", str(site)], check=True, capture_output=True)
        rows = [("`check` (6 shipped targets)", [args.cli, "check"], 1.0),
                ("`lock`, inputs unchanged (6 targets)", [args.cli, "lock"], 1.0),
                ("`lock --target cuda-x86_64`, inputs unchanged",
                 [args.cli, "lock", "--target", "cuda-x86_64"], 1.0),
                ("`--version` (start-up alone)", [args.cli, "--version"], None)]
        print(f"load average before: {os.getloadavg()[0]:.2f}; {args.repeat} runs each, median\n")
        print("| command | median | min | goal |\n|---|---|---|---|")
        for what, argv, goal in rows:
            runs = [timed(argv, site) for _ in range(args.repeat)]
            met = "" if goal is None else (" (met)" if statistics.median(runs) <= goal
                                           else " (**not met**)")
            print(f"| {what} | {statistics.median(runs):.2f} s | {min(runs):.2f} s | "
                  f"{'' if goal is None else f'≤ {goal:g} s'}{met} |")
        if not args.no_refresh:
            refresh = timed([args.cli, "lock", "--target", "cuda-x86_64", "--refresh"], site)
            print(f"| `lock --target cuda-x86_64 --refresh` (uv resolves again, warm uv cache) | "
                  f"{refresh:.2f} s | | the ratio: unchanged lock vs this |")
        print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
