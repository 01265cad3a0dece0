"""The plan of a build, apart from its execution (buildx bake's model): what ``build-env --target
T`` will build, from which lock and context, under which names, and what extends it, resolved as
plain data before an engine is reached.

:func:`plan_build` needs no engine: it checks and reads the lock (an override build resolves its
own lock with uv), renders the build context and hashes it. Two facts need the engine, and the
plan says so instead of guessing: the base images' identities, which the content hash covers
(``engine.identity``), and whether the content tag already exists (``engine.find``: reuse or
build). :class:`EngineFacts` holds them once :func:`builder.pipeline.execute` has asked the
engine at the start of the run. A declared vendor base the engine has never inspected is a third:
the plan stops there (``inspect_base``): its one step inspects it and stops the run.

The plan's :attr:`BuildPlan.steps` are what the run does, in order (:data:`STEP_WHAT`):
:func:`builder.pipeline.execute` walks them, dispatching each by its kind, and ``build-env
--target T --print`` prints :meth:`BuildPlan.to_dict`, whose ``steps`` are that list
(docs/commands.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from builder.resolve import vendor
from builder.resolve.lock import lock_for, lock_path
from builder.resolve.metadata import Snapshot
from builder.matrix.naming import Names, context_digest, names
from builder.render import BuildContext, render_context
from builder.matrix.spec import Target
from builder.resolve.targets import Site, open_site, resolve_target

PLAN_SCHEMA = "verl-env/build-plan/v1"
ENGINE = "the engine"

StepKind = Literal["inspect-base", "build", "verify", "tag", "sif", "sign", "publish"]
STEP_WHAT: dict[str, str] = {
    "inspect-base": "inspect the declared vendor base through the engine, record what it holds "
                    "beside the lock, and stop: re-lock with the record, then build again",
    "build": "build the context into a candidate image, or take the image under the content tag "
             "(reused when it holds a release verdict)",
    "verify": "run the gate inside the image: a verdict below --require stops the run with "
              "nothing tagged (the candidate removed unless --keep-candidate)",
    "tag": "tag the verified image: its content tag, then the release tags",
    "sif": "convert the verified image to a SIF and check it (--sif)",
    "sign": "sign the verdict, SBOM and provenance (--sign-key): the SIF's, and the pushed "
            "image's attestations",
    "publish": "push the image (and the SIF) by digest, then move the release tags (--push)",
}


@dataclass(frozen=True)
class Step:
    """One action of the run, named by its kind (:data:`STEP_WHAT` says what it does)."""

    kind: StepKind

    def __post_init__(self) -> None:
        if self.kind not in get_args(StepKind):
            raise ValueError(f"unknown build step {self.kind!r}")

    @property
    def what(self) -> str:
        return STEP_WHAT[self.kind]


def steps_of(*kinds: StepKind) -> tuple[Step, ...]:
    return tuple(Step(kind) for kind in kinds)


def later_steps(req: BuildRequest) -> tuple[Step, ...]:
    """The steps after the tag: ``sif``, ``sign``, ``publish`` as requested."""
    return steps_of(*(kind for kind, wanted in (("sif", req.sif), ("sign", req.sign_key),
                                                ("publish", req.push)) if wanted))


@dataclass(frozen=True)
class BuildRequest:
    """What ``build-env --target T`` asks for (the CLI fills it; nothing below sees argparse)."""

    target: str
    matrix: Path | None = None
    snapshot: Path | None = None
    overrides: tuple[str, ...] = ()
    base_image: str | None = None
    ca_bundle: Path | None = None
    templates: Path | None = None
    tag_prefix: str = "verl-env"
    workdir: Path | None = None
    keep_candidate: bool = False
    network: str | None = "host"
    verify_timeout: float = 900
    gpus: str = "auto"
    expect_gpus: int | None = None
    reverify: bool = False
    require: str = "build"  # the verdict level that unlocks tags, SIF and publish (build | gpu)
    sif: Path | None = None
    sign_key: Path | None = None  # ECDSA P-256 (PKCS#8 PEM): attestations beside the SIF
    sign_pgp_key: Path | None = None  # OpenPGP key: the SIF's own signature
    push: str | None = None
    verbose: bool = False
    quiet: bool = False


@dataclass(frozen=True)
class OpenTarget:
    """The request's site, its target resolved (``--set``/``--base-image`` applied) and the
    metadata snapshot of that target."""

    site: Site
    target: Target
    snapshot: Snapshot


def open_target(req: BuildRequest) -> OpenTarget:
    """The site, target and snapshot of ``req`` (no engine, no network)."""
    site = open_site(req.matrix, req.snapshot)
    target = resolve_target(site, req.target, req.overrides, req.base_image)
    return OpenTarget(site, target, site.snapshot([target]))


@dataclass(frozen=True)
class BuildPlan:
    """One target's build, resolved without an engine. ``context`` is None (and so are the lock
    and the digest) only when ``inspect_base``: the run must inspect a declared vendor base
    first, which stops it. ``steps``: what the run does, in order (``inspect-base`` alone, or
    ``build``, ``verify``, ``tag`` and what extends them)."""

    request: BuildRequest
    target: Target
    matrix: Path  # the site's matrix file: the run lock's key
    workdir: Path  # where the build writes its context and report
    base_refs: tuple[str, ...]  # the images whose identities the content hash covers
    base_record: dict[str, Any] | None
    inspect_base: bool
    lock_file: Path | None
    context: BuildContext | None
    context_digest: str | None  # None: the context lacks what it did not fetch
    steps: tuple[Step, ...]

    @property
    def report_path(self) -> Path:
        return self.workdir / "report.json"

    @property
    def extends(self) -> tuple[str, ...]:
        """The steps after the tag: ``sif``, ``sign``, ``publish`` as requested."""
        return tuple(step.kind for step in later_steps(self.request))

    def to_dict(self) -> dict[str, Any]:
        """The plan as ``build-env --target T --print`` prints it (schema in docs/commands.md).
        What needs the engine is ``{"known": false, "needs": "the engine", "why": ...}``."""
        t, req = self.target, self.request
        pattern = names(t, req.tag_prefix, "sha256:<hash12>").content
        return {
            "schema": PLAN_SCHEMA, "target": t.name, "platform": t.platform,
            "accelerator": t.accelerator, "override": t.override, "matrix": str(self.matrix),
            "matrix_hash": t.entry_hash, "workdir": str(self.workdir),
            "report": str(self.report_path),
            "base": {"refs": list(self.base_refs), "vendor": self.base_record is not None,
                     "inspect_first": self.inspect_base},
            "lock": self._lock(), "context": self._context(),
            "content_tag": _unknown("it hashes the context with the base images' identities "
                                    "(engine.identity)", pattern=pattern),
            "release_tags": list(names(t, req.tag_prefix, "sha256:").release),
            "reuse": _unknown("an existing content tag (engine.find) holding a release verdict "
                              "is reused, else the image is built"
                              + ("; --reverify runs the gate again" if req.reverify else "")),
            "require": req.require,
            "steps": [step.kind for step in self.steps],
            "extends": {"sif": str(req.sif) if req.sif else None,
                        "sign": {"key": str(req.sign_key), "pgp_key": _str(req.sign_pgp_key)}
                        if req.sign_key else None,
                        "push": req.push},
        }

    def _lock(self) -> dict[str, Any] | None:
        if self.lock_file is None or self.context is None:
            return None
        path = self.workdir / self.lock_file.name if self.target.override else self.lock_file
        return {"path": str(path), "hash": self.context.lock_hash,
                "resolved_for_override": self.target.override}

    def _context(self) -> dict[str, Any] | None:
        if self.context is None:
            return None
        man = self.context.manifest
        digest: Any = self.context_digest
        if digest is None:
            digest = {"known": False, "needs": "the network",
                      "why": "not fetched: " + ", ".join(self.context.unfetched)}
        return {"path": str(self.workdir / "context"), "digest": digest, "pins": man["pins"],
                "provided": man["provided"], "source_pins": man.get("source_pins", {})}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class EngineFacts:
    """What only the engine knows, asked at the start of the run: the base images' identities,
    the content hash over them and the context, its names, and the image already under the
    content tag (None: build one)."""

    bases: tuple[str, ...]
    content: str
    tags: Names
    image_id: str | None


def _unknown(why: str, **known: Any) -> dict[str, Any]:
    return {"known": False, "needs": ENGINE, "why": why, **known}


def _str(path: Path | None) -> str | None:
    return str(path) if path is not None else None


def plan_build(req: BuildRequest, opened: OpenTarget | None = None, *,
               scratch: Path | None = None, fetch: bool = True) -> BuildPlan:
    """The plan of ``req`` (``opened``: its site and target, when the caller has them): the lock
    checked (an override's resolved), the context rendered and hashed. Writes only the build's
    workdir (its ``context/`` and an override's lock), or ``scratch`` instead (``--print``: the
    build's own workdir is left alone). ``fetch=False``: git and URL sources and prebuilt wheels
    are not fetched (no network unless an override's lock must be resolved); the context's
    digest is then unknown."""
    opened = opened or open_target(req)
    target, matrix, snapshot = opened.target, opened.site.path, opened.snapshot
    workdir = req.workdir or Path("build") / target.name
    out = scratch if scratch is not None else workdir
    committed = lock_path(matrix, target)
    base_record = vendor.load_record(target, committed)
    base_refs = tuple(dict.fromkeys([target.base.ref, target.base.source_image or target.base.ref,
                                     *([target.base.bytecode_image]
                                       if target.base.bytecode_image else [])]))
    if base_record is not None and not base_record.get("inspected"):
        return BuildPlan(req, target, matrix, workdir, base_refs, base_record, True, None, None,
                         None, steps_of("inspect-base"))
    lock_text, lock_file = lock_for(matrix, target, snapshot, out)
    ctx = render_context(target, lock_text, snapshot, out / "context",
                         lock_file=lock_file, ca_bundle=req.ca_bundle, templates=req.templates,
                         base_record=base_record, fetch_sources=fetch, fetch_prebuilt=fetch)
    return BuildPlan(req, target, matrix, workdir, base_refs, base_record, False, lock_file, ctx,
                     None if ctx.unfetched else context_digest(ctx.path),
                     steps_of("build", "verify", "tag") + later_steps(req))
