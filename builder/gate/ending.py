"""The one ending of a gate run, image or SIF: read the self-test's report and exit code, fill
in what the gate saw, and make the :class:`~builder.gate.verdicts.Verdict`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from builder.gate.record import GateRecord, SeenGpus
from builder.gate.verdicts import EXIT_VERDICTS, Verdict


def in_image_gpus(report: Mapping[str, Any], phases: Sequence[str]) -> SeenGpus:
    """The GPUs the self-test saw inside the container, from its report's platform section."""
    platform = report.get("platform")
    count = platform.get("gpu_count") if isinstance(platform, Mapping) else None
    if count is not None:
        return SeenGpus(count, "GPUs torch sees inside the container")
    if "gpu" not in phases:
        return SeenGpus(None, "not measured: the gpu phase did not run")
    return SeenGpus(None, "not measured: GPU checks were not expected")


# what the self-test says when the image has no manifest (builder.selftest.manifest); its
# "(pass --manifest)" is advice for running it by hand: the gate sets its arguments itself
NO_MANIFEST = ": manifest not found"
GATE_NO_MANIFEST = ": the image has no verl-env manifest"


def no_manifest(report: Mapping[str, Any]) -> str | None:
    """The manifest path the self-test did not find in the image, when that is why it stopped."""
    error = report.get("error")
    for marker in (NO_MANIFEST, GATE_NO_MANIFEST):
        if isinstance(error, str) and marker in error:
            return error.split(marker, 1)[0]
    return None


def finish(subject: str, gate: GateRecord, *, exit_code: int | None, report: Mapping[str, Any],
           logs: str, seconds: float, timeout: float) -> Verdict:
    """The verdict of a self-test that ran: ``exit_code`` None when it was killed at
    ``timeout``; ``report`` empty when it wrote none (an error verdict with the log's tail).
    The gate's record gets the GPUs seen in the image and goes into the report."""
    out = dict(report)
    if exit_code is None:
        code = 3
        out.setdefault("overall", "error")
        out.setdefault("error", f"self-test killed after {timeout:.0f} s")
    else:
        code = exit_code if exit_code in EXIT_VERDICTS else 3
    if not out:
        out = {"overall": "error", "error": "the self-test wrote no report",
               "log_tail": logs[-2000:]}
        code = 3 if code == 0 else code
    missing = no_manifest(out)
    if missing is not None:
        out["error"] = (f"{missing}{GATE_NO_MANIFEST} (it was not built by build-env): "
                        "no pins to hold it to")
    if gate.gpus is not None:
        seen = in_image_gpus(out, gate.phases)
        gate = dataclasses.replace(gate, gpus=dataclasses.replace(gate.gpus, in_image=seen))
    out["gate"] = gate.to_dict()
    return Verdict(subject, code, out, logs, seconds)


def refused(subject: str, gate: GateRecord, *, code: int, error: str,
            check: Mapping[str, Any] | None = None) -> Verdict:
    """The verdict of a run the gate refused or could not start (no self-test report)."""
    report: dict[str, Any] = {"overall": EXIT_VERDICTS[code], "error": error}
    if check is not None:
        report["checks"] = [dict(check)]
    report["gate"] = gate.to_dict()
    return Verdict(subject, code, report, "", 0.0)
