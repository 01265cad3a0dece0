"""The main job: render -> build -> verify -> tag, with a report.

An image gets its release tags only after the self-test passed inside it. A failed verification
tags nothing (the previous release tag keeps pointing at the previous image) and removes the
candidate unless ``--keep-candidate``. SIGINT/SIGTERM: the build is cancelled, the verification
container removed, the untagged candidate deleted, and no report claims success.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder import verdicts
from builder.engine import BuildProgress, Engine, interrupts_raise
from builder.spec import Target
from builder.verify import Verification, summary_lines, verify_image

REPORT_SCHEMA = "verl-env/build-report/v1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="matrix target to build")
    p.add_argument("--tag-prefix", default="verl-env", metavar="REPO",
                   help="repository for release tags (default: verl-env)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="where the context and report.json go (default: build/<target>)")
    p.add_argument("--keep-candidate", action="store_true",
                   help="keep a failed image, tagged <prefix>:<target>-candidate")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="stream the build output")
    p.add_argument("--network", default="host",
                   help="network for build steps (default: host; 'default' for the daemon's)")
    p.add_argument("--verify-timeout", type=float, default=900)
    p.add_argument("--gpus", choices=["auto", "nvidia", "amd", "none"], default="auto",
                   help="GPUs handed to the verification container (auto: what the host has)")
    p.add_argument("--sif", type=Path, default=None, metavar="PATH",
                   help="also convert the verified image to this .sif")
    p.add_argument("--push", default=None, metavar="REGISTRY/REPO",
                   help="also publish the verified image (and the SIF) to this registry")


def release_tags(target: Target, prefix: str, lock_hash: str) -> list[str]:
    """``<prefix>:<target>`` and an immutable ``<prefix>:<target>-verl<v>-<hash>``.

    An override build (``--set``/``--base-image``) never moves the reviewed ``<prefix>:<target>``
    tag: it gets only ``<prefix>:<target>-override-<hash>``.
    """
    digest = hashlib.sha256(f"{target.entry_hash}\n{lock_hash}".encode()).hexdigest()[:12]
    verl = target.package("verl")
    version = verl.version if verl else "none"
    if target.override:
        return [f"{prefix}:{target.name}-override-{digest}"]
    return [f"{prefix}:{target.name}-verl{version}-{digest}", f"{prefix}:{target.name}"]


@dataclass
class Report:
    target: str
    override: bool
    pins: dict[str, str]
    provided: dict[str, str]
    matrix_hash: str
    lock_hash: str
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    image_id: str | None = None
    tags: list[str] = field(default_factory=list)
    verification: dict[str, Any] | None = None
    result: str = "incomplete"
    error: str | None = None

    def to_json(self) -> str:
        data = {"schema": REPORT_SCHEMA, **self.__dict__}
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, path)


class Console:
    """One line per stage; a live step counter on a terminal; everything with ``-v``."""

    def __init__(self, target: str, verbose: bool, quiet: bool) -> None:
        self.target, self.verbose, self.quiet = target, verbose, quiet
        self.tty = sys.stderr.isatty() and not verbose

    def stage(self, name: str, status: str, detail: str = "") -> None:
        if self.tty:
            sys.stderr.write("\r\033[K")
        if not self.quiet or status != "ok":
            print(f"[{self.target}] {name:7} {status:5} {detail}".rstrip(), file=sys.stderr)

    def build_event(self, progress: BuildProgress, text: str) -> None:
        if self.verbose:
            sys.stderr.write(text)
        elif self.tty and progress.total:
            sys.stderr.write(f"\r\033[K[{self.target}] build   step {progress.step}/"
                             f"{progress.total}  {progress.elapsed:6.1f} s  cache hits "
                             f"{progress.cache_hits}  {progress.instruction[:60]}")
            sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    from builder.cli import resolve_target, snapshot_for
    from builder.lock import lock_for
    from builder.render import render_context

    matrix, target = resolve_target(args)
    workdir = args.workdir or Path("build") / target.name
    console = Console(target.name, args.verbose, args.json)
    snapshot = snapshot_for(args, matrix)

    t0 = time.monotonic()
    lock_text, lock_file = lock_for(matrix.path, target, snapshot, workdir)
    ctx = render_context(target, lock_text, snapshot, workdir / "context", lock_file=lock_file,
                         ca_bundle=args.ca_bundle)
    report = Report(target.name, target.override, ctx.manifest["pins"], ctx.manifest["provided"],
                    ctx.manifest["matrix_hash"], ctx.lock_hash)
    report.stages["render"] = {"seconds": round(time.monotonic() - t0, 2), "context": str(ctx.path)}
    console.stage("render", "ok", str(ctx.path))
    report_path = workdir / "report.json"

    engine = Engine.connect()
    image_id: str | None = None
    try:
        with interrupts_raise():
            network = None if args.network == "default" else args.network
            built = engine.build(ctx.path, target=target.name, network=network,
                                 platform=target.platform, secrets=ctx.secrets,
                                 on_event=console.build_event)
            image_id = built.image_id
            report.image_id = image_id
            report.stages["build"] = {"seconds": round(built.seconds, 1), "steps": built.steps,
                                      "cache_hits": built.cache_hits,
                                      "step_times": list(built.step_times)}
            console.stage("build", "ok", f"{image_id[7:19]}  {built.steps} steps, "
                          f"{built.cache_hits} cached, {built.seconds:.1f} s")

            gpus = None if args.gpus == "none" else args.gpus
            v = verify_image(engine, image_id, timeout=args.verify_timeout, gpus=gpus)
            report.verification = v.report
            report.stages["verify"] = {"seconds": round(v.seconds, 1), "overall": v.overall,
                                       "exit_code": v.exit_code}
            verdicts.record(image_id, {"overall": v.overall, "exit_code": v.exit_code,
                                       "target": target.name, "report": v.report})
            if not v.passed:
                return _refuse(engine, report, report_path, console, v, args, target)
            console.stage("verify", "pass", f"{v.seconds:.1f} s" + _skips(v))

            for ref in release_tags(target, args.tag_prefix, ctx.lock_hash):
                engine.tag(image_id, ref)
                report.tags.append(ref)
            report.result = "pass"
            console.stage("tag", "ok", "  ".join(report.tags))
            verdicts.record(image_id, {"overall": v.overall, "exit_code": v.exit_code,
                                       "target": target.name, "tags": report.tags,
                                       "report": v.report})
    except KeyboardInterrupt:
        report.result, report.error = "interrupted", "interrupted by a signal"
        if image_id:
            engine.remove_candidate(image_id)
        report.write(report_path)
        console.stage("abort", "fail", "interrupted: no tag applied, candidate removed")
        return 130
    except BaseException as exc:
        report.result, report.error = "error", str(exc)
        if image_id:
            engine.remove_candidate(image_id)
        report.write(report_path)
        raise
    report.write(report_path)
    if args.json:
        print(report.to_json(), end="")
    return _extend(args, target, image_id, report, report_path, console)


def _skips(v: Verification) -> str:
    skipped = [c for c in v.report.get("checks", []) if c.get("status") == "skip"]
    return f", {len(skipped)} checks skipped (see report)" if skipped else ""


def _refuse(engine: Engine, report: Report, report_path: Path, console: Console,
            v: Verification, args: argparse.Namespace, target: Target) -> int:
    report.result = v.overall if v.overall in ("fail", "incomplete") else "fail"
    assert report.image_id is not None
    if args.keep_candidate:
        ref = f"{args.tag_prefix}:{target.name}-candidate"
        engine.tag(report.image_id, ref)
        report.tags.append(ref)
    else:
        engine.remove_candidate(report.image_id)
    report.write(report_path)
    console.stage("verify", v.overall, f"{v.seconds:.1f} s; no release tag applied; "
                  f"report: {report_path}")
    for line in summary_lines(v):
        print(line, file=sys.stderr)
    if args.json:
        print(report.to_json(), end="")
    return 1


def _extend(args: argparse.Namespace, target: Target, image_id: str | None, report: Report,
            report_path: Path, console: Console) -> int:
    """``--sif`` and ``--push`` continue from the verified image."""
    if image_id is None or not (args.sif or args.push):
        return 0
    if args.sif:
        from builder import sif

        sif_path = sif.convert_verified(image_id, args.sif, target=target.name)
        report.stages["sif"] = {"path": str(sif_path)}
        console.stage("sif", "ok", str(sif_path))
    if args.push:
        from builder import publish

        record = publish.publish_verified(image_id, args.push, target=target.name,
                                          sif=args.sif, pins=report.pins,
                                          record_path=report_path.parent / "publish.json")
        report.stages["publish"] = record
        console.stage("publish", "ok", str(record.get("image_digest", "")))
    report.write(report_path)
    return 0
