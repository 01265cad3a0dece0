"""``build-env doctor``: pre-flight a cluster node; exit 0 when nothing failed, 1 otherwise."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from builder import doctor as lib
from builder.commands import _shared
from builder.doctor import FAIL, OK, SKIP, WARN

NAME = "doctor"
HELP = "pre-flight a cluster node"
SCHEMA = "verl-env/doctor/v1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    p.add_argument("--target", default=None,
                   help="the matrix target whose image will run here (its family and CUDA)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--interface", default="ib0", help="interface Ray/NCCL will use")
    p.add_argument("--hf-home", default=None, help="HF cache to test (default $HF_HOME)")
    p.add_argument("--runtime", default="apptainer",
                   help="container runtime command (apptainer, singularity, ch-run; pyxis: "
                        "srun --container-image and enroot)")
    p.add_argument("--cuda", default=None, metavar="X.Y",
                   help="hold the node's driver to this CUDA (default: the --target's)")


def run(args: argparse.Namespace) -> int:
    accelerator, cuda = None, args.cuda
    if args.target:
        t = _shared.site(args).matrix.target(args.target)
        accelerator, cuda = t.accelerator, args.cuda or t.cuda
    findings = lib.run_doctor(interface=args.interface, hf_home=args.hf_home,
                              runtime=args.runtime, accelerator=accelerator, cuda=cuda)
    failed = any(f.status == FAIL for f in findings)
    if args.json:
        summary = {s: sum(f.status == s for f in findings) for s in (OK, WARN, FAIL, SKIP)}
        json.dump({"schema": SCHEMA, "findings": [asdict(f) for f in findings],
                   "summary": summary, "ok": not failed}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for f in findings:
            print(f"[{f.status.upper():4}] {f.id:20} {f.message}")
            if f.status != OK and f.fix:
                print(f"{'':27}fix: {f.fix}")
    return 1 if failed else 0
