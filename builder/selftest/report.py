"""Check records, the overall verdict, exit codes, the JSON report and the human table.

Everything here is pure: no probing, no subprocesses.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Mapping

from . import SCHEMA, __version__

PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"
STATUSES = (PASS, FAIL, WARN, SKIP)
OVERALL_PASS, OVERALL_FAIL, OVERALL_INCOMPLETE = "pass", "fail", "incomplete"
EXIT_PASS, EXIT_FAIL, EXIT_INCOMPLETE, EXIT_ERROR = 0, 1, 2, 3
SEVERITY = {OVERALL_PASS: 0, OVERALL_INCOMPLETE: 1, OVERALL_FAIL: 2}

# Skip reasons used by several phases (tests match on them).
NO_GPU_BUILD_HOST = "no GPU visible (build host)"
CPU_TARGET = "target has no accelerator (cpu)"

REPORT_FIELDS = ("id", "phase", "required", "status", "value", "unit", "threshold", "reason",
                 "duration_s")


@dataclass
class Check:
    """One check result.

    ``applies`` is internal (not written to the report): False when the check does not apply
    to this target at all (a ROCm-only device on a CUDA target, RDMA on a CPU target), so that
    ``--strict`` does not turn its skip into ``incomplete``.
    """

    id: str
    phase: str
    status: str
    required: bool = True
    value: Any = None
    unit: str | None = None
    threshold: dict[str, Any] | None = None
    reason: str = ""
    duration_s: float = 0.0
    applies: bool = True

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"{self.id}: bad status {self.status!r}")

    def to_dict(self, internal: bool = False) -> dict[str, Any]:
        """The record as a JSON-ready dict; ``internal`` keeps ``applies`` (worker → runner)."""
        raw = asdict(self)
        d = {k: raw[k] for k in REPORT_FIELDS}
        d["value"] = json_safe(d["value"])
        d["duration_s"] = round(float(d["duration_s"]), 3)
        if internal:
            d["applies"] = self.applies
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Check":
        """Inverse of ``to_dict`` (unknown keys ignored)."""
        keys = set(REPORT_FIELDS) | {"applies"}
        return cls(**{k: v for k, v in d.items() if k in keys})


def threshold(op: str, value: Any, basis: str | None = None, **extra: Any) -> dict[str, Any]:
    """A threshold record: ``{"op": ">=", "value": 1.0, "basis": "..."}``."""
    t: dict[str, Any] = {"op": op, "value": json_safe(value)}
    if basis:
        t["basis"] = basis
    t.update({k: json_safe(v) for k, v in extra.items()})
    return t


def json_safe(value: Any) -> Any:
    """Replace NaN/inf floats (not valid JSON) by None, recursively; round long floats."""
    if isinstance(value, float):
        return None if (math.isnan(value) or math.isinf(value)) else round(value, 6)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def apply_strict(checks: Iterable[Check], strict: bool) -> list[Check]:
    """With ``--strict`` every check that applies to the target becomes required, so that
    any skip of it makes the run ``incomplete``."""
    if not strict:
        return list(checks)
    return [replace(c, required=True) if c.applies else c for c in checks]


def verdict(checks: Iterable[Check]) -> str:
    """``fail`` if any check failed; ``incomplete`` if a required check was skipped or
    nothing ran at all; ``pass`` otherwise. A skipped required check is never a pass."""
    checks = list(checks)
    if any(c.status == FAIL for c in checks):
        return OVERALL_FAIL
    if not checks or any(c.status == SKIP and c.required for c in checks):
        return OVERALL_INCOMPLETE
    return OVERALL_PASS


def worst(verdicts: Iterable[str]) -> str:
    """The most severe of several verdicts (how ranks agree on one)."""
    return max(verdicts, key=lambda v: SEVERITY[v], default=OVERALL_INCOMPLETE)


def exit_code(overall: str) -> int:
    """0 pass, 1 fail, 2 incomplete."""
    return {OVERALL_PASS: EXIT_PASS, OVERALL_FAIL: EXIT_FAIL,
            OVERALL_INCOMPLETE: EXIT_INCOMPLETE}[overall]


def summarize(checks: Iterable[Check]) -> dict[str, int]:
    """Counts per status."""
    out = {s: 0 for s in STATUSES}
    for c in checks:
        out[c.status] += 1
    return out


@dataclass
class ReportMeta:
    """Run-level facts that go next to the checks."""

    started: str
    duration_s: float
    host: str
    launcher: str = "standalone"
    world_size: int = 1
    hosts: list[str] = field(default_factory=list)
    transport: str | None = None
    target: str | None = None
    manifest: str | None = None
    platform: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)


def build_report(meta: ReportMeta, checks: list[Check], overall: str) -> dict[str, Any]:
    """The JSON report (schema ``verl-env/selftest/v1``)."""
    return {
        "schema": SCHEMA,
        "selftest_version": __version__,
        "started": meta.started,
        "duration_s": round(meta.duration_s, 3),
        "host": meta.host,
        "launcher": meta.launcher,
        "world_size": meta.world_size,
        "hosts": meta.hosts or [meta.host],
        "transport": meta.transport,
        "target": meta.target,
        "manifest": meta.manifest,
        "platform": json_safe(meta.platform),
        "versions": json_safe(meta.versions),
        "checks": [c.to_dict() for c in checks],
        "summary": summarize(checks),
        "overall": overall,
    }


def format_value(value: Any, unit: str | None) -> str:
    """Short human form of a value and its unit."""
    if value is None:
        return "-"
    if isinstance(value, float):
        text = f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    elif isinstance(value, (list, tuple)):
        text = ",".join(str(v) for v in value) or "[]"
    elif isinstance(value, dict):
        text = ",".join(f"{k}={v}" for k, v in value.items())
    else:
        text = str(value)
    return f"{text} {unit}" if unit else text


def _clip(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def render_table(checks: list[Check], overall: str, duration_s: float, width: int = 120) -> str:
    """A compact table: status, required mark, id, value, reason; then one summary line."""
    id_w = min(max([len(c.id) for c in checks] + [5]), 34)
    val_w = 16
    reason_w = max(width - id_w - val_w - 12, 20)
    lines = [f"{'STATUS':<6} {'R':<1} {'CHECK':<{id_w}} {'VALUE':<{val_w}} REASON"]
    for c in checks:
        lines.append(
            f"{c.status.upper():<6} {'*' if c.required else ' '} {_clip(c.id, id_w):<{id_w}} "
            f"{_clip(format_value(c.value, c.unit), val_w):<{val_w}} {_clip(c.reason, reason_w)}"
        )
    s = summarize(checks)
    lines.append(
        f"overall: {overall.upper()} ({s['pass']} pass, {s['warn']} warn, {s['fail']} fail, "
        f"{s['skip']} skip; * = required) in {duration_s:.1f} s"
    )
    return "\n".join(lines)


COVERAGE_CELL = {"native": "native", "ptx-jit": "jit(ptx)", "spirv-jit": "jit(spirv)",
                 "none": "NONE", "unreadable": "?"}


def render_coverage(checks: list[Check], width: int = 120) -> str:
    """The device-code coverage table from ``coverage.scan``'s value: one row per library,
    one column per declared GPU (native / jit(ptx) / NONE / ? unreadable). Empty when the
    coverage phase did not produce a table."""
    scan = next((c for c in checks if c.id == "coverage.scan" and isinstance(c.value, dict)
                 and "table" in c.value), None)
    if scan is None:
        return ""
    gpus: list[str] = list(scan.value.get("gpus") or [])
    rows: list[dict[str, Any]] = scan.value["table"]
    if not rows:
        return f"device code coverage: no library with device code ({scan.reason})"
    cells = [[r["dist"], r["library"]] + [COVERAGE_CELL.get(r["gpus"].get(g, ""), "?")
                                          + ("*" if g in r.get("gaps", {}) else "")
                                          + ("(allowed)" if r.get("allowed") and
                                             r["gpus"].get(g) == "none" else "")
                                          for g in gpus] for r in rows]
    head = ["DISTRIBUTION", "LIBRARY"] + gpus
    widths = [max(len(str(x[i])) for x in cells + [head]) for i in range(len(head))]
    lib_max = max(width - sum(widths) + widths[1] - 2 * len(head), 48)
    widths[1] = min(widths[1], lib_max)
    lines = [f"device code coverage ({scan.reason}):"]
    for row in [head] + cells:
        text = [_clip(str(x), w) if i == 1 else str(x) for i, (x, w) in
                enumerate(zip(row, widths))]
        lines.append("  ".join(f"{x:<{w}}" for x, w in zip(text, widths)).rstrip())
    for r in rows:
        if r.get("allowed"):
            lines.append(f"(allowed) {r['library']}: {r['allowed']} (matrix coverage_allow)")
    if any(r.get("gaps") for r in rows):
        lines.append("* some of the library's fat binaries (translation units) have no code for "
                     "that GPU: their kernels fail there if launched (often deliberate: "
                     "arch-specific kernels; the counts are in the JSON table's 'gaps')")
    return "\n".join(lines)
