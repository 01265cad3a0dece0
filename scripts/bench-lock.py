#!/usr/bin/env python3
"""Benchmark: `uv pip compile` time per target (cold uv cache, then warm), as `build-env lock`
runs it. Prints a markdown table. Needs the package index.

    python scripts/bench-lock.py [--matrix matrix.yaml] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from builder.resolve.lock import compile_lock, parse_lock, python_platform  # noqa: E402
from builder.resolve.metadata import load_snapshot, snapshot_path  # noqa: E402
from builder.matrix.spec import load_matrix  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--matrix", type=Path, default=Path("matrix.yaml"))
    ap.add_argument("--repeat", type=int, default=2, help="warm runs per target")
    args = ap.parse_args()
    matrix = load_matrix(args.matrix)
    snapshot = load_snapshot(snapshot_path(matrix.path))
    print("| target | platform | python | packages | cold cache (s) | warm cache (s, median) |")
    print("|---|---|---|---|---|---|")
    for target in matrix.targets.values():
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["UV_CACHE_DIR"] = str(Path(tmp) / "cache")
            cold = compile_lock(target, snapshot, Path(tmp) / "cold.txt")
            warm = [compile_lock(target, snapshot, Path(tmp) / f"w{i}.txt").seconds
                    for i in range(args.repeat)]
        n = len(parse_lock(cold.text))
        print(f"| {target.name} | {python_platform(target)} | {target.python} | {n} | "
              f"{cold.seconds:.1f} | {statistics.median(warm):.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
