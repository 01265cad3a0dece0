"""``build-env build --target T`` (also ``build-env --target T``): the main job."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.connection
import sys
import tempfile
from pathlib import Path
from typing import Any

from builder.commands import _shared
from builder.engine import interrupts_raise
from builder.errors import BuildEnvError
from builder import pipeline
from builder.pipeline import Outcome
from builder.plan import BuildRequest, plan_build
from builder.gate.verdicts import requirement

NAME = "build"
HELP = "render, build, verify inside the image, tag on pass (also: build-env --target T)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    _shared.overrides(p)
    _shared.render_options(p)
    _shared.build_options(p)
    p.add_argument("--print", dest="print_plan", action="store_true",
                   help="print the build plan as JSON (schema verl-env/build-plan/v1) and exit: "
                        "no engine, nothing built or written")


def run(args: argparse.Namespace) -> int:
    require = requirement(args.require)
    names = (list(_shared.site(args).matrix.targets) if args.all
             else list(dict.fromkeys(args.targets)))
    several = len(names) > 1

    def request(name: str) -> BuildRequest:
        return BuildRequest(
            target=name, matrix=args.matrix, snapshot=args.snapshot,
            overrides=tuple(args.overrides), base_image=args.base_image,
            ca_bundle=args.ca_bundle, templates=args.templates, tag_prefix=args.tag_prefix,
            workdir=(args.workdir / name if several else args.workdir) if args.workdir else None,
            keep_candidate=args.keep_candidate,
            network=None if args.network == "default" else args.network,
            verify_timeout=args.verify_timeout, gpus=args.gpus, expect_gpus=args.expect_gpus,
            reverify=args.reverify, require=require,
            sif=(args.sif / f"{name}.sif" if several else args.sif) if args.sif else None,
            sign_key=args.sign_key, sign_pgp_key=args.sign_pgp_key,
            push=args.push, verbose=args.verbose and not several, quiet=args.json)

    if args.print_plan:
        return _print_plans([request(n) for n in names], several)
    outcomes = run_many([request(n) for n in names], args.jobs or len(names))
    if args.json:
        reports = [json.loads(o.report.to_json()) if o.report else {"error": o.error}
                   for o in outcomes]
        print(json.dumps(reports[0] if not several else dict(zip(names, reports)), indent=2,
                         sort_keys=True))
    if several:
        _summary(names, outcomes)
    return max(o.exit_code for o in outcomes)


def _print_plans(requests: list[BuildRequest], several: bool) -> int:
    """``--print``: each request's plan, rendered in a scratch directory removed afterwards (the
    build's workdir is left alone) without fetching sources or prebuilt wheels: one plan, or
    ``{target: plan}`` for several."""
    plans = {}
    for req in requests:
        with tempfile.TemporaryDirectory(prefix="verl-env-plan-") as scratch:
            plans[req.target] = plan_build(req, scratch=Path(scratch), fetch=False).to_dict()
    doc = plans if several else plans[requests[0].target]
    print(json.dumps(doc, indent=2, sort_keys=True))
    return 0


def _summary(names: list[str], outcomes: list[Outcome]) -> None:
    rows = [["target", "result", "image", "tags / error"]]
    for name, o in zip(names, outcomes):
        r = o.report
        result = r.result if r else "error"
        verify = (r.stages.get("verify") or {}) if r else {}
        if result == "pass" and verify.get("level"):
            result += f" ({verify['level']}" + (", gpu pending)" if verify.get("gpu") == "pending"
                                                else ")")
        detail = " ".join(r.tags) if r and r.tags else (r.error if r and r.error else o.error)
        rows.append([name, result, (r.image_id or "-")[7:19] if r else "-", detail or "-"])
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row[:3], widths)) + "  " + row[3],
              file=sys.stderr)


def run_many(requests: list[BuildRequest], jobs: int) -> list[Outcome]:
    """Several targets at once: one process per target (each with its own signal handling and
    cleanup), at most ``jobs`` at a time, builds sharing the engine's BuildKit cache. A failing
    target never stops or untags the others; outcomes come back in request order. SIGINT or
    SIGTERM reach every running child, which removes its own candidate and containers."""
    if len(requests) == 1:
        return [_run_one(requests[0])]
    ctx = multiprocessing.get_context("spawn")
    pending = list(enumerate(requests))
    running: dict[int, tuple[Any, Any]] = {}
    outcomes: dict[int, Outcome] = {}
    try:
        with interrupts_raise():
            while pending or running:
                while pending and len(running) < max(1, jobs):
                    i, req = pending.pop(0)
                    parent, child = ctx.Pipe(duplex=False)
                    proc = ctx.Process(target=_child, args=(req, child), name=req.target)
                    proc.start()
                    child.close()
                    running[i] = (proc, parent)
                ready = multiprocessing.connection.wait([c for _, c in running.values()])
                for i, (proc, conn) in list(running.items()):
                    if conn in ready:
                        try:
                            outcomes[i] = conn.recv()
                        except EOFError:
                            outcomes[i] = Outcome(None, 1, f"the {proc.name} build process "
                                                  "died without a result")
                        proc.join()
                        del running[i]
    except KeyboardInterrupt:
        for proc, _ in running.values():
            proc.terminate()
        for proc, _ in running.values():
            proc.join(timeout=120)
        raise
    return [outcomes[i] for i in range(len(requests))]


def _child(req: BuildRequest, conn: Any) -> None:
    conn.send(_run_one(req))
    conn.close()


def _run_one(req: BuildRequest) -> Outcome:
    try:
        outcome = pipeline.run(req)
    except BuildEnvError as exc:
        outcome = Outcome(None, exc.exit_code, str(exc))
    if outcome.error:
        print(f"error: {outcome.error}", file=sys.stderr)
    return outcome
