"""The main job: plan -> build -> verify -> tag, with a report.

The plan (:mod:`builder.plan`: lock, context, names, what extends it) is made without an engine;
:func:`execute` runs it: it asks the engine what the plan cannot know, then builds or reuses,
gates, tags, and goes on to ``--sif``, the signature and ``--push``.

An image gets its release tags only after the self-test passed inside it. A failed verification
tags nothing (the previous release tag keeps pointing at the previous image) and removes the
candidate unless ``--keep-candidate``. SIGINT/SIGTERM: the build is cancelled, the verification
container removed, the untagged candidate deleted, and no report claims success. The engine
dying or its data root filling up mid-stage ends the run with one error naming the stage and the
engine (:mod:`builder.engine.faults`), no tag and no verdict; the same command completes once the
engine is back. Two runs of one target take turns (:func:`build_lock_key`): the second reuses
what the first verified.

The run connects to the engine once (:func:`preflight`) and hands that engine, the verdict it
recorded and (when signing) the one SBOM inventory down to ``--sif``, the signature and
``--push``: no later stage reconnects, re-reads the verdict or inventories the image again.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.connection
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder import __version__, sif
from builder.publish import push as publish
from builder import exclusive as runlock
from builder.resolve import vendor
from builder.gate import verdicts
from builder.engine import BuildProgress, ContainerEngine, Engine, faults, interrupts_raise
from builder.errors import BuildEnvError
from builder.files import atomic_write_text
from builder.resolve.lock import lock_path
from builder.matrix.naming import Names, content_hash, names
from builder.plan import BuildPlan, BuildRequest, EngineFacts, open_target, plan_build
from builder.matrix.spec import Target
from builder.trust import keys, sign
from builder.gate.verdicts import Verdict
from builder.gate.image import verify_image
from builder.gate.summary import summary_lines

REPORT_SCHEMA = "verl-env/build-report/v1"


@dataclass
class Report:
    target: str
    override: bool
    pins: dict[str, str]
    provided: dict[str, str]
    matrix_hash: str
    lock_hash: str
    content_hash: str = ""
    bases: list[str] = field(default_factory=list)
    reused: bool = False
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
        atomic_write_text(path, self.to_json())


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


@dataclass
class Outcome:
    report: Report | None  # None: the run stopped before a report existed (see error)
    exit_code: int
    error: str | None = None


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
        outcome = run(req)
    except BuildEnvError as exc:
        outcome = Outcome(None, exc.exit_code, str(exc))
    if outcome.error:
        print(f"error: {outcome.error}", file=sys.stderr)
    return outcome


def preflight(req: BuildRequest, target: Target) -> ContainerEngine:
    """Everything the run will need, checked before minutes of build: the engine, and the SIF
    and registry prerequisites of ``--sif``/``--push``."""
    engine = Engine.connect()
    if req.sif:
        sif.pick_backend("auto", target.name)
    if req.sign_key and not (req.sif or req.push):
        raise BuildEnvError("--sign-key signs the SIF's attestations (--sif PATH) or the "
                            "published image's (--push REGISTRY/REPO): add one",
                            target=target.name)
    if req.sign_key:
        keys.load_private(req.sign_key)
        if req.sign_pgp_key:
            keys.load_pgp(req.sign_pgp_key, private=True)
    if req.push:
        publish.preflight(req.push)
    return engine


def build_lock_key(matrix: Path, target: str) -> str:
    """The run lock of one target's build (:mod:`builder.exclusive`): two ``build-env --target T``
    of one matrix take turns, so the second finds the first's verified image instead of building
    a second one under the same content tag."""
    return f"target:{Path(matrix).resolve()}:{target}"


def run(req: BuildRequest) -> Outcome:
    """plan -> (reuse | build) -> verify -> tag, then ``--sif``/``--push``.

    One build of a target at a time (:func:`build_lock_key`): a second run of the same target
    says whom it waits for, waits, and then reuses what the first one verified (or, when the
    first failed, builds itself). The plan is made under the lock (it writes the context the
    running build reads); ``--sif``/``--push`` run after the lock is released."""
    opened = open_target(req)
    target = opened.target
    console = Console(target.name, req.verbose, req.quiet)
    engine = preflight(req, target)
    with ExitStack() as lock:
        lock.enter_context(runlock.held(build_lock_key(opened.site.path, target.name),
                                        what=f"build of {target.name}"))
        started = time.monotonic()
        with faults.stage(engine, "render", what=RENDER_WHAT, target=target.name):
            removed = engine.remove_orphans()
            if removed:
                console.stage("engine", "clean", "removed containers of runs that died: "
                              + ", ".join(removed))
            plan = plan_build(req, opened)
        return execute(plan, engine, console, release=lock.close, started=started)


RENDER_WHAT = "the preparation of the build (base image, content tag)"


def execute(plan: BuildPlan, engine: ContainerEngine, console: Console | None = None, *,
            release: Callable[[], None] = lambda: None, started: float | None = None
            ) -> Outcome:
    """Run ``plan`` on ``engine``: ask it what the plan cannot know (:func:`resolve`), then
    (reuse | build) -> verify -> tag, ``release()`` the run lock the caller holds (the plan's
    context must not change under a running build: :func:`run` makes the plan under the lock),
    then ``--sif`` -> sign -> ``--push``. ``started``: when the run's preparation began (the
    report's render seconds)."""
    started = time.monotonic() if started is None else started
    console = console or Console(plan.target.name, plan.request.verbose, plan.request.quiet)
    with faults.stage(engine, "render", what=RENDER_WHAT, target=plan.target.name):
        facts = resolve(plan, engine)
    assert plan.context is not None  # resolve stopped the run otherwise
    ctx = plan.context
    report = Report(plan.target.name, plan.target.override, ctx.manifest["pins"],
                    ctx.manifest["provided"], ctx.manifest["matrix_hash"], ctx.lock_hash,
                    content_hash=facts.content, bases=list(facts.bases))
    report.stages["render"] = {"seconds": round(time.monotonic() - started, 2),
                               "context": str(ctx.path)}
    console.stage("render", "ok", f"{ctx.path}  content {facts.content[7:19]}")
    done = _build_and_gate(plan, facts, engine, console, report)
    release()
    if isinstance(done, Outcome):
        return done
    image_id, verdict, report, report_path = done
    return _extend(plan.request, plan.target, engine, image_id, verdict, report, report_path,
                   console)


def resolve(plan: BuildPlan, engine: ContainerEngine) -> EngineFacts:
    """The plan's engine facts: a declared vendor base inspected (which stops the run), the
    base images' identities, the content hash over them, and the image under its content tag."""
    target = plan.target
    if plan.inspect_base:
        vendor.first_inspection(engine, target, lock_path(plan.matrix, target))
    assert plan.context is not None
    bases = tuple(engine.identity(ref) for ref in plan.base_refs)
    content = content_hash(plan.context.path, bases, __version__)
    tags = names(target, plan.request.tag_prefix, content)
    return EngineFacts(bases, content, tags, engine.find(tags.content))


Gated = tuple[str, Verdict, Report, Path]  # the released image, its verdict, the report


@dataclass
class _Step:
    """Where the gated part of a run is, for its interrupt and fault handling."""

    stage: str
    what: str
    image_id: str | None = None
    built: bool = False


def _build_and_gate(plan: BuildPlan, facts: EngineFacts, engine: ContainerEngine, console: Console,
                    report: Report) -> Outcome | Gated:
    """Under the target's run lock: reuse the verified image of the content tag, or build,
    verify and tag one. An Outcome when the run ends here (refused, failed, interrupted), else
    what ``--sif``/``--push`` continue from."""
    step = _Step("build", f"the build of {facts.tags.content}", facts.image_id)
    report_path = plan.report_path
    try:
        with interrupts_raise():
            done = _gate(plan, facts, engine, console, report, step)
    except KeyboardInterrupt:
        report.result, report.error = "interrupted", "interrupted by a signal"
        if step.image_id and step.built:
            engine.remove_candidate(step.image_id)
        report.write(report_path)
        console.stage("abort", "fail", "interrupted: no tag applied, candidate removed")
        return Outcome(report, 130)
    except BaseException as exc:
        fault = faults.translate(engine, exc, stage=step.stage, what=step.what,
                                 target=plan.target.name) if isinstance(exc, Exception) else None
        error: BaseException = fault or exc
        if step.image_id and step.built:
            engine.remove_candidate(step.image_id)
            if isinstance(fault, faults.EngineDown):
                fault.args = (f"{fault.args[0]} The candidate image {step.image_id[:19]} stays "
                              "in the engine, untagged.",)
        report.result, report.error = "error", str(error)
        report.write(report_path)
        if isinstance(error, BuildEnvError):
            return Outcome(report, error.exit_code, str(error))
        raise
    if not isinstance(done, Outcome):
        report.write(report_path)
    return done


def _gate(plan: BuildPlan, facts: EngineFacts, engine: ContainerEngine, console: Console,
          report: Report, step: _Step) -> Outcome | Gated:
    """(reuse | build) -> verify -> tag; ``step`` says what is under way."""
    req, tags, report_path = plan.request, facts.tags, plan.report_path
    if step.image_id is not None:
        report.image_id = step.image_id
        report.stages["build"] = {"seconds": 0.0, "reused": tags.content}
        known = verdicts.lookup(step.image_id)
        if known and verdicts.release_problem(known, req.require) is None and not req.reverify:
            if (bound := _binding(plan, tags)) is not None:
                verdicts.bind(step.image_id, known, bound)
            return _reuse(engine, report, report_path, console, tags, known)
        console.stage("build", "reuse", f"{tags.content} exists ({step.image_id[7:19]}); "
                      "verifying it")
    else:
        _build(plan, engine, console, report, step)
    image_id = step.image_id
    assert image_id is not None
    step.stage, step.what = "verify", f"the gate of image {image_id[:19]}"
    gpus = None if req.gpus == "none" else req.gpus
    v = verify_image(engine, image_id, timeout=req.verify_timeout, gpus=gpus,
                     expect_gpus=req.expect_gpus)
    report.verification = v.report
    report.stages["verify"] = {"seconds": round(v.seconds, 1), "overall": v.overall,
                               "exit_code": v.exit_code, "scope": v.scope, "level": v.level,
                               "gpu": v.gpu.status}
    bound = _binding(plan, tags)
    verdicts.record(image_id, v, target=plan.target.name, binding=bound)
    problem = verdicts.release_problem(v, req.require)
    if problem is not None:
        return _refuse(engine, report, report_path, console, v, req, plan.target, step.built,
                       problem)
    console.stage("verify", "pass", f"{v.seconds:.1f} s, {_level(v)}" + _skips(v))
    step.stage, step.what = "tag", f"tagging image {image_id[:19]}"
    engine.tag_once(image_id, tags.content)
    for ref in tags.release:
        engine.tag(image_id, ref)
    report.tags = list(tags.all)
    report.result = "pass"
    console.stage("tag", "ok", "  ".join(report.tags))
    recorded = verdicts.record(image_id, v, target=plan.target.name, tags=report.tags,
                               binding=bound)
    return image_id, recorded, report, report_path


def _binding(plan: BuildPlan, tags: Names) -> verdicts.Binding | None:
    """What the verdict is for, at this site (``build-env list`` shows it only there, only for
    this content); an override build belongs to no site's target."""
    if plan.target.override:
        return None
    lock_hash = plan.context.lock_hash if plan.context else None
    return verdicts.Binding(verdicts.site_key(plan.matrix), plan.target.name,
                            plan.target.entry_hash, lock_hash, tags.content)


def _build(plan: BuildPlan, engine: ContainerEngine, console: Console, report: Report, step: _Step
           ) -> None:
    """Build the plan's context into a candidate image (``step`` holds its ID)."""
    assert plan.context is not None
    target, req = plan.target, plan.request
    result = engine.build(plan.context.path, target=target.name, network=req.network,
                          platform=target.platform, secrets=plan.context.secrets,
                          on_event=console.build_event)
    step.image_id, step.built = result.image_id, True
    report.image_id = result.image_id
    report.stages["build"] = {"seconds": round(result.seconds, 1), "steps": result.steps,
                              "cache_hits": result.cache_hits,
                              "step_times": list(result.step_times)}
    console.stage("build", "ok", f"{result.image_id[7:19]}  {result.steps} steps, "
                  f"{result.cache_hits} cached, {result.seconds:.1f} s")


def _reuse(engine: ContainerEngine, report: Report, report_path: Path, console: Console,
           tags: Names, known: Verdict) -> Gated:
    """The content tag exists and holds a release verdict: nothing is built or re-verified."""
    assert report.image_id is not None
    for ref in tags.release:
        engine.tag(report.image_id, ref)
    report.tags = list(tags.all)
    report.result = "pass"
    report.reused = True
    report.verification = known.report
    when = known.recorded_at or "earlier"
    report.stages["verify"] = {"seconds": 0.0, "overall": known.overall, "reused": when,
                               "scope": known.scope, "level": known.level,
                               "gpu": known.gpu.status}
    console.stage("verify", "pass", f"{tags.content} was verified {when} ({_level(known)}); "
                  "not rebuilt, not re-verified (--reverify to run the gate again)")
    return report.image_id, known, report, report_path


def _level(v: Verdict) -> str:
    """``build verdict, gpu: pending (why)`` / ``gpu verdict, ...`` for the stage line."""
    return v.describe().removeprefix(f"{v.overall}, ")


def _skips(v: Verdict) -> str:
    skipped = [c for c in v.report.get("checks", []) if c.get("status") == "skip"]
    return f", {len(skipped)} checks skipped (see report)" if skipped else ""


def _refuse(engine: ContainerEngine, report: Report, report_path: Path, console: Console,
            v: Verdict, req: BuildRequest, target: Target, built: bool,
            problem: str) -> Outcome:
    report.result = v.overall if v.overall in ("fail", "incomplete") else "fail"
    assert report.image_id is not None
    if req.keep_candidate:
        ref = f"{req.tag_prefix}:{target.name}-candidate"
        engine.tag(report.image_id, ref)
        report.tags.append(ref)
    elif built:
        engine.remove_candidate(report.image_id)
    report.write(report_path)
    why = "" if v.overall != "pass" else f" ({problem})"
    console.stage("verify", v.overall, f"{v.seconds:.1f} s{why}; no release tag applied; "
                  f"report: {report_path}")
    for line in summary_lines(v):
        print(line, file=sys.stderr)
    return Outcome(report, 1)


def _extend(req: BuildRequest, target: Target, engine: ContainerEngine, image_id: str,
            verdict: Verdict, report: Report, report_path: Path, console: Console) -> Outcome:
    """``--sif`` and ``--push`` continue from the verified image (which keeps its tags when
    they fail: the report records the error), with the run's engine and ``verdict`` (the
    image's recorded one)."""
    try:
        _sif_and_push(req, target, engine, image_id, verdict, report, report_path, console)
    except BuildEnvError as exc:
        report.error = str(exc)
        report.write(report_path)
        return Outcome(report, exc.exit_code, str(exc))
    return Outcome(report, 0)


def _sif_and_push(req: BuildRequest, target: Target, engine: ContainerEngine, image_id: str,
                  verdict: Verdict, report: Report, report_path: Path, console: Console) -> None:
    if not (req.sif or req.push):
        return
    image = engine.image(image_id)  # with the tags it has now
    statements = None
    if req.sign_key:
        # what both signatures say, gathered once (one inventory), before the slow conversion
        statements = sign.statement_inputs(report_path, verdict=verdict, engine=engine,
                                           image_id=image.id, what=f"image {image.id[7:19]}",
                                           require=req.require)
    if req.sif:
        sif_path = sif.convert_verified(engine, image, req.sif, target=target.name,
                                        verdict=verdict, require=req.require)
        report.stages["sif"] = {"path": str(sif_path)}
        console.stage("sif", "ok", str(sif_path))
        if req.sign_key and statements is not None:
            signed = sign.sign_sif(sif_path, *statements, req.sign_key, req.sign_pgp_key,
                                   req.require)
            report.stages["sif"].update(sidecar=str(signed.sidecar), digest=signed.digest,
                                        keyid=signed.keyid, pgp=signed.pgp_fingerprint)
            console.stage("sign", "ok", f"{signed.sidecar} (key {signed.keyid[:16]})")
    if req.push:
        record = publish.publish_verified(engine, image, req.push, target=target.name,
                                          sif=req.sif, pins=report.pins, verdict=verdict,
                                          sbom_doc=statements[1] if statements else None,
                                          record_path=report_path.parent / "publish.json",
                                          sign_key=req.sign_key, report=report_path,
                                          require=req.require)
        report.stages["publish"] = record
        pushed = " (attestations pushed as referrers)" if record.get("attestations") else ""
        console.stage("publish", "ok", str(record.get("image_digest", "")) + pushed)
    report.write(report_path)
