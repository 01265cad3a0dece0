"""The main job: plan -> build -> verify -> tag, with a report.

The plan (:mod:`builder.plan`: lock, context, names, its steps) is made without an engine;
:func:`execute` runs it by walking its steps, each dispatched by its kind (:data:`ACTIONS`): a
declared vendor base is inspected (``inspect-base``, which stops the run), or the engine is asked
what the plan cannot know, then ``build`` (or reuse), ``verify``, ``tag``, and ``sif``, ``sign``,
``publish`` as requested. What ``build-env --target T --print`` lists is what runs.

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

import itertools
import json
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
from builder.engine import (BuildProgress, ContainerEngine, Engine, ImageInfo, faults,
                            interrupts_raise)
from builder.errors import BuildEnvError, LockError, VerifyError
from builder.files import atomic_write_text
from builder.resolve.lock import lock_path
from builder.matrix.naming import Names, content_hash, names
from builder.plan import (BuildPlan, BuildRequest, EngineFacts, Step, later_steps, open_target,
                          plan_build)
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
GATED = frozenset({"build", "verify", "tag"})  # under the run lock; nothing tagged unverified
LATER = frozenset({"sif", "sign", "publish"})  # after the lock; a failure keeps the tags


@dataclass
class _Step:
    """Where the gated part of a run is, for its interrupt and fault handling."""

    stage: str
    what: str
    image_id: str | None = None
    built: bool = False


@dataclass
class _Run:
    """What the steps of one run share: the request, the engine, the report, and what the steps
    before found (the engine facts, the image, its verdict, whether it is tagged)."""

    req: BuildRequest
    target: Target
    engine: ContainerEngine
    console: Console
    report_path: Path
    kinds: frozenset[str]  # the kinds of the run's steps
    plan: BuildPlan | None = None  # None: only the later steps run (:func:`_extend`)
    report: Report | None = None
    facts: EngineFacts | None = None
    at: _Step = field(default_factory=lambda: _Step("build", "the build"))
    verdict: Verdict | None = None  # the image's release verdict (the gate's, or reused)
    reused: bool = False
    tagged: bool = False
    image: ImageInfo | None = None  # the tagged image, as the later steps see it
    statements: tuple[Any, ...] | None = None  # what both signatures say, gathered once
    sif_path: Path | None = None

    @property
    def built_plan(self) -> BuildPlan:
        assert self.plan is not None
        return self.plan

    @property
    def the_report(self) -> Report:
        assert self.report is not None
        return self.report

    @property
    def tags(self) -> Names:
        assert self.facts is not None
        return self.facts.tags


def execute(plan: BuildPlan, engine: ContainerEngine, console: Console | None = None, *,
            release: Callable[[], None] = lambda: None, started: float | None = None
            ) -> Outcome:
    """Run ``plan`` on ``engine``: walk ``plan.steps`` in order, each dispatched by its kind
    (:func:`dispatch`). ``inspect-base`` inspects a declared vendor base and stops the run.
    Before the first other step the engine is asked what the plan cannot know
    (:func:`resolve`). ``build``, ``verify``, ``tag`` run under the run lock the caller holds
    (the plan's context must not change under a running build: :func:`run` makes the plan
    under the lock), with the interrupt and fault handling (nothing is tagged unless this run's
    gate, or a recorded release verdict, passed it). ``release()`` is called before ``sif``,
    ``sign``, ``publish``, whose failure keeps the image's tags (the report records it).
    ``started``: when the run's preparation began (the report's render seconds)."""
    started = time.monotonic() if started is None else started
    console = console or Console(plan.target.name, plan.request.verbose, plan.request.quiet)
    run = _Run(plan.request, plan.target, engine, console, plan.report_path,
               frozenset(s.kind for s in plan.steps), plan)
    for phase, group in itertools.groupby(plan.steps, key=_phase):
        steps = list(group)
        if phase == "inspect":
            with faults.stage(engine, "render", what=RENDER_WHAT, target=plan.target.name):
                for step in steps:
                    dispatch(run, step)
            continue
        if run.report is None:
            _prepare(run, started)
        if phase == "gate":
            outcome = _gated(run, steps)
        else:
            release()
            outcome = _later(run, steps)
        if outcome is not None:
            release()
            return outcome
    release()
    return _finish(run)


def _phase(step: Step) -> str:
    return ("inspect" if step.kind == "inspect-base" else "gate" if step.kind in GATED
            else "later")


def _prepare(run: _Run, started: float) -> None:
    """The engine facts and the report the steps after an inspection start from."""
    plan = run.built_plan
    with faults.stage(run.engine, "render", what=RENDER_WHAT, target=plan.target.name):
        facts = resolve(plan, run.engine)
    assert plan.context is not None  # resolve refused otherwise
    ctx = plan.context
    report = Report(plan.target.name, plan.target.override, ctx.manifest["pins"],
                    ctx.manifest["provided"], ctx.manifest["matrix_hash"], ctx.lock_hash,
                    content_hash=facts.content, bases=list(facts.bases))
    report.stages["render"] = {"seconds": round(time.monotonic() - started, 2),
                               "context": str(ctx.path)}
    run.console.stage("render", "ok", f"{ctx.path}  content {facts.content[7:19]}")
    run.facts, run.report = facts, report
    run.at = _Step("build", f"the build of {facts.tags.content}", facts.image_id)


def resolve(plan: BuildPlan, engine: ContainerEngine) -> EngineFacts:
    """The plan's engine facts: the base images' identities, the content hash over them, and
    the image under its content tag. A plan without a context (a declared vendor base not yet
    inspected) has none: its step is ``inspect-base``."""
    target = plan.target
    if plan.context is None:
        raise LockError(f"{target.base.ref} must be inspected before {target.name} can be "
                        "built: its plan's step is inspect-base", target=target.name)
    bases = tuple(engine.identity(ref) for ref in plan.base_refs)
    content = content_hash(plan.context.path, bases, __version__)
    tags = names(target, plan.request.tag_prefix, content)
    return EngineFacts(bases, content, tags, engine.find(tags.content))


def _gated(run: _Run, steps: list[Step]) -> Outcome | None:
    """``build``/``verify``/``tag`` under the target's run lock. An Outcome when the run ends
    here (refused, failed, interrupted), else None (the report written)."""
    report, at, engine = run.the_report, run.at, run.engine
    try:
        with interrupts_raise():
            for step in steps:
                outcome = dispatch(run, step)
                if outcome is not None:
                    return outcome
    except KeyboardInterrupt:
        report.result, report.error = "interrupted", "interrupted by a signal"
        if at.image_id and at.built:
            engine.remove_candidate(at.image_id)
        report.write(run.report_path)
        run.console.stage("abort", "fail", "interrupted: no tag applied, candidate removed")
        return Outcome(report, 130)
    except BaseException as exc:
        fault = faults.translate(engine, exc, stage=at.stage, what=at.what,
                                 target=run.target.name) if isinstance(exc, Exception) else None
        error: BaseException = fault or exc
        if at.image_id and at.built:
            engine.remove_candidate(at.image_id)
            if isinstance(fault, faults.EngineDown):
                fault.args = (f"{fault.args[0]} The candidate image {at.image_id[:19]} stays "
                              "in the engine, untagged.",)
        report.result, report.error = "error", str(error)
        report.write(run.report_path)
        if isinstance(error, BuildEnvError):
            return Outcome(report, error.exit_code, str(error))
        raise
    report.write(run.report_path)
    return None


def _later(run: _Run, steps: list[Step] | tuple[Step, ...]) -> Outcome | None:
    """``sif``, ``sign``, ``publish`` continue from the verified image (which keeps its tags
    when they fail: the report records the error)."""
    report = run.the_report
    try:
        for step in steps:
            dispatch(run, step)
    except BuildEnvError as exc:
        report.error = str(exc)
        report.write(run.report_path)
        return Outcome(report, exc.exit_code, str(exc))
    report.write(run.report_path)
    return None


def _finish(run: _Run) -> Outcome:
    if run.report is None:
        return Outcome(None, 1, f"the plan of {run.target.name} has no steps")
    if not run.tagged:
        error = f"{run.target.name}: the plan's steps ended before a tag: nothing was released"
        run.report.error = run.report.error or error
        run.report.write(run.report_path)
        return Outcome(run.report, 1, error)
    return Outcome(run.report, 0)


def _extend(req: BuildRequest, target: Target, engine: ContainerEngine, image_id: str,
            verdict: Verdict, report: Report, report_path: Path, console: Console) -> Outcome:
    """The later steps of ``req`` (:func:`builder.plan.later_steps`) from ``image_id``, verified
    (``verdict``, the image's recorded one) and tagged, with the run's engine."""
    steps = later_steps(req)
    run = _Run(req, target, engine, console, report_path, frozenset(s.kind for s in steps),
               report=report, verdict=verdict, tagged=True)
    run.at.image_id = image_id
    return _later(run, steps) or Outcome(report, 0)



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
    again = ""
    if result.retried:
        report.stages["build"]["retried"] = result.retried
        again = f" (built again: BuildKit broke the first attempt off: {result.retried})"
    console.stage("build", "ok", f"{result.image_id[7:19]}  {result.steps} steps, "
                  f"{result.cache_hits} cached, {result.seconds:.1f} s{again}")


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


def _reuse(report: Report, console: Console, tags: Names, known: Verdict) -> None:
    """The content tag exists and holds a release verdict: nothing is built or re-verified."""
    report.verification = known.report
    when = known.recorded_at or "earlier"
    report.stages["verify"] = {"seconds": 0.0, "overall": known.overall, "reused": when,
                               "scope": known.scope, "level": known.level,
                               "gpu": known.gpu.status}
    console.stage("verify", "pass", f"{tags.content} was verified {when} ({_level(known)}); "
                  "not rebuilt, not re-verified (--reverify to run the gate again)")


# --------------------------------------------------------------------------- the steps


def dispatch(run: _Run, step: Step) -> Outcome | None:
    """Run one step of the plan by its kind; an Outcome ends the run there."""
    return ACTIONS[step.kind](run)


def _inspect_base(run: _Run) -> None:
    """``inspect-base``: inspect the declared vendor base, record it beside the lock, stop."""
    plan = run.built_plan
    vendor.first_inspection(run.engine, run.target, lock_path(plan.matrix, run.target))


def _build_step(run: _Run) -> None:
    """``build``: take the image under the content tag (reused when it holds a release verdict
    and ``--reverify`` is not given, else verified again), or build a candidate."""
    plan, report, at, req, tags = run.built_plan, run.the_report, run.at, run.req, run.tags
    if at.image_id is None:
        _build(plan, run.engine, run.console, report, at)
        return
    report.image_id = at.image_id
    report.stages["build"] = {"seconds": 0.0, "reused": tags.content}
    known = verdicts.lookup(at.image_id)
    if known and verdicts.release_problem(known, req.require) is None and not req.reverify:
        if (bound := _binding(plan, tags)) is not None:
            verdicts.bind(at.image_id, known, bound)
        run.verdict, run.reused, report.reused = known, True, True
        return
    run.console.stage("build", "reuse", f"{tags.content} exists ({at.image_id[7:19]}); "
                      "verifying it")


def _verify_step(run: _Run) -> Outcome | None:
    """``verify``: the gate inside the image; below ``--require`` the run ends untagged."""
    plan, report, at, req, tags = run.built_plan, run.the_report, run.at, run.req, run.tags
    if run.reused:
        assert run.verdict is not None
        _reuse(report, run.console, tags, run.verdict)
        return None
    image_id = at.image_id
    if image_id is None:
        raise VerifyError("verify: no image to verify: the plan has no build step before "
                            "it", target=run.target.name)
    at.stage, at.what = "verify", f"the gate of image {image_id[:19]}"
    gpus = None if req.gpus == "none" else req.gpus
    v = verify_image(run.engine, image_id, timeout=req.verify_timeout, gpus=gpus,
                     expect_gpus=req.expect_gpus)
    report.verification = v.report
    report.stages["verify"] = {"seconds": round(v.seconds, 1), "overall": v.overall,
                               "exit_code": v.exit_code, "scope": v.scope, "level": v.level,
                               "gpu": v.gpu.status}
    verdicts.record(image_id, v, target=plan.target.name, binding=_binding(plan, tags))
    problem = verdicts.release_problem(v, req.require)
    if problem is not None:
        return _refuse(run.engine, report, run.report_path, run.console, v, req, plan.target,
                       at.built, problem)
    run.console.stage("verify", "pass", f"{v.seconds:.1f} s, {_level(v)}" + _skips(v))
    run.verdict = v
    return None


def _tag_step(run: _Run) -> None:
    """``tag``: the content tag (never moved), then the release tags; only an image whose
    release verdict this run holds (its gate's, or the reused one)."""
    plan, report, at, tags, engine = run.built_plan, run.the_report, run.at, run.tags, run.engine
    image_id, v = at.image_id, run.verdict
    if image_id is None or v is None:
        raise VerifyError("tag: no verified image to tag: the plan tags only what its verify "
                            "step passed; nothing was tagged", target=run.target.name)
    if not run.reused:
        at.stage, at.what = "tag", f"tagging image {image_id[:19]}"
        engine.tag_once(image_id, tags.content)
    for ref in tags.release:
        engine.tag(image_id, ref)
    report.tags = list(tags.all)
    report.result = "pass"
    run.tagged = True
    if not run.reused:
        run.console.stage("tag", "ok", "  ".join(report.tags))
        run.verdict = verdicts.record(image_id, v, target=plan.target.name, tags=report.tags,
                                      binding=_binding(plan, tags))


def _tagged_image(run: _Run, kind: str) -> ImageInfo:
    """The verified, tagged image the later steps continue from (with the tags it has now)."""
    if not run.tagged or run.at.image_id is None:
        raise VerifyError(f"{kind}: no verified, tagged image to continue from: the plan's "
                            f"{kind} step comes before its tag step", target=run.target.name)
    if run.image is None:
        run.image = run.engine.image(run.at.image_id)
    return run.image


def _statements(run: _Run) -> tuple[Any, ...]:
    """What both signatures say, gathered once (one inventory)."""
    if run.statements is None:
        image = _tagged_image(run, "sign")
        run.statements = sign.statement_inputs(
            run.report_path, verdict=run.verdict, engine=run.engine, image_id=image.id,
            what=f"image {image.id[7:19]}", require=run.req.require)
    return run.statements


def _sif_step(run: _Run) -> None:
    """``sif``: the verified image converted (``--sif``) and checked."""
    image, req, report = _tagged_image(run, "sif"), run.req, run.the_report
    if req.sif is None:
        raise BuildEnvError("sif: the plan's sif step needs --sif PATH", target=run.target.name)
    if "sign" in run.kinds:
        _statements(run)  # before the slow conversion: what would refuse, refuses first
    path = sif.convert_verified(run.engine, image, req.sif, target=run.target.name,
                                verdict=run.verdict, require=req.require)
    run.sif_path = path
    report.stages["sif"] = {"path": str(path)}
    run.console.stage("sif", "ok", str(path))


def _sign_step(run: _Run) -> None:
    """``sign``: the statements gathered; the SIF of this run signed (its sidecar); the push
    attaches the same statements."""
    req, report = run.req, run.the_report
    if req.sign_key is None:
        raise BuildEnvError("sign: the plan's sign step needs --sign-key", target=run.target.name)
    statements = _statements(run)
    if run.sif_path is None:
        return
    signed = sign.sign_sif(run.sif_path, *statements, req.sign_key, req.sign_pgp_key,
                           req.require)
    report.stages["sif"].update(sidecar=str(signed.sidecar), digest=signed.digest,
                                keyid=signed.keyid, pgp=signed.pgp_fingerprint)
    run.console.stage("sign", "ok", f"{signed.sidecar} (key {signed.keyid[:16]})")


def _publish_step(run: _Run) -> None:
    """``publish``: the image (and this run's SIF) pushed by digest, the release tags moved."""
    image, req, report = _tagged_image(run, "publish"), run.req, run.the_report
    if req.push is None:
        raise BuildEnvError("publish: the plan's publish step needs --push REGISTRY/REPO",
                            target=run.target.name)
    statements = run.statements
    record = publish.publish_verified(run.engine, image, req.push, target=run.target.name,
                                      sif=run.sif_path, pins=report.pins, verdict=run.verdict,
                                      sbom_doc=statements[1] if statements else None,
                                      record_path=run.report_path.parent / "publish.json",
                                      sign_key=req.sign_key if statements else None,
                                      report=run.report_path, require=req.require)
    report.stages["publish"] = record
    pushed = " (attestations pushed as referrers)" if record.get("attestations") else ""
    run.console.stage("publish", "ok", str(record.get("image_digest", "")) + pushed)


ACTIONS: dict[str, Callable[[_Run], Outcome | None]] = {
    "inspect-base": _inspect_base, "build": _build_step, "verify": _verify_step,
    "tag": _tag_step, "sif": _sif_step, "sign": _sign_step, "publish": _publish_step}
