"""``build-env sif``: a verified image as an Apptainer ``.sif``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from builder.gate import verdicts
from builder import files
from builder.commands import _shared
from builder.errors import SifError
from builder.sif.convert import (DEFAULT_PHASES, convert, refuse_backend_compression, summary,
                                 write_report)
from builder.sif.native import COMPRESSIONS

NAME = "sif"
HELP = "convert a verified image to .sif"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    _shared.verified_image(p, "convert")
    p.add_argument("--output", "-o", type=Path, default=None, metavar="PATH",
                   help="the .sif to write (default: ./<target>.sif)")
    p.add_argument("--backend", choices=["auto", "apptainer", "native"], default="auto",
                   help="apptainer (through spython) or native (mksquashfs + SIF writer); "
                        "auto: apptainer when installed")
    p.add_argument("--compression", choices=sorted(COMPRESSIONS), default="gzip",
                   help="squashfs compression (default gzip, as apptainer's; none: nothing "
                        "compressed, about three times gzip's size, written in seconds; the "
                        "native backend)")
    _shared.require(p)
    p.add_argument("--phases", default=DEFAULT_PHASES,
                   help=f"self-test phases run from the SIF (default: {DEFAULT_PHASES})")
    p.add_argument("--no-run", action="store_true",
                   help="check structure and contents only; do not run the self-test from the "
                        "SIF (the verification is then incomplete, and accepted as such)")
    p.add_argument("--timeout", type=float, default=900, help="seconds for the self-test run")
    p.add_argument("--tmpdir", type=Path, default=None,
                   help="scratch space (default: beside the output)")
    p.add_argument("--report", type=Path, default=None, metavar="PATH",
                   help="also write the conversion and verification report here")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    refuse_backend_compression(args.backend, args.compression)
    ref, target = _shared.verified_source(args)
    output = args.output or Path(f"{_shared.output_name(ref, target)}.sif")
    engine, image = _shared.engine_image(ref, target, SifError)
    report = convert(engine, image, output=output, source=ref, target=target,
                     backend=args.backend, force=args.force, run=not args.no_run,
                     phases=args.phases, timeout=args.timeout, tmpdir=args.tmpdir,
                     require=verdicts.requirement(args.require), compression=args.compression)
    if args.report:
        try:
            write_report(args.report, report)
        except OSError as exc:
            raise SifError(f"{args.report}: cannot write the report ({files.reason(exc)}); "
                           f"the SIF at {report['output']} is complete and verified",
                           target=target) from None
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        for line in summary(report):
            print(line)
    return 0
