"""``build-env cluster``: collect (and sign) a Slurm job's cluster verdict."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from builder import cluster as lib
from builder.cluster import FILE_NAME

NAME = "cluster"
HELP = "collect (and sign) a Slurm job's cluster verdict"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _options(p)


def run(args: argparse.Namespace) -> int:
    return lib.run(args)


def _options(p: Any) -> None:
    """``build-env cluster JOBDIR --sif SIF --cluster NAME [--sign-key KEY]``."""
    import os

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
