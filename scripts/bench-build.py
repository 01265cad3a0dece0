#!/usr/bin/env python3
"""Benchmark the build: cold build, no-change rebuild, rebuild after bumping only verl, and
`uv pip install` of the same lock on the host for comparison. Prints JSON.

A fresh private dockerd (empty cache) is started unless --docker-host is given. Defaults build
the CPU fixture target; pass --matrix/--target/--set/--base-image for another configuration,
e.g. the acceptance stack:

    python scripts/bench-build.py --target cuda-x86_64 --base-image verl-env-test/debian:bookworm \
        --set python=3.11 --set packages.flash-attn.enabled=false
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.dockerd import import_debian_base, start_dockerd  # noqa: E402

CA = os.environ.get("VERL_ENV_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")


def build(args: argparse.Namespace, workdir: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "builder", "--target", args.target, "--matrix", args.matrix,
           "--ca-bundle", CA, "--workdir", str(workdir), "--json", *extra]
    for s in args.set:
        cmd += ["--set", s]
    if args.base_image:
        cmd += ["--base-image", args.base_image]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"build failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout)
    return {"wall_s": round(wall, 1), "build_s": report["stages"]["build"]["seconds"],
            "steps": report["stages"]["build"]["steps"],
            "cache_hits": report["stages"]["build"]["cache_hits"],
            "verify_s": report["stages"]["verify"]["seconds"], "image_id": report["image_id"]}


def host_uv_install(lock: Path, python: str, find_links: list[str]) -> float:
    """`uv pip install` of the same lock into a fresh venv with an empty uv cache."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "UV_CACHE_DIR": f"{tmp}/cache", "UV_NO_CONFIG": "1"}
        subprocess.run(["uv", "venv", "-q", "--python", python, f"{tmp}/venv"], check=True, env=env)
        cmd = ["uv", "pip", "install", "-q", "--python", f"{tmp}/venv/bin/python", "--no-deps",
               "--require-hashes", "--compile-bytecode", "-r", str(lock)]
        for link in find_links:
            cmd += ["--find-links", link]
        start = time.monotonic()
        subprocess.run(cmd, check=True, env=env)
        return round(time.monotonic() - start, 1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--matrix", default="tests/fixtures/cpu.yaml")
    ap.add_argument("--target", default="cpu-x86_64")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--base-image", default=None)
    ap.add_argument("--bump", default="packages.verl=0.9.0", help="the verl-only change")
    ap.add_argument("--docker-host", default=None, help="use this engine (cache not cleared)")
    args = ap.parse_args()

    daemon = None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally: stop dockerd
    if args.docker_host:
        os.environ["DOCKER_HOST"] = args.docker_host
    else:
        daemon = start_dockerd()
        os.environ["DOCKER_HOST"] = daemon.host
    work = Path(tempfile.mkdtemp(prefix="verl-env-bench-"))
    try:
        import_debian_base(os.environ["DOCKER_HOST"])
        result: dict = {"target": args.target, "set": args.set, "base_image": args.base_image}
        result["cold"] = build(args, work / "a", [])
        result["no_change"] = build(args, work / "b", [])
        result["verl_bump"] = build(args, work / "c", ["--set", args.bump])
        lock = work / "a" / "context" / "lock.txt"
        from builder.spec import apply_overrides, load_matrix

        t = apply_overrides(load_matrix(REPO / args.matrix).target(args.target), args.set,
                            base_image=args.base_image)
        result["host_uv_install_s"] = host_uv_install(lock, f"python{t.python}",
                                                      list(t.find_links))
        cold = result["cold"]["build_s"]
        result["ratios"] = {
            "verl_bump_over_cold": round(result["verl_bump"]["build_s"] / cold, 3),
            "cold_over_host_uv": round(cold / result["host_uv_install_s"], 2),
        }
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if daemon:
            daemon.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
