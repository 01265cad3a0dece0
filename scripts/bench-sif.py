#!/usr/bin/env python3
"""Benchmark the SIF conversion against a raw ``docker export | mksquashfs -tar`` of the image.

    DOCKER_HOST=... scripts/bench-sif.py --image verl-env:cpu-x86_64 [--rounds 3] [--json OUT]

Side by side in one run, rounds interleaved with alternating order (both sides see the same
machine load and page cache):

* ``convert``: :func:`builder.sif.native.build`: the engine's export streamed through the
  ``/.singularity.d`` overlay into ``mksquashfs - OUT -tar`` (gzip; ``--compression none``:
  nothing compressed, as ``build-env sif --compression none``), then the SIF header; wall and
  CPU seconds (this process and its children);
* ``raw``: ``docker create`` + ``docker export C | mksquashfs - OUT -tar -noappend -comp gzip``
  through the docker CLI, the floor the issue sets (goal: convert <= 1.05x raw, wall), with the
  conversion's own options (``sif_native.COMPRESSIONS``) so that both sides compress alike;
  ``--raw-comp '-comp gzip'`` times it at mksquashfs's own default level (9) instead.

The conversion's verification (siftool, unsquashfs, the self-test from the SIF) is not timed
here: ``build-env sif`` reports it separately.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from builder.engine import Engine  # noqa: E402
from builder.sif import format as sif_format  # noqa: E402
from builder.sif import native as sif_native  # noqa: E402


def _cpu() -> tuple[float, float]:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime


def timed(fn: Any) -> tuple[float, dict[str, float], Any]:
    """(wall s, {"self": CPU s of this process, "children": of its children}, result)."""
    w0, (s0, c0) = time.monotonic(), _cpu()
    result = fn()
    s1, c1 = _cpu()
    return time.monotonic() - w0, {"self": s1 - s0, "children": c1 - c0}, result


def convert(engine: Engine, image: Any, ref: str, work: Path, compression: str
            ) -> dict[str, Any]:
    out = work / "bench.sif"
    scratch = sif_native.scratch_dir(out, work)
    try:
        wall, cpu, result = timed(lambda: sif_native.build(engine, image, out, source=ref,
                                                           workdir=scratch,
                                                           compression=compression))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    size = out.stat().st_size
    info = sif_format.read_info(out)
    out.unlink()
    return {"wall": wall, "cpu": cpu, "phases": result.timings, "sif_size": size,
            "squashfs_size": result.partition_size, "arch": info.arch,
            "bytes_exported": result.overlay.bytes_in, "members": result.overlay.members}


def raw(ref: str, work: Path, comp: list[str]) -> dict[str, Any]:
    out = work / "raw.sqfs"
    out.unlink(missing_ok=True)
    script = ('set -eo pipefail; c=$(docker create --entrypoint true "$1"); '
              'trap \'docker rm -f "$c" >/dev/null\' EXIT; out=$2; shift 2; '
              'docker export "$c" | mksquashfs - "$out" -tar -noappend "$@" -quiet '
              '-no-progress >/dev/null')
    wall, cpu, _ = timed(lambda: subprocess.run(["bash", "-c", script, "raw", ref, str(out),
                                                 *comp], check=True))
    size = out.stat().st_size
    out.unlink()
    return {"wall": wall, "cpu": cpu, "squashfs_size": size}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", default="verl-env:cpu-x86_64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--compression", choices=sorted(sif_native.COMPRESSIONS), default="gzip",
                    help="the conversion's compression (build-env sif --compression)")
    ap.add_argument("--raw-comp", default=None,
                    help="mksquashfs compression options of the raw side (default: the "
                         "conversion's own)")
    args = ap.parse_args()
    if args.raw_comp is None:
        args.raw_comp = " ".join(sif_native.COMPRESSIONS[args.compression])
    if not shutil.which("docker"):
        sys.exit("bench-sif: the docker CLI is needed for the raw baseline")

    engine = Engine.connect()
    image = engine.image(args.image)
    work = Path(tempfile.mkdtemp(prefix="bench-sif-", dir=args.workdir))
    rounds: list[dict[str, Any]] = []
    try:
        for i in range(args.rounds):
            if i % 2:
                r = raw(args.image, work, args.raw_comp.split())
                c = convert(engine, image, args.image, work, args.compression)
            else:
                c = convert(engine, image, args.image, work, args.compression)
                r = raw(args.image, work, args.raw_comp.split())
            rounds.append({"convert": c, "raw": r, "ratio": c["wall"] / r["wall"]})
            print(f"round {i + 1} ({'raw' if i % 2 else 'convert'} first): convert "
                  f"{c['wall']:.1f} s (cpu {c['cpu']['self']:.1f} python + "
                  f"{c['cpu']['children']:.1f} mksquashfs), raw {r['wall']:.1f} s (cpu "
                  f"{r['cpu']['children']:.1f} docker CLI + mksquashfs): ratio "
                  f"{rounds[-1]['ratio']:.3f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = statistics.median
    conv_wall = med([r["convert"]["wall"] for r in rounds])
    raw_wall = med([r["raw"]["wall"] for r in rounds])
    last = rounds[-1]["convert"]
    result = {
        "image": args.image, "image_size": image.size,
        "convert_comp": sif_native.COMPRESSIONS[args.compression],
        "raw_comp": args.raw_comp.split(),
        "cpus": os.cpu_count(), "loadavg_after": os.getloadavg(), "rounds": rounds,
        "convert_wall_s": conv_wall, "raw_wall_s": raw_wall,
        "ratio_wall_median_of_rounds": med([r["ratio"] for r in rounds]),
        "ratio_wall": conv_wall / raw_wall,
        "python_cpu_s": med([r["convert"]["cpu"]["self"] for r in rounds]),
        "sif_size": last["sif_size"], "raw_squashfs_size": rounds[-1]["raw"]["squashfs_size"],
        "bytes_exported": last["bytes_exported"], "members": last["members"], "arch": last["arch"],
    }
    result["sif_vs_image"] = result["sif_size"] / max(result["image_size"], 1)
    print(f"\n{args.image}: image {result['image_size'] / 2**20:.0f} MiB, export "
          f"{result['bytes_exported'] / 2**20:.0f} MiB ({result['members']} members) -> SIF "
          f"{result['sif_size'] / 2**20:.0f} MiB ({result['sif_vs_image']:.2f}x the image); raw "
          f"squashfs {result['raw_squashfs_size'] / 2**20:.0f} MiB")
    print(f"SIF conversion {conv_wall:.1f} s vs raw docker export | mksquashfs {raw_wall:.1f} s "
          f"(medians of {len(rounds)}): {result['ratio_wall']:.3f}x wall (goal <= 1.05x); "
          f"python {result['python_cpu_s']:.1f} s CPU; load after "
          f"{result['loadavg_after'][0]:.1f} on {result['cpus']} cores")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
