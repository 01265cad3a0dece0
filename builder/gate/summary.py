"""The lines a gate run prints under its verdict (``build-env verify``, the build's gate stage)."""

from __future__ import annotations

from typing import Any

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


def _n(count: object, noun: str, plural: str = "") -> str:
    """``1 ELF file``, ``37,479 undefined symbols`` (a count the report lacks: ``? ...s``)."""
    plural = plural or f"{noun}s"
    if not isinstance(count, int):
        return f"? {plural}"
    return f"{count:,} {noun if count == 1 else plural}"


def _scan(v: Verdict, cid: str) -> dict[str, Any] | None:
    """The value of the scan check ``cid`` when it ran (a dict), else None."""
    for c in v.report.get("checks", []):
        if isinstance(c, dict) and c.get("id") == cid and isinstance(c.get("value"), dict):
            return c["value"]
    return None


def _seconds(value: dict[str, Any]) -> str:
    seconds = value.get("seconds")
    return f"in {seconds:.2f} s" if isinstance(seconds, (int, float)) else "in ? s"


def _of(value: dict[str, Any]) -> str:
    """`` of 41 distributions`` (nothing when the self-test that ran did not count them)."""
    dists = value.get("distributions")
    return f" of {_n(dists, 'distribution')}" if isinstance(dists, int) else ""


def scan_lines(v: Verdict) -> list[str]:
    """What the ABI and the device-code coverage phases read, one line each, from their scan
    checks' values (``abi.scan``, ``coverage.scan``); nothing for a phase that did not scan."""
    lines = []
    abi = _scan(v, "abi.scan")
    if abi is not None:
        lines.append(f"  abi: {_n(abi.get('elf_files'), 'ELF file')} read, "
                     f"{_n(abi.get('objects'), 'shared object')}{_of(abi)}, "
                     f"{_n(abi.get('symbols'), 'undefined symbol')} checked {_seconds(abi)}")
    cov = _scan(v, "coverage.scan")
    if cov is not None:
        gpus = cov.get("gpus")
        where = f" for {', '.join(map(str, gpus))}" if isinstance(gpus, list) and gpus else ""
        libraries = _n(cov.get("libraries"), "library", "libraries")
        lines.append(f"  coverage: {_n(cov.get('elf_files'), 'ELF file')} read, {libraries} "
                     f"with device code{_of(cov)} checked{where} {_seconds(cov)}")
    return lines


def _phase_status(statuses: list[str]) -> str:
    """A phase's one word: fail, warn, skip (every check skipped), else pass."""
    for worst in ("fail", "warn"):
        if worst in statuses:
            return worst
    return "skip" if statuses and all(s == "skip" for s in statuses) else "pass"


def phase_lines(v: Verdict) -> list[tuple[str, str, str]]:
    """One ``(phase, status, detail)`` per self-test phase in the report, in the order it lists
    them: its checks by status and the seconds its checks took (their ``duration_s``)."""
    phases: dict[str, list[dict[str, Any]]] = {}
    for c in v.report.get("checks", []):
        if isinstance(c, dict):
            phases.setdefault(str(c.get("phase") or "?"), []).append(c)
    out = []
    for phase, checks in phases.items():
        statuses = [str(c.get("status")) for c in checks]
        counts = ", ".join(f"{statuses.count(s)} {s}" for s in ("pass", "warn", "fail", "skip")
                           if s in statuses)
        seconds = sum(float(c.get("duration_s") or 0) for c in checks)
        out.append((phase, _phase_status(statuses), f"{_n(len(checks), 'check')} ({counts}), "
                    f"{seconds:.1f} s"))
    return out
