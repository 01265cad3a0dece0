"""``build-env reproduce``: rebuild an image from the inputs it records and compare the files.

The image names its inputs in its labels (:func:`builder.render.baked.labels`): the target, the
matrix entry's hash, the lock's hash, each source build's tree or commit, the site CA's hash, the
builder's version; its content tag is the hash of the rendered context with the base images'
identities (:func:`builder.matrix.naming.content_hash`). The rebuild plans the same target here
(:func:`builder.plan.plan_build`: the lock checked, sources fetched and hashed, the context
rendered into a scratch directory) and refuses, exit 3, naming each input, when what it would
build differs from what the image records. It then builds that context through the engine with
no cache, into an untagged candidate (the original is never retagged or replaced), lists both
images' file trees (:meth:`ContainerEngine.file_tree`) and compares them
(:mod:`builder.reproduce.compare`). The candidate is removed afterwards unless kept.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder import pipeline
from builder.engine import ContainerEngine, ImageInfo, faults
from builder.engine.filetree import FileEntry
from builder.errors import BuildEnvError, InfraError, LockError, RenderError, SpecError
from builder.files import atomic_write_text
from builder.gate import verdicts
from builder.gate.record import FileTreeRecord, GateRecord
from builder.plan import BuildPlan, BuildRequest, open_target, plan_build
from builder.render.baked import LABEL_NS
from builder.reproduce.compare import Comparison, compare, root_digest, tree_document

REPORT_SCHEMA = "verl-env/reproduce/v1"


class InputsUnavailable(InfraError):
    """The inputs the image records cannot be had here (exit 3): a target, a lock, a source, a
    base or a build option differs from, or is missing for, what the image was built from."""

    stage = "reproduce"


@dataclass(frozen=True)
class ReproduceRequest:
    """What ``build-env reproduce`` asks for (the CLI fills it)."""

    image: str | None = None
    target: str | None = None
    matrix: Path | None = None
    snapshot: Path | None = None
    ca_bundle: Path | None = None
    templates: Path | None = None
    tag_prefix: str = "verl-env"
    network: str | None = "host"
    keep: bool = False
    tree: Path | None = None  # write the original's per-file list here
    record: bool = True  # an identical rebuild records the tree with the image's verdict


@dataclass
class Outcome:
    """The result: the comparison, the two images, and what happened to the candidate."""

    target: str
    original: str
    candidate: str
    comparison: Comparison
    root: str
    kept: bool
    recorded: bool
    build_seconds: float

    @property
    def exit_code(self) -> int:
        return 0 if self.comparison.identical else 1

    def to_dict(self) -> dict[str, Any]:
        c = self.comparison
        return {"schema": REPORT_SCHEMA, "target": self.target, "original": self.original,
                "candidate": self.candidate, "candidate_kept": self.kept,
                "identical": c.identical, "files": c.files, "root": self.root,
                "differences": [d.to_dict() for d in c.differences],
                "config_differences": [d.to_dict() for d in c.config],
                "recorded": self.recorded, "build_seconds": round(self.build_seconds, 1)}


def _labels(info: ImageInfo) -> dict[str, str]:
    return info.labels


def _request(req: ReproduceRequest, target: str, workdir: Path) -> BuildRequest:
    return BuildRequest(target=target, matrix=req.matrix, snapshot=req.snapshot,
                        ca_bundle=req.ca_bundle, templates=req.templates,
                        tag_prefix=req.tag_prefix, workdir=workdir, network=req.network,
                        quiet=True)


def _target_of(info: ImageInfo, ref: str) -> str:
    labels = _labels(info)
    name = labels.get(f"{LABEL_NS}.target")
    if not name:
        raise InputsUnavailable(f"{ref} carries no {LABEL_NS}.target label: it was not built "
                                "by build-env, so its inputs are not recorded")
    if labels.get(f"{LABEL_NS}.override") == "true":
        raise InputsUnavailable(f"{ref} is an override build of {name}: its --set/--base-image "
                                "values are not recorded in the image, so it cannot be rebuilt "
                                "from what it records", target=name)
    return name


def input_differences(image: dict[str, str], rendered: dict[str, str],
                      inherited: dict[str, str] | None = None) -> list[str]:
    """Each recorded input (a ``org.verl-env.*`` label) whose value here differs from the
    image's: the matrix entry, the lock, a source, the site CA, the builder version. A label the
    image has from its base (``inherited``, with the same value) is the base's, not an input."""
    out = []
    inherited = inherited or {}
    keys = {k for k in image.keys() | rendered.keys() if k.startswith(LABEL_NS + ".")}
    for key in sorted(keys):
        if key not in rendered and key in inherited and inherited[key] == image.get(key):
            continue
        if image.get(key) != rendered.get(key):
            name = key.removeprefix(LABEL_NS + ".")
            out.append(f"{name}: the image records {image.get(key)!r}, here it is "
                       f"{rendered.get(key)!r}")
    return out


def _plan(req: ReproduceRequest, target: str, workdir: Path) -> BuildPlan:
    breq = _request(req, target, workdir)
    try:
        opened = open_target(breq)
        plan = plan_build(breq, opened)
    except (SpecError, LockError, RenderError) as exc:
        raise InputsUnavailable(f"the site here cannot give the image's inputs: {exc}",
                                target=target) from None
    if plan.inspect_base or plan.context is None:
        raise InputsUnavailable("its declared vendor base must be inspected first "
                                f"(build-env lock --probe --target {target})", target=target)
    return plan


def _original(engine: ContainerEngine, req: ReproduceRequest, content_tag: str | None
              ) -> ImageInfo:
    if req.image is not None:
        return engine.image(req.image)
    found = engine.find(content_tag) if content_tag else None
    if found is None:
        raise InputsUnavailable(f"no image under {content_tag} here: build it first "
                                f"(build-env --target {req.target}), or name the image",
                                target=req.target)
    return engine.image(found)


def check_inputs(info: ImageInfo, plan: BuildPlan, content_tag: str, prefix: str,
                 inherited: dict[str, str] | None = None) -> None:
    """Refuse (exit 3) when what would be rebuilt is not what ``info`` records (``inherited``:
    the labels of the base images)."""
    assert plan.context is not None
    name = plan.target.name
    diffs = input_differences(_labels(info), plan.context.labels, inherited)
    mine = f"{prefix}:{name}-"
    tags = [t for t in info.tags if t.startswith(mine) and t != f"{prefix}:{name}-candidate"
            and "-verl" in t]
    if tags and content_tag not in tags:
        diffs.append(f"content: the image is {', '.join(tags)}, the inputs here make "
                     f"{content_tag} (the rendered context or a base image's identity differs)")
    if diffs:
        raise InputsUnavailable("the inputs the image records cannot be had here:\n  "
                                + "\n  ".join(diffs), target=name)


def reproduce(req: ReproduceRequest, engine: ContainerEngine,
              say: Callable[[str], None] = lambda line: None) -> Outcome:
    """Rebuild and compare (see the module); the candidate removed unless ``req.keep``."""
    with tempfile.TemporaryDirectory(prefix="verl-env-reproduce-") as scratch:
        name = req.target
        if req.image is not None:
            name = _target_of(engine.image(req.image), req.image)
        assert name is not None
        plan = _plan(req, name, Path(scratch))
        assert plan.context is not None
        facts = pipeline.resolve(plan, engine)
        info = _original(engine, req, facts.tags.content)
        inherited: dict[str, str] = {}
        for ref in plan.base_refs:
            inherited.update(engine.image(ref).labels)
        check_inputs(info, plan, facts.tags.content, req.tag_prefix, inherited)
        say(f"rebuilding {name} with no cache from {plan.context.path} "
            f"(original {info.id[7:19]})")
        with faults.stage(engine, "build", what=f"the rebuild of {name}", target=name):
            result = engine.build(plan.context.path, target=name, network=req.network,
                                  platform=plan.target.platform, secrets=plan.context.secrets,
                                  no_cache=True)
    candidate = result.image_id
    try:
        say(f"rebuilt {candidate[7:19]} in {result.seconds:.0f} s; listing both file trees")
        before, after = engine.file_tree(info.id), engine.file_tree(candidate)
        rebuilt = engine.image(candidate)
        comparison = compare(before, after, original_config=dict(info.config),
                             rebuilt_config=dict(rebuilt.config))
        root = root_digest(before)
        if req.tree is not None:
            atomic_write_text(req.tree, json.dumps(tree_document(before, image=info.id),
                                                   indent=1, sort_keys=True) + "\n")
        recorded = (req.record and comparison.identical
                    and record_tree(info.id, root, comparison.files))
    finally:
        if not req.keep and candidate != info.id:
            engine.remove_candidate(candidate)
    return Outcome(name, info.id, candidate, comparison, root, req.keep and candidate != info.id,
                   recorded, result.seconds)


def record_tree(image_id: str, root: str, files: int) -> bool:
    """Record the proved tree with ``image_id``'s local verdict (in its gate section, so it
    travels wherever the verdict does: the SIF, the signed statements); False when the image
    has no local verdict."""
    verdict = verdicts.lookup(image_id)
    if verdict is None or not isinstance(verdict.report.get("gate"), dict):
        return False
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    gate = GateRecord.from_dict(verdict.report["gate"])
    gate = dataclasses.replace(gate, files=FileTreeRecord(root, files,
                                                          proved=f"rebuilt identical at {when}"))
    report = {**verdict.report, "gate": gate.to_dict()}
    verdicts.record(image_id, dataclasses.replace(verdict, report=report),
                    target=verdict.target, tags=verdict.tags, binding=verdict.binding)
    return True


def recorded_tree(image_id: str) -> FileTreeRecord | None:
    """The tree recorded with ``image_id``'s local verdict (None: none recorded)."""
    verdict = verdicts.lookup(image_id)
    gate = verdict.gate if verdict is not None else None
    return gate.files if gate is not None else None


def against_record(engine: ContainerEngine, ref: str, record: Path | None
                   ) -> tuple[Comparison | None, str, str]:
    """``--against-record``: the image's tree against what was recorded for it, with no
    rebuild. ``record``: a tree document written by ``--tree`` (every path compared, the
    differing ones named) or a verdict record (its root digest compared); None: the image's
    local verdict. Returns (the comparison, or None when only the roots could be compared;
    the image's root; the recorded root)."""
    info = engine.image(ref)
    entries: list[FileEntry] | None = None
    if record is None:
        tree = recorded_tree(info.id)
        if tree is None:
            raise InputsUnavailable(f"{ref}: no file tree is recorded with its local verdict "
                                    "(an identical `build-env reproduce` records one); give "
                                    "--against-record FILE")
        recorded = tree.root
    else:
        recorded, entries = _read_record(record)
    mine = engine.file_tree(info.id)
    root = root_digest(mine)
    if entries is not None:
        return compare(entries, mine), root, recorded
    return None, root, recorded


def _read_record(path: Path) -> tuple[str, list[FileEntry] | None]:
    """The root (and the entries, for a tree document) of a tree document or verdict record."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BuildEnvError(f"--against-record {path}: cannot read it as JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("entries"), list):
        try:
            return str(data["root"]), [FileEntry.from_dict(e) for e in data["entries"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise BuildEnvError(f"--against-record {path}: a malformed tree document ({exc})"
                                ) from None
    try:
        gate = verdicts.Verdict.from_dict(data).gate
    except ValueError:
        gate = None
    if gate is None or gate.files is None:
        raise BuildEnvError(f"--against-record {path}: neither a tree document (--tree) nor a "
                            "verdict record with a file tree (gate.files)")
    return gate.files.root, None


__all__ = ["BuildEnvError", "against_record", "InputsUnavailable", "Outcome", "ReproduceRequest", "check_inputs",
           "input_differences", "record_tree", "recorded_tree", "reproduce"]
