#!/usr/bin/env python3
"""Benchmark the native SIF conversion against raw mksquashfs of the same flattened rootfs.

    DOCKER_HOST=... scripts/bench-sif.py --image verl-env:cpu-x86_64 [--rounds 2] [--json OUT]

Per round (rounds interleave, so both sides see the same machine load):

* ``convert``: ``docker save`` stream -> spool -> flatten -> ``mksquashfs -tar`` -> SIF
  (:func:`builder.sif_native.build`), wall and CPU seconds, with its phases;
* ``raw``: ``mksquashfs ROOTFS OUT -noappend -comp gzip`` (what apptainer runs) on the *already
  flattened* rootfs of the same SIF (extracted once with unsquashfs, not timed).

Reports the wall-time ratio convert/raw (the issue's goal: within 1.05x; apptainer measured
1.19x), the CPU-time ratio (load-independent), ``docker save`` alone, and SIF size vs image size.
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

from builder import sif_format, sif_native  # noqa: E402


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def timed(fn: Any) -> tuple[float, float, Any]:
    """(wall s, CPU s of this process and its children, result)."""
    w0, c0 = time.monotonic(), _cpu()
    result = fn()
    return time.monotonic() - w0, _cpu() - c0, result


def docker_save_only(image: Any) -> float:
    t0 = time.monotonic()
    for _ in image.save(chunk_size=4 << 20):
        pass
    return time.monotonic() - t0


def convert(image: Any, ref: str, work: Path) -> dict[str, Any]:
    out = work / "bench.sif"
    scratch = sif_native.scratch_dir(out, work)
    try:
        wall, cpu, result = timed(lambda: sif_native.build(image, out, source=ref,
                                                           workdir=scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"wall": wall, "cpu": cpu, "phases": result.timings, "sif_size": out.stat().st_size,
            "squashfs_size": result.partition_size, "partition_offset": result.partition_offset}


def extract_rootfs(sif: Path, offset: int, dest: Path) -> None:
    subprocess.run(["unsquashfs", "-q", "-n", "-o", str(offset), "-d", str(dest), str(sif)],
                   check=True, stdout=subprocess.DEVNULL)


def raw_mksquashfs(rootfs: Path, work: Path) -> dict[str, Any]:
    out = work / "raw.sqfs"
    out.unlink(missing_ok=True)
    cmd = ["mksquashfs", str(rootfs), str(out), "-noappend", "-comp", "gzip", "-quiet",
           "-no-progress"]
    wall, cpu, _ = timed(lambda: subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL))
    size = out.stat().st_size
    out.unlink()
    return {"wall": wall, "cpu": cpu, "squashfs_size": size}


def raw_tar_mksquashfs(tarball: Path, work: Path) -> dict[str, Any]:
    """The same rootfs as one tar on disk into ``mksquashfs -tar`` (the native build's mode)."""
    out = work / "rawtar.sqfs"
    out.unlink(missing_ok=True)
    cmd = ["mksquashfs", "-", str(out), "-tar", "-noappend", "-comp", "gzip", "-exports",
           "-quiet", "-no-progress"]
    with open(tarball, "rb") as f:
        wall, cpu, _ = timed(lambda: subprocess.run(cmd, check=True, stdin=f,
                                                    stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.DEVNULL))
    out.unlink()
    return {"wall": wall, "cpu": cpu}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", default="verl-env:cpu-x86_64")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--tar-baseline", action="store_true",
                    help="also time mksquashfs -tar from a tar of the same rootfs on disk")
    args = ap.parse_args()

    import docker

    image = docker.from_env(timeout=3600).images.get(args.image)
    work = Path(tempfile.mkdtemp(prefix="bench-sif-", dir=args.workdir))
    rounds: list[dict[str, Any]] = []
    try:
        save = docker_save_only(image)
        rootfs = None
        for i in range(args.rounds):
            conv = convert(image, args.image, work)
            if rootfs is None:
                rootfs = work / "rootfs"
                extract_rootfs(work / "bench.sif", conv["partition_offset"], rootfs)
                if args.tar_baseline:
                    subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs),
                                    "-cf", str(work / "rootfs.tar"), "."], check=True)
            raw = raw_mksquashfs(rootfs, work)
            rounds.append({"convert": conv, "raw": raw})
            if args.tar_baseline:
                rounds[-1]["raw_tar"] = raw_tar_mksquashfs(work / "rootfs.tar", work)
            tar = rounds[-1].get("raw_tar")
            print(f"round {i + 1}: convert {conv['wall']:.1f} s (cpu {conv['cpu']:.1f}), raw "
                  f"mksquashfs {raw['wall']:.1f} s (cpu {raw['cpu']:.1f}), ratio "
                  f"{conv['wall'] / raw['wall']:.3f}; phases "
                  + ", ".join(f"{k} {v:.1f}" for k, v in conv["phases"].items())
                  + (f"; mksquashfs -tar of a rootfs tar {tar['wall']:.1f} s (cpu "
                     f"{tar['cpu']:.1f})" if tar else ""), flush=True)
        info = sif_format.read_info(work / "bench.sif")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = lambda xs: statistics.median(xs)  # noqa: E731
    conv_wall = med([r["convert"]["wall"] for r in rounds])
    raw_wall = med([r["raw"]["wall"] for r in rounds])
    result = {
        "image": args.image, "image_size": int(image.attrs.get("Size") or 0),
        "cpus": os.cpu_count(), "loadavg_after": os.getloadavg(), "rounds": rounds,
        "docker_save_s": save, "convert_wall_s": conv_wall, "raw_mksquashfs_wall_s": raw_wall,
        "ratio_wall": conv_wall / raw_wall,
        "ratio_cpu": med([r["convert"]["cpu"] / r["raw"]["cpu"] for r in rounds]),
        "raw_tar_mksquashfs_wall_s": (med([r["raw_tar"]["wall"] for r in rounds])
                                      if args.tar_baseline else None),
        "sif_size": rounds[-1]["convert"]["sif_size"],
        "raw_squashfs_size": rounds[-1]["raw"]["squashfs_size"], "arch": info.arch,
    }
    result["sif_vs_image"] = result["sif_size"] / max(result["image_size"], 1)
    print(f"\n{args.image}: image {result['image_size'] / 2**20:.0f} MiB -> SIF "
          f"{result['sif_size'] / 2**20:.0f} MiB ({result['sif_vs_image']:.2f}x); raw squashfs "
          f"{result['raw_squashfs_size'] / 2**20:.0f} MiB")
    print(f"conversion {conv_wall:.1f} s vs raw mksquashfs {raw_wall:.1f} s: "
          f"{result['ratio_wall']:.3f}x wall, {result['ratio_cpu']:.3f}x CPU "
          f"(docker save alone {save:.1f} s; load after {result['loadavg_after'][0]:.1f})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
