"""``build-env doctor``: pre-flight this machine for what it will do. On a build host (the
default off a cluster): the engine, BuildKit, the NVIDIA Container Toolkit, the data root's
free space, the CA bundle and the index (:func:`builder.cluster.doctor.run_build_host`). On a cluster
node (a Slurm job's environment or a running slurmd), or with ``--cluster``: the node checks
(:func:`builder.cluster.doctor.run_doctor`). Exit 0 when nothing failed (warnings included), 1
otherwise."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from builder.cluster import doctor as lib
from builder.commands import _shared
from builder.resolve.metadata import index_simple_url
from builder.cluster.doctor import FAIL, OK, SKIP, WARN

NAME = "doctor"
HELP = "pre-flight this build host (or cluster node) for a target"
SCHEMA = "verl-env/doctor/v1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    p.add_argument("--target", default=None,
                   help="the matrix target whose image will run here (its family and CUDA)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    where = p.add_argument_group("which checks (default: the cluster checks on a cluster node, "
                                 "a Slurm job's environment or a running slurmd; else the "
                                 "build-host checks)")
    where.add_argument("--cluster", action="store_true",
                       help="run the cluster-node checks (interface, runtime, ports, NCCL, ...); "
                            "implied by --interface, --runtime and --hf-home")
    where.add_argument("--build-host", action="store_true",
                       help="run the build-host checks (engine, BuildKit, NVIDIA Container "
                            "Toolkit, disk, CA bundle, index)")
    _shared.index_url(p)
    p.add_argument("--ca-bundle", type=Path, default=os.environ.get("VERL_ENV_CA_BUNDLE") or None,
                   metavar="PATH", help="the site CA bundle builds inject (env "
                   "VERL_ENV_CA_BUNDLE; config ca_bundle)")
    p.add_argument("--interface", default=None,
                   help="interface Ray/NCCL will use (a cluster check; default ib0)")
    p.add_argument("--hf-home", default=None, help="HF cache to test (default $HF_HOME)")
    p.add_argument("--runtime", default=None,
                   help="container runtime command (a cluster check; default apptainer; also "
                        "singularity, ch-run; pyxis: srun --container-image and enroot)")
    p.add_argument("--cuda", default=None, metavar="X.Y",
                   help="hold the node's driver to this CUDA (default: the --target's)")


def run(args: argparse.Namespace) -> int:
    accelerator, cuda = None, args.cuda
    if args.target:
        t = _shared.site(args).matrix.target(args.target)
        accelerator, cuda = t.accelerator, args.cuda or t.cuda
    asked = args.cluster or any(v is not None for v in (args.interface, args.runtime,
                                                         args.hf_home))
    cluster = asked or (not args.build_host and lib.on_cluster(os.environ))
    findings: list[lib.Finding] = []
    if args.build_host or not cluster:
        findings += lib.run_build_host(accelerator=accelerator, ca_bundle=args.ca_bundle,
                                             index_url=_index(args), cuda=cuda)
    if cluster:
        findings += lib.run_doctor(interface=args.interface or "ib0", hf_home=args.hf_home,
                                   runtime=args.runtime or "apptainer", accelerator=accelerator,
                                   cuda=cuda)
    failed = any(f.status == FAIL for f in findings)
    if args.json:
        summary = {s: sum(f.status == s for f in findings) for s in (OK, WARN, FAIL, SKIP)}
        json.dump({"schema": SCHEMA, "findings": [asdict(f) for f in findings],
                   "summary": summary, "ok": not failed,
                   "checks": [c for c, on in (("build-host", args.build_host or not cluster),
                                               ("cluster", cluster)) if on]},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        width = max((len(f.id) for f in findings), default=0)  # one column for every id
        for f in findings:
            print(f"[{f.status.upper():4}] {f.id:{width}} {f.message}")
            if f.status != OK and f.fix:
                print(f"{'':{width + 8}}fix: {f.fix}")
    return 1 if failed else 0


def _index(args: argparse.Namespace) -> str | None:
    """The index builds resolve from: --index-url (config index_url, VERL_ENV_INDEX_URL, uv's
    and pip's own settings); None when none can be told."""
    if args.index_url:
        return str(args.index_url)
    try:
        return index_simple_url()
    except Exception:  # noqa: BLE001 - reported as an unchecked index, not a crash
        return None
