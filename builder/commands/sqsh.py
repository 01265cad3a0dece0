"""``build-env sqsh``: a verified image as an enroot squashfs (pyxis), streamed like the SIF."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from builder.commands import _shared
from builder.errors import SifError
from builder.sif import sqsh as lib
from builder.sif.sqsh import COMPRESSIONS

NAME = "sqsh"
HELP = "write a verified image as an enroot squashfs (pyxis)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    _shared.verified_image(p, "convert")
    p.add_argument("--output", "-o", type=Path, default=None, metavar="PATH",
                   help="the .sqsh to write (default: ./<target>.sqsh)")
    p.add_argument("--compression", choices=sorted(COMPRESSIONS), default="gzip",
                   help="squashfs compression (default gzip; none: fastest to write)")
    p.add_argument("--tmpdir", type=Path, default=None,
                   help="scratch space (default: beside the output)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    ref, target = _shared.verified_source(args)
    output = args.output or Path(f"{_shared.output_name(ref, target)}.sqsh")
    engine, image = _shared.engine_image(ref, target, SifError)
    report = lib.convert(engine, image, output=output, source=ref, target=target,
                         force=args.force, compression=args.compression, tmpdir=args.tmpdir)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(f"{report['output']}: {report['size'] / 2**20:.0f} MiB enroot squashfs from {ref} "
              f"({report['build']['seconds']:.1f} s); run it with srun --container-image="
              f"{report['output']} or build-env slurm --runtime pyxis --image {report['output']}")
    return 0
