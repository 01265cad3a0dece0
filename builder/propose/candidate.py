"""The candidate: uv's lock for the proposal, a directory a reviewer (and the pipeline) can read,
its build and gate, and ``--apply`` of a proven proposal into the site's matrix.

The directory is a site of its own (``matrix.yaml`` with the one proposed target entry,
``metadata/pypi-snapshot.json``, ``locks/``), so the real pipeline builds and gates it exactly
as it would the site; beside them ``matrix.diff`` (the change to the site's matrix),
``PROPOSAL.md`` (the text of a pull request) and ``proposal.json``. It is never written into
the site, and a directory this tool did not write is never replaced.
"""

from __future__ import annotations

import difflib
import json
import re
import shutil
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from builder.resolve import vendor
from builder.errors import BuildEnvError, LockError
from builder.files import (
    NotOurDirectory,
    atomic_write_text,
    check_replaceable,
    replace_generated_dir,
)
from builder.resolve.lock import compile_lock, lock_path, moved_pins, parse_lock
from builder.resolve.metadata import Snapshot, load_snapshot, save_snapshot
from builder.pipeline import run
from builder.plan import BuildRequest
from builder.propose.proposal import Proposal, candidate_target
from builder.propose.search import NotProven, ProposeError
from builder.selftest.report import Check, render_coverage
from builder.matrix.spec import Target, load_matrix

MARKER = ".verl-env-proposal"


# --------------------------------------------------------------------------- uv


def resolve(site_matrix: Path, target: Target, proposal: Proposal, snapshot: Snapshot,
            locks_dir: Path, *, fetch_git: bool = True) -> Target:
    """uv's lock of the candidate into ``locks_dir`` (the site's lock is uv's preference; the
    moved pins are upgraded). Sets the proposal's ``lock`` and status (``resolved`` or
    ``unresolvable`` with uv's words); returns the candidate target."""
    cand = candidate_target(target, proposal)
    current = lock_path(site_matrix, target)
    out = locks_dir / current.name
    out.parent.mkdir(parents=True, exist_ok=True)
    for extra in (vendor.base_record_path(current),):  # a vendor base's record travels along
        if extra.is_file():
            shutil.copy2(extra, locks_dir / extra.name)
    try:
        lock = compile_lock(cand, snapshot, out, prefer=current if current.is_file() else None,
                            record=vendor.load_record(cand, out),
                            upgrade_packages=tuple(p.name for p in proposal.pins if p.moved),
                            fetch_git=fetch_git)
    except (LockError, BuildEnvError) as exc:
        proposal.status, proposal.error = "unresolvable", str(exc)
        return cand
    before = current.read_text() if current.is_file() else None
    proposal.lock = {"packages": len(parse_lock(lock.text)), "seconds": round(lock.seconds, 1),
                     "moved": [{"name": n, "old": o, "new": v}
                               for n, o, v in moved_pins(before, lock.text)]}
    proposal.status = "resolved"
    return cand


# --------------------------------------------------------------------------- the directory


def entry(target: Target, site_dir: Path) -> dict[str, Any]:
    """The target as a matrix entry (the canonical form, re-readable by ``load_matrix``); a local
    source path is made absolute (the candidate lives elsewhere)."""
    d = target.to_dict()
    d.pop("name")
    for k in ("cuda", "rocm"):
        if d.get(k) is None:
            d.pop(k, None)
    for k in ("provided", "find_links", "apt"):
        if not d.get(k):
            d.pop(k, None)
    if target.description:
        d = {"description": target.description, **d}
    for name, pkg in d["packages"].items():
        pin = target.package(name)
        if pin is not None and pin.import_name:  # not part of to_dict(): the gate checks it
            pkg["import"] = pin.import_name
        src = pkg.get("source")
        if isinstance(src, dict) and "path" in src and not Path(src["path"]).is_absolute():
            src["path"] = str((site_dir / src["path"]).resolve())
    return d


def matrix_text(target: Target, site_dir: Path, site_matrix: Path) -> str:
    body = yaml.safe_dump({"schema": 1, "targets": {target.name: entry(target, site_dir)}},
                          sort_keys=False, default_flow_style=False)
    return (f"# A proposal for targets.{target.name} of {site_matrix} (build-env propose).\n"
            "# Review PROPOSAL.md and matrix.diff; `build-env propose --apply DIR` writes a proven "
            "one into the site.\n" + body)


def edited_matrix(site_matrix: Path, target: Target, proposal: Proposal) -> str:
    """The site's matrix text with the target's moved pins rewritten where the target writes
    them itself. A pin the target inherits (defaults, a YAML anchor) gets a line of its own
    under the target's ``packages:``. Checked by loading the result: the proposed target must
    carry exactly the proposed pins and every other target must be unchanged."""
    text = site_matrix.read_text()
    lines = text.splitlines(keepends=True)
    before = load_matrix(site_matrix)
    start = before.targets[target.name].lines.get("")
    own = _own_lines(before, target.name, len(lines))
    inserts: list[tuple[int, str]] = []
    for p in proposal.pins:
        if not p.moved:
            continue
        line_no = target.lines.get(f"packages.{p.name}")
        if line_no and line_no in own:
            raw = lines[line_no - 1]
            new = _replace_version(raw, p.old, p.new)
            if new is None:
                raise ProposeError(f"{site_matrix}:{line_no}: targets.{target.name}.packages."
                                   f"{p.name}: cannot find the version {p.old} on this line to "
                                   "rewrite it")
            lines[line_no - 1] = new
            continue
        pk = target.lines.get("packages")
        if not pk or pk not in own or start is None:
            raise ProposeError(f"{site_matrix}: targets.{target.name} has no packages: of its "
                               f"own to write {p.name} {p.new} under; edit the matrix by hand "
                               "(matrix.diff shows the entry)")
        indent = _child_indent(lines, pk)
        inserts.append((pk, f'{indent}{p.name}: "{p.new}"  # build-env propose\n'))
    for at, line in sorted(inserts, reverse=True):
        lines.insert(at, line)
    out = "".join(lines)
    _check_edit(site_matrix, out, before, target, proposal)
    return out


def _own_lines(matrix: Any, name: str, count: int) -> range:
    """The line numbers of ``targets.NAME``'s own block (up to the next target or the end of
    the file's ``count`` lines)."""
    starts = sorted((t.lines.get("") or 0, n) for n, t in matrix.targets.items())
    for i, (line, n) in enumerate(starts):
        if n == name:
            return range(line, starts[i + 1][0] if i + 1 < len(starts) else count + 1)
    return range(0)


def _replace_version(raw: str, old: str, new: str) -> str | None:
    for pattern in (rf'(["\']){re.escape(old)}\1', rf'(?<![\w.+-]){re.escape(old)}(?![\w.+-])'):
        m = re.search(pattern, raw.split("#", 1)[0])
        if m:
            q = m.group(1) if m.groups() else '"'
            return raw[:m.start()] + f"{q}{new}{q}" + raw[m.end():]
    return None


def _child_indent(lines: list[str], key_line: int) -> str:
    key = lines[key_line - 1]
    base = len(key) - len(key.lstrip())
    for nxt in lines[key_line:]:
        if nxt.strip() and not nxt.lstrip().startswith("#"):
            ind = len(nxt) - len(nxt.lstrip())
            return " " * (ind if ind > base else base + 2)
    return " " * (base + 2)


def _check_edit(site_matrix: Path, text: str, before: Any, target: Target,
                proposal: Proposal) -> None:
    try:  # read as the site's own file: a relative path source resolves where it lives
        after = load_matrix(site_matrix, text=text)
    except BuildEnvError as exc:
        raise ProposeError(f"{site_matrix}: the edited matrix does not load ({exc})") from None
    want = proposal.versions()
    t = after.targets.get(target.name)
    got = {p.name: p.version for p in t.enabled_packages} if t else {}
    if any(got.get(n) != v for n, v in want.items()):
        raise ProposeError(f"{site_matrix}: rewriting targets.{target.name} did not give the "
                           "proposed pins (a YAML anchor or default shared with it?); edit the "
                           "matrix by hand (matrix.diff shows the entry)")
    for name, other in before.targets.items():
        if name != target.name and after.targets[name].to_dict() != other.to_dict():
            raise ProposeError(f"{site_matrix}: rewriting targets.{target.name} would also change"
                               f" targets.{name} (a pin it shares through a YAML anchor or "
                               "defaults); edit the matrix by hand (matrix.diff shows the entry)")


def matrix_diff(site_matrix: Path, target: Target, proposal: Proposal) -> tuple[str, str | None]:
    """The unified diff of the site's matrix, and the edited text (None when the edit is not
    possible: the diff then shows the target's entry, old against new)."""
    old = site_matrix.read_text()
    try:
        new = edited_matrix(site_matrix, target, proposal)
    except ProposeError as exc:
        a = json.dumps(entry(target, site_matrix.parent), indent=1, sort_keys=True)
        b = json.dumps(entry(candidate_target(target, proposal), site_matrix.parent), indent=1,
                       sort_keys=True)
        diff = "".join(difflib.unified_diff(a.splitlines(True), b.splitlines(True),
                                            f"targets.{target.name}", "proposed"))
        return f"# not applicable in place: {exc}\n{diff}", None
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        str(site_matrix), str(site_matrix))), new


def write(out: Path, *, site_matrix: Path, target: Target, proposal: Proposal,
          snapshot: Snapshot, locks: Path | None) -> None:
    """The candidate directory at ``out``, staged beside it and swapped in whole."""
    try:
        check_replaceable(out, MARKER)
    except NotOurDirectory as exc:
        raise ProposeError(str(exc)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent))
    try:
        cand = candidate_target(target, proposal)
        (staged / "matrix.yaml").write_text(matrix_text(cand, site_matrix.parent, site_matrix))
        save_snapshot(snapshot, staged / "metadata" / "pypi-snapshot.json")
        if locks is not None and locks.is_dir():
            shutil.copytree(locks, staged / "locks")
        diff, _ = matrix_diff(site_matrix, target, proposal)
        (staged / "matrix.diff").write_text(diff)
        _write_record(staged, proposal, site_matrix, diff)
        (staged / MARKER).write_text("written by build-env propose\n")
        replace_generated_dir(staged, out, MARKER)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise


def _write_record(out: Path, proposal: Proposal, site_matrix: Path, diff: str | None = None
                  ) -> None:
    if diff is None:
        diff = (out / "matrix.diff").read_text() if (out / "matrix.diff").is_file() else ""
    data = {**proposal.to_dict(), "site_matrix": str(site_matrix.resolve())}
    atomic_write_text(out / "proposal.json", json.dumps(data, indent=2, sort_keys=True) + "\n")
    atomic_write_text(out / "PROPOSAL.md", proposal.markdown(diff))


# --------------------------------------------------------------------------- build and gate


@dataclass(frozen=True)
class BuildOptions:
    ca_bundle: Path | None = None
    templates: Path | None = None
    tag_prefix: str = "verl-env-proposal"
    network: str | None = "host"
    verify_timeout: float = 900
    gpus: str = "auto"
    expect_gpus: int | None = None
    verbose: bool = False
    quiet: bool = False


def build(out: Path, proposal: Proposal, site_matrix: Path, opts: BuildOptions) -> int:
    """Render, build and gate the candidate in ``out`` through the real pipeline. The proposal
    is ``proven`` only when the gate passes; a failed build or gate is recorded and reported."""
    req = BuildRequest(target=proposal.target, matrix=out / "matrix.yaml",
                       snapshot=out / "metadata" / "pypi-snapshot.json",
                       ca_bundle=opts.ca_bundle, templates=opts.templates,
                       tag_prefix=opts.tag_prefix, workdir=out / "build", network=opts.network,
                       verify_timeout=opts.verify_timeout, gpus=opts.gpus,
                       expect_gpus=opts.expect_gpus, verbose=opts.verbose, quiet=opts.quiet)
    try:
        outcome = run(req)
    except BuildEnvError as exc:
        proposal.status, proposal.error = "build-failed", str(exc)
        _write_record(out, proposal, site_matrix)
        return exc.exit_code or 1
    report = outcome.report
    if report is None or report.verification is None:
        proposal.status = "build-failed"
        proposal.error = outcome.error or (report.error if report else "no report")
        proposal.gate = {"result": report.result if report else "error",
                         "summary": f"build failed: {proposal.error}"}
    else:
        proposal.gate = gate_summary(report.verification, report.result, report.image_id,
                                     report.tags, out / "build" / "report.json")
        if report.result == "pass" and outcome.exit_code == 0:
            proposal.status, proposal.error = "proven", None
        else:
            proposal.status = "gate-failed"
            proposal.error = "the gate refused the candidate image: " + "; ".join(
                proposal.gate.get("failed", [])[:3])
    _write_record(out, proposal, site_matrix)
    return 0 if proposal.status == "proven" else 1


def gate_summary(verification: dict[str, Any], result: str, image_id: str | None,
                 tags: list[str], report_path: Path) -> dict[str, Any]:
    checks = verification.get("checks") or []
    phases: dict[str, dict[str, int]] = {}
    for c in checks:
        row = phases.setdefault(str(c.get("phase")), {})
        row[str(c.get("status"))] = row.get(str(c.get("status")), 0) + 1
    failed = [f"{c.get('id')}: {c.get('reason') or c.get('status')}" for c in checks
              if c.get("status") == "fail"]
    names = {f.name for f in fields(Check)}
    try:
        table = render_coverage([Check(**{k: v for k, v in c.items() if k in names})
                                 for c in checks])
    except (TypeError, ValueError):
        table = ""
    counts = {s: sum(r.get(s, 0) for r in phases.values()) for s in ("pass", "fail", "skip")}
    summary = (f"gate {verification.get('overall', result)}: {counts['pass']} pass, "
               f"{counts['fail']} fail, {counts['skip']} skip")
    return {"result": result, "overall": verification.get("overall"), "summary": summary,
            "image_id": image_id, "tags": tags, "coverage": phases, "failed": failed,
            "device_coverage": table, "report": str(report_path)}


# --------------------------------------------------------------------------- apply


def load(out: Path) -> Proposal:
    path = out / "proposal.json"
    if not (out / MARKER).is_file() or not path.is_file():
        raise ProposeError(f"{out}: not a proposal directory written by `build-env propose` "
                           f"(no {MARKER} and proposal.json)")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ProposeError(f"{path}: unreadable ({exc})") from None
    return Proposal.from_dict(data, str(path))


def apply(out: Path, site_matrix: Path, snapshot_file: Path) -> list[Path]:
    """Write a proven proposal into the site: the matrix (the target's pins), its lock files and
    the snapshot's new releases. An unproven one is refused and nothing is written."""
    proposal = load(out)
    if proposal.status != "proven":
        raise NotProven(f"{out}: the proposal is {proposal.status}, not proven: only a "
                           "proposal whose candidate passed the gate (`build-env propose "
                           "--output DIR --build`) is applied; nothing was written")
    site = load_matrix(site_matrix)
    target = site.target(proposal.target)
    current = {p.name: p.version for p in target.enabled_packages}
    stale = [f"{p.name} {current.get(p.name)} (the proposal starts from {p.old})"
             for p in proposal.pins if current.get(p.name) != p.old]
    if stale:
        raise ProposeError(f"{site_matrix}: targets.{target.name} moved since the proposal was "
                           f"made: {', '.join(stale)}; propose again; nothing was written")
    text = edited_matrix(site_matrix, target, proposal)
    cand_locks = out / "locks"
    site_lock = lock_path(site_matrix, target)
    lock_files = sorted(cand_locks.glob(f"{target.name}.*")) if cand_locks.is_dir() else []
    if not any(f.name == site_lock.name for f in lock_files):
        raise ProposeError(f"{out}: no lock for {target.name} in the proposal; nothing was "
                           "written")
    snap = load_snapshot(snapshot_file)
    theirs = load_snapshot(out / "metadata" / "pypi-snapshot.json")
    for key, rel in theirs.releases.items():
        snap.releases.setdefault(key, rel)
    for name, versions in theirs.versions.items():
        snap.versions[name] = versions
    written = []
    for f in lock_files:
        atomic_write_text(site_lock.parent / f.name, f.read_text())
        written.append(site_lock.parent / f.name)
    save_snapshot(snap, snapshot_file)
    atomic_write_text(site_matrix, text)
    return [site_matrix, snapshot_file, *written]
