"""A proposal: the pins old -> new, why each stops, and (later) uv's lock and the gate's verdict.

:func:`propose` is pure (target + snapshot in, proposal out). The proposal serialises to
``proposal.json`` (schema ``verl-env/proposal/v1``) and renders as text and as PROPOSAL.md, the
body of a pull request.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from packaging.version import Version

from builder.resolve.metadata import Snapshot
from builder.propose import coherence
from builder.propose.reasons import explain
from builder.propose.search import Anchors, ProposeError, Space
from builder.matrix.spec import Target

PROPOSAL_SCHEMA = "verl-env/proposal/v1"
# searched: the tool's own search only; resolved: uv locked it; unresolvable: uv refused it;
# proven: built and the gate passed; gate-failed / build-failed: reported, not proposed
STATUSES = ("searched", "resolved", "unresolvable", "proven", "gate-failed", "build-failed")


@dataclass
class Pin:
    name: str
    old: str
    new: str
    newest: str
    blocked: str | None = None  # the next release above ``new`` that was refused
    reason: str | None = None
    unblock: str | None = None
    skipped: list[dict[str, str]] = field(default_factory=list)  # {version, reason}

    @property
    def moved(self) -> bool:
        return self.old != self.new


@dataclass
class Proposal:
    target: str
    python: str
    arch: str
    platform: str
    accelerator: str
    anchors: dict[str, Any]
    pins: list[Pin]
    status: str = "searched"
    snapshot_fetched: str = ""
    lock: dict[str, Any] | None = None  # {"moved": [{name, old, new}], "packages": N}
    gate: dict[str, Any] | None = None  # {"result", "verdict", "image_id", "coverage", ...}
    error: str | None = None

    @property
    def changed(self) -> bool:
        return any(p.moved for p in self.pins)

    def versions(self) -> dict[str, str]:
        return {p.name: p.new for p in self.pins}

    def to_dict(self) -> dict[str, Any]:
        return {"schema": PROPOSAL_SCHEMA, **asdict(self)}

    @staticmethod
    def from_dict(data: dict[str, Any], where: str) -> Proposal:
        if data.get("schema") != PROPOSAL_SCHEMA:
            raise ProposeError(f"{where}: not a proposal (schema {data.get('schema')!r}, "
                               f"expected {PROPOSAL_SCHEMA})")
        try:
            known = {f.name for f in fields(Proposal)}
            body = {k: v for k, v in data.items() if k in known}
            body["pins"] = [Pin(**p) for p in body["pins"]]
            return Proposal(**body)
        except (KeyError, TypeError) as exc:
            raise ProposeError(f"{where}: malformed proposal ({exc})") from None

    # ------------------------------------------------------------------ words
    def lines(self) -> list[str]:
        head = (f"{self.target}: python {self.python}, {self.platform}, {self.accelerator}"
                f"  [{self.status}]")
        out = [head]
        width = max((len(p.name) for p in self.pins), default=4)
        for p in self.pins:
            arrow = f"{p.old} -> {p.new}" if p.moved else f"{p.old} (stays)"
            newest = "newest" if p.new == p.newest else f"newest {p.newest}"
            out.append(f"  {p.name:<{width}}  {arrow}  ({newest})")
            if p.reason:
                out.append(f"  {'':<{width}}    stops: {p.reason}")
                out.append(f"  {'':<{width}}    unblock: {p.unblock}")
        if self.lock:
            moved = self.lock.get("moved") or []
            out.append(f"  uv: resolved, {self.lock.get('packages')} packages, "
                       f"{len(moved)} moved in the full lock")
        if self.gate:
            out.append(f"  gate: {self.gate.get('summary')}")
        if self.error:
            out.append(f"  error: {self.error}")
        return out

    def markdown(self, diff: str = "") -> str:
        title = ", ".join(f"{p.name} {p.old} → {p.new}" for p in self.pins if p.moved) \
            or "no pin moves"
        md = [f"# {self.target}: {title}", "",
              f"Target `{self.target}`: python {self.python}, {self.platform}, "
              f"{self.accelerator}. Status: **{self.status}**"
              + (f" (metadata snapshot of {self.snapshot_fetched})" if self.snapshot_fetched
                 else "") + ".", ""]
        if self.anchors and any(self.anchors.values()):
            md += [f"Anchors: {_anchor_words(self.anchors)}.", ""]
        md += ["| package | old | new | newest |", "|---|---|---|---|"]
        md += [f"| {p.name} | {p.old} | {'**' + p.new + '**' if p.moved else p.new} | "
               f"{p.newest} |" for p in self.pins]
        stops = [p for p in self.pins if p.reason]
        if stops:
            md += ["", "## Why it stops there", ""]
            md += [f"- **{p.name} {p.blocked}**: {p.reason}. Would unblock: {p.unblock}."
                   for p in stops]
        skipped = [(p.name, s) for p in self.pins for s in p.skipped]
        if skipped:
            md += ["", "## Releases skipped for this platform", ""]
            md += [f"- {name} {s['version']}: {s['reason']}" for name, s in skipped]
        if self.lock:
            moved = self.lock.get("moved") or []
            resolved = (f"uv resolved the candidate: {self.lock.get('packages')} packages, "
                        f"{len(moved)} moved against the current lock.")
            md += ["", "## Lock", "", resolved]
            if moved:
                md += [""] + [f"- {m['name']} {m['old'] or '(new)'} → {m['new'] or '(removed)'}"
                              for m in moved]
        if self.gate:
            md += ["", "## Gate", "", f"{self.gate.get('summary')}"]
            if self.gate.get("image_id"):
                md.append(f"\nImage `{self.gate['image_id']}`.")
            if self.gate.get("failed"):
                md += [""] + [f"- {line}" for line in self.gate["failed"]]
            if self.gate.get("coverage"):
                md += ["", "Coverage of the self-test:", "", "| phase | pass | fail | skip |",
                       "|---|---|---|---|"]
                md += [f"| {ph} | {c.get('pass', 0)} | {c.get('fail', 0)} | {c.get('skip', 0)} |"
                       for ph, c in self.gate["coverage"].items()]
            if self.gate.get("device_coverage"):
                md += ["", "```", self.gate["device_coverage"].rstrip("\n"), "```"]
        if self.error:
            md += ["", f"**Error:** {self.error}"]
        if diff:
            md += ["", "## Matrix change", "", "```diff", diff.rstrip("\n"), "```"]
        md += ["", f"Generated by `build-env propose --target {self.target}`."]
        return "\n".join(md) + "\n"


def _anchor_words(anchors: dict[str, Any]) -> str:
    parts = [f"--hold {n}" for n in anchors.get("hold", [])]
    parts += [f"--want {n}=={v}" for n, v in sorted((anchors.get("want") or {}).items())]
    parts += [f"--package {n}" for n in anchors.get("only", [])]
    return " ".join(parts)


def propose(target: Target, snapshot: Snapshot, anchors: Anchors | None = None) -> Proposal:
    """The newest coherent pins for ``target`` and why each stops (pure)."""
    space = Space(target, snapshot, anchors or Anchors())
    solution = space.solve()
    if solution is None:
        raise ProposeError(f"no coherent set of pins for targets.{target.name}, not even the "
                           "current one: run `build-env check` (or loosen the anchors)",
                           target=target.name)
    pins = []
    for pkg in space.packages:
        new = solution[pkg.name]
        blocker = explain(space, solution, pkg.name)
        skipped = []
        for v in space.known_versions(pkg.name, pkg.version):
            if v > Version(new) and not space.fixed(pkg.name):
                stop = space.unusable(pkg.name, str(v))
                if stop is not None and "no metadata" not in stop.reason:
                    skipped.append({"version": str(v), "reason": stop.reason})
        pins.append(Pin(pkg.name, pkg.version, new, space.newest(pkg.name, pkg.version),
                        blocker.version if blocker else None,
                        blocker.reason if blocker else None,
                        blocker.unblock if blocker else None, skipped))
    accel = str(coherence.target_build(target))
    a = space.anchors
    return Proposal(target.name, target.python, target.arch, coherence.platform_label(target),
                    accel, {"hold": sorted(a.hold), "want": dict(sorted(a.want.items())),
                            "only": sorted(a.only)}, pins,
                    snapshot_fetched=snapshot.fetched)


def candidate_target(target: Target, proposal: Proposal) -> Target:
    """``target`` with the proposal's versions (everything else as the matrix has it)."""
    new = proposal.versions()
    packages = tuple(replace(p, version=new.get(p.name, p.version)) for p in target.packages)
    return replace(target, packages=packages)
