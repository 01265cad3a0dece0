"""``build-env slurm``: an sbatch script for a target; its family comes from the matrix."""

from __future__ import annotations

import argparse
import shlex
import sys

from builder import slurm as lib
from builder.commands import _shared

NAME = "slurm"
HELP = "write an sbatch script"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    p.add_argument("--target", default=None, help="matrix target (sets the accelerator family)")
    lib.add_arguments(p)
    _shared.json_flag(p, "what was written (with --output) or the script itself")
    _shared.quiet(p)


def run(args: argparse.Namespace) -> int:
    if args.target and not args.family:
        args.family = _shared.site(args).matrix.target(args.target).accelerator
    try:
        job = lib.job_from_args(args)
        summary = {"target": job.target, "family": job.family, "runtime": job.runtime,
                   "image": job.sif, "nodes": job.nodes, "gpus_per_node": job.gpus_per_node}
        if args.output:
            path = lib.write_sbatch(job, args.output)
            if args.json:
                _shared.emit_json("slurm", {**summary, "script": str(path)})
            _shared.info(args, f"wrote {path} (submit with: sbatch {shlex.quote(str(path))})")
        elif args.json:
            _shared.emit_json("slurm", {**summary, "script": None, "text": lib.render_sbatch(job)})
        else:
            sys.stdout.write(lib.render_sbatch(job))
    except lib.SlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0
