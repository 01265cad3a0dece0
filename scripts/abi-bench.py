#!/usr/bin/env python3
"""Time the self-test's ABI phase (``abi.scan``) inside an image: best and median of N runs
over the interpreter's site directories, and optionally the top of a cProfile. Measured this
way for docs/abi-real-stack.md (never a timed assert in a test)::

    docker run --rm --network none -v $PWD/builder/selftest:/opt/verl-env/verl_env_selftest:ro \
        -v $PWD/scripts:/x:ro IMAGE /opt/venv/bin/python /x/abi-bench.py --runs 3 --profile 12

Prints one JSON line: ELF files, objects, runs' seconds, best, median. Stdlib only.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time

sys.path.insert(0, "/opt/verl-env")

from verl_env_selftest import abi  # noqa: E402
from verl_env_selftest.phases.coverage import site_dirs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--accelerator", default="cuda")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also print the N functions with most own time (one more run)")
    args = ap.parse_args()
    roots, times, found = site_dirs(), [], None
    for _ in range(args.runs):
        t0 = time.monotonic()
        found = abi.scan(roots, args.accelerator)
        times.append(round(time.monotonic() - t0, 3))
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        abi.scan(roots, args.accelerator)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.profile)
        print(out.getvalue(), file=sys.stderr)
    assert found is not None
    print(json.dumps({"elf_files": found.elf_files, "objects": len(found.results),
                      "runs": times, "best": min(times), "median": statistics.median(times)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
