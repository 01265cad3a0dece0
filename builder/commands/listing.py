"""``build-env list``: the targets and their pins."""

from __future__ import annotations

import argparse
from typing import Any

from builder import catalog
from builder.resolve import extras, prebuilt
from builder.gate import verdicts
from builder.commands import _shared
from builder.files import sha256_text
from builder.resolve.lock import lock_path, parse_lock, stale_reason
from builder.resolve.vendor import base_record_path
from builder.resolve.targets import Site

NAME = "list"
HELP = "targets and their pins"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    _shared.json_flag(p, "every target")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print only the target names, one a line (for scripts: "
                        "`for t in $(build-env list -q)`); errors still go to stderr")


def vendor_note(site: Site, t: Any) -> str:
    """How far a vendor base is verified: declared (from published sources) or inspected."""
    if not t.base.vendor:
        return ""
    if base_record_path(lock_path(site.path, t)).is_file():
        return " (vendor base, inspected)"
    if t.base.vendor == "declared":
        return " (declared, not yet verified)"
    return " (vendor base, not yet probed)"


def prebuilt_choices(site: Site, t: Any) -> dict[str, dict[str, Any]]:
    """What `lock` chose per package with prebuilt wheels (a wheel, or a source build, and
    why); packages it has not decided yet say so."""
    record = prebuilt.load_record(lock_path(site.path, t))
    return {p.name: {k: v for k, v in record.get(p.name, {
        "choice": "undecided", "why": "not locked yet: run `build-env lock`"}).items()
        if k != "entries"} for p in prebuilt.with_prebuilt(t)}


def binding(site: Site, t: Any) -> verdicts.Binding:
    """What a verdict must have been recorded for to be shown for ``t`` here: this site, the
    target's matrix entry and its lock as they are now (no lock: no verdict can match)."""
    lock = lock_path(site.path, t)
    try:
        lock_hash: str | None = sha256_text(lock.read_text())
    except (OSError, UnicodeDecodeError):
        lock_hash = None
    return verdicts.Binding(verdicts.site_key(site.path), t.name, t.entry_hash, lock_hash)


def verdict_json(v: Any) -> dict[str, Any] | None:
    if v is None:
        return None
    return {"image_id": v.image_id, "recorded_at": v.recorded_at, "overall": v.overall,
            "scope": v.scope, "level": v.level, "gpu": v.gpu.to_dict()}


def extras_locked(site: Site, t: Any, snapshot: Any) -> dict[str, str] | None:
    """The target's locked versions, when its lock was resolved from its inputs as they are
    (else None: the extras cannot be compared with it yet)."""
    lock = lock_path(site.path, t)
    if not lock.is_file() or stale_reason(t, snapshot, lock):
        return None
    return {n: p.version for n, p in parse_lock(lock.read_text()).items()}


def run(args: argparse.Namespace) -> int:
    site = _shared.site(args)
    matrix = site.matrix
    snapshot = site.snapshot(matrix.targets.values())  # read (and checked) either way
    if args.quiet and not args.json:  # the names only: no lock or verdict read
        for name in matrix.targets:
            print(name)
        return 0
    versus = {n: extras.report(t, snapshot, extras_locked(site, t, snapshot))
              for n, t in matrix.targets.items()}
    latest = {n: verdicts.latest_for(binding(site, t)) if binding(site, t).lock_hash else None
              for n, t in matrix.targets.items()}
    if args.json:
        _shared.emit_json("list", {"matrix": str(matrix.path), "targets": {
            n: {**t.to_dict(), "gpus": list(t.gpus), "entry_hash": t.entry_hash,
                "verdict": verdict_json(latest[n]), "extras": versus[n],
                **({"prebuilt_choice": prebuilt_choices(site, t)}
                   if prebuilt_choices(site, t) else {}),
                **({"base_status": vendor_note(site, t).strip(" ()")} if t.base.vendor else {})}
            for n, t in matrix.targets.items()}})
        return 0
    # verl's core distributions (the catalogue's ``required``) between the engine and verl
    core = [n for n in catalog.load(site.path.parent).required if n not in ("torch", "verl")]
    cols = ["target", "accel", "arch", "gpus", "python", "torch", "engine", *core, "verl",
            "verdict", "base"]
    rows = []
    for t in matrix.targets.values():
        def v(name: str) -> str:
            p = t.package(name)
            if p is None:
                return "-"
            return p.version + ("*" if p in t.provided else "") + (
                "(src)" if p.build == "source" else "") + ("" if p.enabled else "(off)")
        eng = t.engine
        rows.append([t.name, t.accelerator + (f" {t.cuda or t.rocm}" if t.cuda or t.rocm else ""),
                     t.arch, ",".join(t.gpus) or "-", t.python, v("torch"),
                     f"{eng.name} {v(eng.name)}" if eng else "-", *(v(n) for n in core),
                     v("verl"), verdicts.short(latest[t.name]),
                     t.base.image + vendor_note(site, t)])
    widths = [max(len(str(r[i])) for r in [cols, *rows]) for i in range(len(cols))]
    for r in [cols, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    print("\n* provided by the base image   (src) built from source   (off) disabled")
    print("verdict: the newest local one for this site's matrix entry and lock (build: every "
          "phase that runs without a GPU passed; gpu: the GPU phases too)")
    for t in matrix.targets.values():
        for o in t.overrides:  # reviewed dependency overrides (builder.matrix.overrides)
            print(f"{t.name}: override {o.name}=={o.version} ({o.reason})")
        # the lock against what its packages' extras declare (builder.resolve.extras)
        for line in extras.summary(t, snapshot, extras_locked(site, t, snapshot)):
            print(line)
        for name, c in prebuilt_choices(site, t).items():
            what = (f"prebuilt wheel {c['filename']}" if c["choice"] == "wheel"
                    else "source build" if c["choice"] == "source" else "undecided")
            print(f"{t.name}: {name}: {what} ({c['why']})")
    return 0
