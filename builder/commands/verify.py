"""``build-env verify IMAGE``: the in-image self-test on any image (or SIF): parse, run the gate
(:mod:`builder.gate`), record the verdict and print it."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

from builder.argtypes import positive_float
from builder.commands import _shared
from builder.engine import ContainerEngine, Engine, faults
from builder.errors import VerifyError
from builder.files import atomic_write_text
from builder.gate.ending import no_manifest
from builder.gate.image import verify_image
from builder.gate.plan import EMULATION_FACTOR
from builder.gate.record import GateRecord, SifRun
from builder.sif.gate import is_sif, verify_sif_image
from builder.gate.summary import phase_lines, scan_lines, summary_lines
from builder.render.baked import manifest as render_manifest
from builder.matrix.spec import load_matrix
from builder.gate.verdicts import Verdict, binding_from_labels, record

# the self-test's exit code -> the command's (docs/commands.md): an incomplete run is a gate that
# did not pass (1), an error one that could not run (3)
EXIT_CODES = {0: 0, 1: 1, 2: 1, 3: 3}
NAME = "verify"
HELP = "run the in-image self-test on any image"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    _options(p)


def gpu_count(text: str) -> int:
    """argparse type of ``--expect-gpus``: a count of GPUs, 0 or more."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a GPU count: {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return n


def seconds(text: str) -> float:
    """argparse type of ``--timeout``: seconds, a finite number > 0 (refused by the parser,
    before any engine call: 0 or less once reached the engine's client as a traceback)."""
    value = positive_float(text)
    if math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("image", metavar="IMAGE_OR_SIF",
                   help="image reference or ID, or a .sif file (run here, on this node, with the "
                        "family's --nv/--rocm and the node's GPUs)")
    p.add_argument("--report", type=Path, default=None, metavar="PATH",
                   help="write the self-test report (with the gate section) here")
    p.add_argument("--json", action="store_true",
                   help="print the report (with the gate section) as JSON on stdout")
    p.add_argument("--timeout", type=seconds, default=900, metavar="SECONDS",
                   help="seconds before the run is killed (a number > 0)")
    p.add_argument("--gpus", choices=["auto", "nvidia", "amd", "none"], default="auto",
                   help="GPUs handed to the container (auto: the family's, when expected)")
    p.add_argument("--expect-gpus", type=gpu_count, default=None, metavar="N",
                   help="GPUs the self-test must see (default: what the engine's host shows for "
                        "the target's family; 0 for cpu targets and emulated images)")
    p.add_argument("--target", default=None,
                   help="hold the image to this matrix target's pins instead of its baked manifest")
    p.add_argument("--phases", default=None, metavar="LIST",
                   help="run only these self-test phases (a partial verdict unless it covers the "
                        "family's required set)")
    p.add_argument("--emulated", action="store_true", default=None,
                   help="run the self-test as under QEMU emulation (timeouts x"
                        f"{EMULATION_FACTOR:g}); default: when the image's architecture is not "
                        "the engine host's")
    p.add_argument("--runtime", choices=("apptainer", "singularity", "ch-run"), default=None,
                   help="for a SIF: the runtime that runs it (default: apptainer, singularity, "
                        "then ch-run, which can run cpu images and GPU images where no GPU is "
                        "expected)")
    p.add_argument("--selftest-args", default="", metavar="ARGS",
                   help="extra self-test arguments, one string (e.g. '--strict'); arguments that "
                        "narrow or relax the run make the verdict partial")


def run(args: argparse.Namespace) -> int:
    if is_sif(args.image):
        return _run_sif(args)
    if args.runtime:
        raise VerifyError(f"--runtime applies to a SIF file; {args.image} is not one")
    engine = Engine.connect()
    with faults.stage(engine, "verify", what=f"the gate of {args.image}"):
        return _run_image(engine, args)


def _run_sif(args: argparse.Namespace) -> int:
    """``build-env verify FILE.sif``: the gate on this node (:mod:`builder.sif.gate`)."""
    path = Path(args.image).absolute()
    for option, given in (("--target", args.target), ("--gpus", args.gpus != "auto"),
                          ("--emulated", args.emulated)):
        if given:
            raise VerifyError(f"{option} applies to an image in the engine, not to a SIF "
                              f"({path})")
    phases = f"phases {args.phases}" if args.phases else "every phase"
    _progress(args, "verify", "start", f"the self-test runs on this node: {phases}; killed "
              f"after {args.timeout:g} s")
    try:
        v = verify_sif_image(path, expect_gpus=args.expect_gpus, timeout=args.timeout,
                             extra_args=shlex.split(args.selftest_args), phases=args.phases,
                             runtime=args.runtime)
    except VerifyError as exc:
        raise VerifyError(exc.args[0], target=str(path)) from None
    sif_run = v.gate.run if v.gate is not None else None
    assert isinstance(sif_run, SifRun)  # the SIF gate always records how it ran
    _write_report(args, v)
    record(sif_run.subject.digest, v, target=sif_run.subject.target)
    how = " ".join([str(sif_run.runtime), *sif_run.runtime_flags])
    _print(args, v, f"{path}: {v.describe()} ({how}, {v.seconds:.1f} s)")
    return EXIT_CODES.get(v.exit_code, 3)


def _run_image(engine: ContainerEngine, args: argparse.Namespace) -> int:
    image = engine.image(args.image)
    manifest = None
    if args.target:
        held = load_matrix(args.matrix).target(args.target)
        manifest = render_manifest(held, held.entry_hash, "unknown (verify --target)")
    try:
        v = verify_image(engine, image.id, expect_gpus=args.expect_gpus, timeout=args.timeout,
                         gpus=None if args.gpus == "none" else args.gpus,
                         extra_args=shlex.split(args.selftest_args), phases=args.phases,
                         manifest=manifest, emulated=args.emulated,
                         started=lambda gate, timeout: _started(args, gate, timeout))
    except VerifyError as exc:
        raise VerifyError(exc.args[0], target=args.image) from None
    _write_report(args, v)
    # the verdict is about the target the image was built for, unless held to another one
    labels = image.labels or {}
    target = args.target or labels.get("org.verl-env.target")
    # bound to this site's content only when the image's labels say what it was built from
    bound = None if args.target else binding_from_labels(args.matrix, labels)
    record(image.id, v, target=target, tags=list(image.tags), binding=bound)
    _print(args, v, f"{args.image}: {v.describe()} ({v.seconds:.1f} s)")
    return EXIT_CODES.get(v.exit_code, 3)


def _write_report(args: argparse.Namespace, v: Verdict) -> None:
    if args.report:
        atomic_write_text(args.report, json.dumps(v.report, indent=2) + "\n")


def _progress(args: argparse.Namespace, name: str, status: str, detail: str) -> None:
    """A progress line on stderr, in the build's stage-line form (``[IMAGE] name status
    detail``); text mode only (never with ``--json``)."""
    if not args.json:
        print(f"[{args.image}] {name:10} {status:5} {detail}".rstrip(), file=sys.stderr,
              flush=True)


def _started(args: argparse.Namespace, gate: GateRecord, timeout: float) -> None:
    """The line before the self-test's container starts: what runs, and its kill switch."""
    _progress(args, "verify", "start",
              f"the self-test runs in a fresh container: phases {','.join(gate.phases)}; "
              f"killed after {timeout:g} s")


def hint(args: argparse.Namespace, v: Verdict) -> str | None:
    """What to do about a verdict that could not hold the image to anything: the options
    ``verify`` itself has (never the self-test's own, which verify sets)."""
    if no_manifest(v.report) is None:
        return None
    if is_sif(args.image):
        return ("hint: this SIF has no verl-env manifest; a SIF from `build-env sif` or "
                "`build-env --target T --sif PATH` has one, or verify the image it was made "
                "from: build-env verify IMAGE --target T")
    return (f"hint: hold the image to a matrix target's pins: build-env verify "
            f"{shlex.quote(args.image)} --target T (the targets: build-env list; another "
            "matrix: --matrix PATH)")


def _print(args: argparse.Namespace, v: Verdict, headline: str) -> None:
    """The report (``--json``); in text mode a progress line per self-test phase (stderr: the
    gate reads the container's report when it exits, so they come together), the headline, the
    summary lines and what the ABI and coverage phases read; a hint, or the log's tail when the
    self-test errored."""
    out = sys.stderr if args.json else sys.stdout
    if args.json:
        print(json.dumps(v.report, indent=2, sort_keys=True))
    for phase, status, detail in phase_lines(v):
        _progress(args, phase, status, detail)
    print(headline, file=out)
    for line in summary_lines(v) + ([] if args.json else scan_lines(v)):
        print(line, file=out)
    advice = hint(args, v)
    if advice is not None:
        print(advice, file=sys.stderr)
    elif v.exit_code == 3 and v.logs:
        print(v.logs[-1500:], file=sys.stderr)
