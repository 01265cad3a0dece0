"""``build-env cluster``: collect (and sign) a Slurm job's cluster verdict; exit 0 when it
passed, 1 when not."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from builder.cluster import verdict as lib
from builder.cluster.verdict import FILE_NAME, PASS
from builder.trust.cluster_signing import sign_cluster
from builder.gate.verdicts import NONE

NAME = "cluster"
HELP = "collect (and sign) a Slurm job's cluster verdict"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``build-env cluster JOBDIR --sif SIF --cluster NAME [--sign-key KEY]``."""
    p.add_argument("job_dir", type=Path, metavar="JOBDIR",
                   help="the Slurm job's directory (selftest-<node>.json and .rc)")
    p.add_argument("--sif", type=Path, required=True, help="the SIF the job ran")
    p.add_argument("--cluster", required=True, metavar="NAME",
                   help="the site/cluster name the verdict holds for")
    p.add_argument("--output", type=Path, default=None, metavar="PATH",
                   help=f"where the verdict goes (default: JOBDIR/{FILE_NAME})")
    p.add_argument("--nodes", default="", metavar="NODE,...",
                   help="the job's nodes: one that left no result is a missing (failed) node")
    p.add_argument("--job", default=None, metavar="ID", help="the job's name in the verdict "
                   "(default: the job directory's name)")
    p.add_argument("--runtime", default=None, metavar="NAME",
                   help="the container runtime the job ran the image with")
    p.add_argument("--sign-key", type=Path, default=os.environ.get("VERL_ENV_SIGN_KEY") or None,
                   metavar="PATH", help="sign it and append it to SIF.clusters.intoto.jsonl "
                   "(env VERL_ENV_SIGN_KEY)")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")


def run(args: argparse.Namespace) -> int:
    verdict = lib.collect(args.job_dir, args.sif, args.cluster, job=args.job,
                          nodes=tuple(n for n in args.nodes.split(",") if n),
                          runtime=args.runtime)
    path = lib.write(verdict, args.output or Path(args.job_dir) / FILE_NAME)
    signed = sign_cluster(args.sif, verdict, args.sign_key) if args.sign_key else None
    if args.json:
        print(json.dumps(verdict.to_dict(), indent=2, sort_keys=True))
    else:
        print(f"{args.sif}: {verdict.describe()}")
        for n in verdict.nodes:
            gpu = n.gpu.get("status")
            print(f"  {n.node}: {n.overall} (exit {n.exit_code})"
                  + (f", gpu {gpu}" if gpu and gpu != NONE else "")
                  + (f": {n.reason}" if n.reason else ""))
        for problem in verdict.problems:
            print(f"  problem: {problem}")
        print(f"  written: {path}")
        if signed is not None:
            print(f"  signed: {signed[0]} (key {signed[1][:16]})")
    return 0 if verdict.overall == PASS else 1
