"""The gate of a SIF, on the node that runs it: every phase of the family (a narrower run is
partial, as for an image), with the family's runtime flags (``--nv``/``--rocm``), the GPU
expectation from the node (Slurm's count, else its devices; ``--expect-gpus``), failing closed
like the image gate (:mod:`builder.gate.plan`)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from builder.errors import VerifyError
from builder.matrix.families import FAMILIES
from builder.files import sha256_file
from builder.gate import ending
from builder.gate.plan import (RELEASE_PHASES, host_dev_root, list_devices, plan_selftest,
                               plan_sif_gate)
from builder.gate.record import GateRecord, SifRun, SifSubject
from builder.sif import format as sif_format
from builder.sif.checks import pick_runtime, run_in_sif, sif_labels
from builder.gate.verdicts import PARTIAL, RELEASE, Verdict


def is_sif(text: str) -> bool:
    """Whether ``text`` names a SIF file (by its suffix or its header)."""
    path = Path(text)
    return path.is_file() and (path.suffix == ".sif" or sif_format.is_sif(path))


def verify_sif_image(path: Path, *, expect_gpus: int | None = None, timeout: float = 900,
                     extra_args: Sequence[str] | None = None, phases: str | None = None,
                     runtime: str | None = None, environ: Mapping[str, str] | None = None,
                     dev_root: str | None = None) -> Verdict:
    """The gate on the SIF at ``path`` (see the module doc). Raises VerifyError for bad
    arguments or a file that is not a SIF; every other problem is a fail or error verdict."""
    environ = os.environ if environ is None else environ
    dev_root = dev_root or host_dev_root()
    try:
        labels = sif_labels(path)
    except (OSError, sif_format.SifFormatError) as exc:
        raise VerifyError(f"{path}: not a readable SIF ({exc})") from None
    family = labels.get("org.verl-env.accelerator")
    family = family if family in RELEASE_PHASES else None
    plan = plan_selftest(family, extra_args or (), phases)
    chosen = pick_runtime(runtime)
    if runtime and chosen is None:
        raise VerifyError(f"--runtime {runtime}: not installed on this node")
    fam = FAMILIES.get(family or "")
    devices = list_devices(fam.vendor.name, dev_root) if fam and fam.vendor else None
    sg = plan_sif_gate(family, runtime=chosen, expect_gpus=expect_gpus, environ=environ,
                       devices=devices, dev_root=dev_root)
    reasons = [r for r in (plan.partial_reason, sg.gpus.narrowed) if r]
    subject = SifSubject(str(path), sha256_file(path), labels.get("org.verl-env.target"))
    sif_run = SifRun(subject, sg.runtime[0] if sg.runtime else None, tuple(sg.flags),
                     tuple(sorted(sg.env)))
    gate = GateRecord(family, plan.phases, plan.required, plan.args, sif_run,
                      scope=PARTIAL if reasons else RELEASE,
                      partial_reason="; ".join(reasons) or None, gpus=sg.gpus)
    if sg.refused:
        check = {"id": "gate.runtime", "phase": "gate", "status": "fail", "required": True,
                 "value": sif_run.runtime, "reason": sg.refused}
        return ending.refused(str(path), gate, code=1, error=sg.refused, check=check)
    args = list(plan.args)
    if sg.gpus.expected is not None:
        args += ["--expect-gpus", str(sg.gpus.expected)]
    run = run_in_sif(path, args, timeout=timeout, runtime=sg.runtime, flags=sg.flags,
                     env=sg.env)
    gate = dataclasses.replace(gate, run=dataclasses.replace(sif_run, command=tuple(run.command)))
    return ending.finish(str(path), gate, exit_code=run.exit_code, report=run.report,
                         logs=run.logs, seconds=run.seconds, timeout=timeout)
