"""One owner per file: no two installed distributions may claim the same path in their
``*.dist-info/RECORD`` (the second install overwrote the first one's file, and removing or
upgrading either breaks the other: one package writing into another's directory, as
docs/stacks.md tells for two kernels packages). Stdlib only; run as the ABI phase's second step (``abi.records``).

A path both claim with the same content (the same RECORD hash: the empty ``__init__.py`` of a
namespace several wheels ship) is shared, named in the value, not failed; a ``.pyc`` both list
without a hash follows its source. Any other collision fails naming both distributions and the
path (the first few paths when there are many), unless the matrix's reviewed
``record_shared: {GLOB: REASON}`` names it (matched by :mod:`.allowpath`); an entry that excuses
no collision in the image is stale (a warning, a failure under ``--strict``).
"""

from __future__ import annotations

import csv
import glob
import os
from dataclasses import dataclass, field
from typing import Any

from ..manifest import normalize
from ..phase import Run
from ..report import FAIL, PASS, WARN, Check
from . import allowpath
from .coverage import site_dirs

CHECK = "abi.records"
PHASE = "abi"
SHOWN = 5  # collisions named in the reason (all are in the value)


@dataclass
class Claims:
    """Every path the RECORDs under the roots claim: path -> {distribution: hash}."""

    paths: dict[str, dict[str, str]] = field(default_factory=dict)
    records: int = 0
    unreadable: list[str] = field(default_factory=list)


def dist_label(dist_info: str) -> str:
    """``my_pkg-2.8.3.dist-info`` -> ``my-pkg 2.8.3``."""
    stem = os.path.basename(dist_info)[: -len(".dist-info")]
    name, _, version = stem.partition("-")
    return f"{normalize(name)} {version}".strip()


def read_claims(roots: list[str]) -> Claims:
    """The claims of every ``*.dist-info/RECORD`` under ``roots`` (paths relative to their
    root, normalised; a RECORD's own dist-info directory is its own and never compared)."""
    out = Claims()
    for root in roots:
        for record in sorted(glob.glob(os.path.join(root, "*.dist-info", "RECORD"))):
            info = os.path.dirname(record)
            label, own = dist_label(info), os.path.basename(info) + os.sep
            try:
                with open(record, encoding="utf-8", errors="replace", newline="") as f:
                    rows = list(csv.reader(f))
            except (OSError, csv.Error) as exc:
                out.unreadable.append(f"{record}: {exc}")
                continue
            out.records += 1
            for row in rows:
                if not row or not row[0].strip():
                    continue
                rel = os.path.normpath(row[0].strip())
                if rel.startswith(own):
                    continue
                out.paths.setdefault(rel, {})[label] = row[1].strip() if len(row) > 1 else ""
    return out


def same_content(path: str, hashes: dict[str, str]) -> bool:
    """Both (all) claims hold the same bytes: one non-empty hash, or a hashless ``.pyc``."""
    values = set(hashes.values())
    if values == {""}:
        return path.endswith(".pyc")
    return len(values) == 1 and "" not in values


def collisions(claims: Claims) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(paths claimed with different content, paths shared with the same content), each
    path -> the claiming distributions, sorted."""
    clash: dict[str, list[str]] = {}
    shared: dict[str, list[str]] = {}
    for path, by in sorted(claims.paths.items()):
        if len(by) < 2:
            continue
        (shared if same_content(path, by) else clash)[path] = sorted(by)
    return clash, shared


def check_records(run: Run, roots: list[str] | None = None) -> Check:
    """``abi.records``: fail when two distributions claim the same path with different
    content, unless ``record_shared`` names it; warn (fail under ``--strict``) on a stale
    ``record_shared`` entry."""
    roots = roots if roots is not None else (run.options.get("abi_roots") or site_dirs())
    allow = run.manifest.get("record_shared") or {}
    claims = read_claims(roots)
    clash, shared = collisions(claims)
    excused = {p: d for p, d in clash.items() if allowpath.reason(p, allow)}
    failing = {p: d for p, d in clash.items() if p not in excused}
    old = allowpath.stale(allow, clash)
    value: dict[str, Any] = {"roots": roots, "records": claims.records,
                             "paths": len(claims.paths), "collisions": failing,
                             "allowed": {p: {"by": d, "reason": allowpath.reason(p, allow)}
                                         for p, d in excused.items()},
                             "identical": shared, "stale": old,
                             "unreadable": claims.unreadable}
    notes = _notes(excused, allow, shared, claims.unreadable)
    if failing:
        shown = [f"{p} is claimed by {' and '.join(d)}" for p, d in list(failing.items())[:SHOWN]]
        more = f"; and {len(failing) - SHOWN} more (in the value)" if len(failing) > SHOWN else ""
        return Check(CHECK, PHASE, FAIL, value=value,
                     reason=f"two distributions claim the same file: {'; '.join(shown)}{more}"
                            f"{notes}")
    strict = bool(run.options.get("strict"))
    if old:
        return Check(CHECK, PHASE, FAIL if strict else WARN, value=value,
                     reason=allowpath.stale_text("record_shared", old, "collision")
                     + (" (--strict)" if strict else "") + notes)
    return Check(CHECK, PHASE, PASS, value=value,
                 reason=f"{claims.records} RECORDs, {len(claims.paths)} paths, each claimed by "
                        f"one distribution{', but for those below' if notes else ''}{notes}")


def _notes(excused: dict[str, list[str]], allow: dict[str, str],
           shared: dict[str, list[str]], unreadable: list[str]) -> str:
    out = ""
    for p, d in list(excused.items())[:SHOWN]:
        out += (f"; (allowed) {p} is claimed by {' and '.join(d)} (matrix record_shared: "
                f"{allowpath.reason(p, allow)})")
    if len(excused) > SHOWN:
        out += f"; and {len(excused) - SHOWN} more allowed (in the value)"
    if shared:
        first = next(iter(shared))
        out += (f"; {len(shared)} path{'s' if len(shared) > 1 else ''} claimed by several "
                f"distributions with the same content (e.g. {first}: "
                f"{' and '.join(shared[first])})")
    if unreadable:
        out += f"; unreadable: {'; '.join(unreadable[:SHOWN])}"
    return out
