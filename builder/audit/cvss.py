"""The CVSS v3.x base score of a vector (``CVSS:3.1/AV:N/AC:L/...``), for an advisory whose only
severity is ``severity[]`` (FIRST's CVSS v3.1 specification, section 7.1; v3.0 vectors use the
same base equations), and the qualitative rating of a score."""

from __future__ import annotations

import math

_WEIGHTS = {
    "AV": {"N": 0.85, "A": 0.62, "L": 0.55, "P": 0.2},
    "AC": {"L": 0.77, "H": 0.44},
    "UI": {"N": 0.85, "R": 0.62},
    "C": {"H": 0.56, "L": 0.22, "N": 0.0},
    "I": {"H": 0.56, "L": 0.22, "N": 0.0},
    "A": {"H": 0.56, "L": 0.22, "N": 0.0},
}
_PR = {"U": {"N": 0.85, "L": 0.62, "H": 0.27}, "C": {"N": 0.85, "L": 0.68, "H": 0.5}}


def roundup(value: float) -> float:
    """CVSS v3.1 Roundup: the smallest number with one decimal >= ``value``."""
    whole = int(round(value * 100000))
    if whole % 10000 == 0:
        return whole / 100000.0
    return (math.floor(whole / 10000) + 1) / 10.0


def base_score(vector: str) -> float | None:
    """The base score of a CVSS v3.x vector; None for anything else (v2, v4, malformed)."""
    parts = vector.strip().split("/")
    if not parts or parts[0] not in ("CVSS:3.0", "CVSS:3.1"):
        return None
    metrics = dict(p.split(":", 1) for p in parts[1:] if ":" in p)
    try:
        scope = metrics["S"]
        pr = _PR[scope][metrics["PR"]]
        w = {k: _WEIGHTS[k][metrics[k]] for k in _WEIGHTS}
    except KeyError:
        return None
    iss = 1 - (1 - w["C"]) * (1 - w["I"]) * (1 - w["A"])
    if scope == "U":
        impact = 6.42 * iss
    else:
        impact = 7.52 * (iss - 0.029) - 3.25 * (iss - 0.02) ** 15
    exploitability = 8.22 * w["AV"] * w["AC"] * pr * w["UI"]
    if impact <= 0:
        return 0.0
    if scope == "U":
        return roundup(min(impact + exploitability, 10))
    return roundup(min(1.08 * (impact + exploitability), 10))


def rating(score: float) -> str | None:
    """The qualitative rating of a score, in the words OSV's PyPI advisories use
    (``database_specific.severity``): MODERATE is CVSS's Medium. None for 0.0 (None)."""
    if score >= 9.0:
        return "CRITICAL"
    if score >= 7.0:
        return "HIGH"
    if score >= 4.0:
        return "MODERATE"
    if score > 0.0:
        return "LOW"
    return None
