"""The lines a gate run prints under its verdict (``build-env verify``, the build's gate stage)."""

from __future__ import annotations

from builder.gate.verdicts import RELEASE, Verdict


def summary_lines(v: Verdict) -> list[str]:
    """One line per check that failed, warned, or was skipped (with the reason); then the
    GPU expectation and, for a partial run, why it is not a release verdict."""
    lines = []
    for c in v.report.get("checks", []):
        if c.get("status") in ("fail", "warn", "skip"):
            req = " (required)" if c.get("required") else ""
            lines.append(f"  {c.get('status'):4} {c.get('id')}{req}: {c.get('reason') or ''}"
                         .rstrip())
    if v.report.get("error"):
        lines.append(f"  error: {v.report['error']}")
    gate = v.gate
    arch = gate.arch if gate is not None else None
    if arch is not None and arch.emulated and not arch.refused:
        lines.append(f"  emulated: the {arch.image} image ran under QEMU on the "
                     f"{arch.engine_host} engine host (timeouts x{arch.emulation_factor:g})")
    gpus = gate.gpus if gate is not None else None
    if gpus is not None:
        seen = gpus.in_image
        lines.append(f"  GPUs expected: {gpus.expected} ({gpus.reason}); in the "
                     f"image: {seen.count if seen else None} ({seen.reason if seen else None})")
    if gate is not None and v.scope != RELEASE:
        lines.append(f"  partial verdict, unlocks no tag, SIF or publish: {v.partial_reason}")
    elif v.level is not None and v.gpu.status != "none":
        lines.append(f"  {v.level} verdict; gpu: {v.gpu.describe()}")
    return lines
