#!/usr/bin/env python3
"""Benchmark the build against its floor, side by side in one run. Prints JSON.

- ``cold_build_s``: the whole BuildKit build of the rendered context (BuildKit cache pruned, so
  nothing is cached: uv's cache lives only inside each install step; the base image present),
  from the first line of output to the image ID, layer export included;
- ``install_floor_s``: the same lock ``uv pip install --compile-bytecode``d on this host into an
  empty venv with an empty uv cache (the work the image's install steps must do), by the image's
  own interpreter where the host has it (``/usr/bin/pythonX.Y``: Debian's build, as in the
  debootstrap base; a pyenv or other build of the same version compiles bytecode at another
  speed, which would measure the interpreter, not the builder); where PATH's ``pythonX.Y`` is
  another build, its floor is printed too (``other_floors``);
- ``ratio``: cold build / floor (goal: <= 1.3). These machines are noisy: compare only within
  one run (``--rounds N`` alternates floor and build N times and reports medians). Each side
  starts on a settled disk (``settle``: what the side before wrote, and the files it removed,
  flushed first), so neither pays for the other's writeback.

A fresh private dockerd is started unless --docker-host is given. Defaults build the CPU fixture.
``--e2e`` also times whole ``build-env --target`` runs: cold, no change, and a verl-only bump.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.dockerd import import_debian_base, start_dockerd  # noqa: E402

CA = Path(os.environ.get("VERL_ENV_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt"))


def e2e(args: argparse.Namespace, workdir: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "builder", "--target", args.target, "--matrix",
           str(REPO / args.matrix), "--ca-bundle", str(CA), "--workdir", str(workdir), "--json",
           *extra]
    for s in args.set:
        cmd += ["--set", s]
    if args.base_image:
        cmd += ["--base-image", args.base_image]
    settle()
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"build failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout)
    build, verify = report["stages"]["build"], report["stages"]["verify"]
    selftest = (report.get("verification") or {}).get("duration_s")
    return {"wall_s": round(wall, 1), "build_s": build["seconds"], "steps": build.get("steps"),
            "cache_hits": build.get("cache_hits"), "reused": report.get("reused", False),
            "verify_s": verify["seconds"], "selftest_s": selftest, "image_id": report["image_id"]}


def settle(seconds: float = 3.0) -> None:
    """Flush what was written before (the other side's files, the pruned cache) and let the
    disk go quiet, so neither side pays for the other's writeback. (This machine's speed also
    drifts by half over tens of minutes, whatever ran before: hence rounds, interleaved.)"""
    os.sync()
    time.sleep(seconds)


def floor_pythons(version: str) -> list[str]:
    """The interpreters the floor installs for, each a real path: the system's
    ``/usr/bin/pythonX.Y`` (the build the image has, the floor the ratio is taken against)
    where it exists, then the first ``pythonX.Y`` on PATH when that is another build (a pyenv
    one compiles bytecode slower: the floor of the figures recorded before 2026-12-06)."""
    found = [str(Path(p).resolve()) for p in (f"/usr/bin/python{version}",
                                              shutil.which(f"python{version}")) if p]
    found = [p for p in found if Path(p).exists()]
    return list(dict.fromkeys(found)) or [f"python{version}"]


def install_floor(lock: Path, python: str, find_links: list[str]) -> float:
    """`uv pip install --compile-bytecode` of the lock into a fresh venv, empty uv cache."""
    with tempfile.TemporaryDirectory(prefix="verl-env-floor-", dir="/var/tmp") as tmp:
        env = {**os.environ, "UV_CACHE_DIR": f"{tmp}/cache", "UV_NO_CONFIG": "1",
               "SSL_CERT_FILE": str(CA), "TMPDIR": tmp}  # uv's leftovers removed with it
        subprocess.run(["uv", "venv", "-q", "--python", python, f"{tmp}/venv"], check=True,
                       env=env)
        cmd = ["uv", "pip", "install", "-q", "--python", f"{tmp}/venv/bin/python", "--no-deps",
               "--require-hashes", "--compile-bytecode", "-r", str(lock)]
        for link in find_links:
            cmd += ["--find-links", link]
        settle()
        start = time.monotonic()
        subprocess.run(cmd, check=True, env=env)
        return round(time.monotonic() - start, 1)


def cold_build(engine, ctx) -> dict:  # type: ignore[no-untyped-def]
    """The whole build with nothing cached but the base image."""
    freed = engine.prune_build_cache()
    settle()
    built = engine.build(ctx.path, target=ctx.manifest["target"], network="host",
                         secrets=ctx.secrets)
    steps = {f"{s['at']} {s['instruction'][:48]}": s["seconds"] for s in built.step_times
             if s["seconds"] >= 0.5}
    result = {"seconds": round(built.seconds, 1), "steps": built.steps,
              "cache_hits": built.cache_hits, "pruned_bytes": freed, "slow_steps_s": steps,
              "export_and_overhead_s": round(built.seconds - sum(
                  s["seconds"] for s in built.step_times), 1)}
    engine.client.api.remove_image(built.image_id, force=True)  # next round starts cold too
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--matrix", default="tests/fixtures/cpu.yaml")
    ap.add_argument("--target", default="cpu-x86_64")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--base-image", default=None)
    ap.add_argument("--rounds", type=int, default=1, help="floor/build pairs (medians reported)")
    ap.add_argument("--e2e", action="store_true",
                    help="also time build-env runs: cold, no change, verl-only bump")
    ap.add_argument("--bump", default="packages.verl=0.9.0", help="the verl-only change")
    ap.add_argument("--docker-host", default=None, help="use this engine (its cache is pruned)")
    args = ap.parse_args()

    daemon = None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally: stop dockerd
    if args.docker_host:
        os.environ["DOCKER_HOST"] = args.docker_host
    else:
        daemon = start_dockerd()
        os.environ["DOCKER_HOST"] = daemon.host
    work = Path(tempfile.mkdtemp(prefix="verl-env-bench-", dir="/var/tmp"))
    try:
        import_debian_base(os.environ["DOCKER_HOST"])
        from builder.engine import Engine, find_buildkit_cli
        from builder.resolve.lock import lock_for
        from builder.resolve.metadata import load_snapshot
        from builder.render import render_context
        from builder.matrix.spec import apply_overrides, load_matrix

        matrix = load_matrix(REPO / args.matrix)
        target = apply_overrides(matrix.target(args.target), args.set,
                                 base_image=args.base_image)
        snapshot = load_snapshot(matrix.path.parent / "metadata" / "pypi-snapshot.json")
        lock_text, lock_file = lock_for(matrix.path, target, snapshot, work)
        ctx = render_context(target, lock_text, snapshot, work / "context",
                             lock_file=lock_file, ca_bundle=CA)
        engine = Engine.connect()
        pythons = floor_pythons(target.python)
        floors: dict[str, list[float]] = {p: [] for p in pythons}
        builds = []
        for _ in range(args.rounds):
            for python in pythons:
                floors[python].append(install_floor(ctx.path / "lock.txt", python,
                                                    list(target.find_links)))
            builds.append(cold_build(engine, ctx))
        floor = statistics.median(floors[pythons[0]])
        cold = statistics.median(b["seconds"] for b in builds)
        result: dict = {
            "target": args.target, "set": args.set, "base_image": args.base_image,
            "cli": str(find_buildkit_cli()), "cpus": os.cpu_count(),
            "floor_python": pythons[0], "install_floor_s": floors[pythons[0]],
            "cold_build": builds, "ratio_cold_build_over_floor": round(cold / floor, 2),
            "goal": 1.3,
            "other_floors": {p: {"install_floor_s": floors[p], "ratio": round(
                cold / statistics.median(floors[p]), 2)} for p in pythons[1:]},
        }
        if args.e2e:
            engine.prune_build_cache()
            result["e2e_cold"] = e2e(args, work / "a", [])
            result["e2e_no_change"] = e2e(args, work / "b", [])
            result["e2e_verl_bump"] = e2e(args, work / "c", ["--set", args.bump])
            result["ratio_verl_bump_over_cold_e2e"] = round(
                result["e2e_verl_bump"]["wall_s"] / result["e2e_cold"]["wall_s"], 3)
            print(f"no-change run {result['e2e_no_change']['wall_s']:.1f} s end to end (goal "
                  f"<= 3 s); verl-only bump {result['ratio_verl_bump_over_cold_e2e']:.1%} of a "
                  f"cold run (goal <= 10 %); self-test {result['e2e_cold']['selftest_s']} s "
                  "(goal: CPU phases <= 8 s)", file=sys.stderr)
        print(json.dumps(result, indent=2))
        print(f"cold build {cold:.1f} s vs install floor {floor:.1f} s ({pythons[0]}): "
              f"{cold / floor:.2f}x (goal <= 1.3x)", file=sys.stderr)
        for python, other in result["other_floors"].items():
            print(f"  against the floor by {python}: "
                  f"{statistics.median(other['install_floor_s']):.1f} s, {other['ratio']:.2f}x",
                  file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if daemon:
            daemon.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
