"""The seams between the pipeline's stages: `build-env --target T --sif X --sign-key K --push REG`
connects to the engine once, hands that engine, the verdict it recorded and one SBOM inventory to
the SIF conversion, the signature and the publish; and only ``builder/engine/`` speaks Docker.

The count test drives the pipeline's own later stages (:func:`builder.pipeline.preflight` and
``_extend``, what :func:`builder.pipeline.run` calls after the gate) with a fake engine that
counts, and fakes at the far ends (the squashfs writer, the registry's HTTP calls, siftool); the
real path of the same request is run end to end by tests/publish/test_main_job_extended.py.
Before this seam existed the same request connected 4 times, read the verdict 5 times and ran the
inventory container twice.

The plan tests drive the seam between :func:`builder.plan.plan_build` (no engine) and
:func:`builder.pipeline.execute` with an engine that answers from tables and a faked gate.
"""

from __future__ import annotations

import ast
import importlib
import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from builder import __version__, pipeline
from builder.publish import push as publish
from builder.publish import transfer
from builder import exclusive as runlock
from builder.gate import verdicts
from builder.engine import (BuildProgress, BuildResult, ContainerEngine, Engine, ImageInfo,
                            RunResult)
from builder.matrix.naming import content_hash, context_digest
from builder.cli import main
from builder.errors import LockError
from builder.plan import BuildPlan, BuildRequest, Step, plan_build, steps_of
from builder.resolve import vendor
from builder.trust import keys
from builder.trust import sbom as sbom_mod
from builder.trust.sign import Signed

REPO = Path(__file__).resolve().parents[2]
BUILDER = REPO / "builder"
IMAGE_ID = "sha256:" + "ab" * 32
TARGET = "cpu-x86_64"
INVENTORY = {"interpreter": "/opt/venv/bin/python", "python": "3.11.2",
             "python_packages": [{"name": "verl", "version": "0.5.0", "license": "Apache-2.0"}],
             "debian_packages": [{"name": "bash", "version": "5.2", "arch": "amd64"}],
             "os": {"id": "debian", "version_id": "12"}}


class CountingEngine(ContainerEngine):
    """An engine without a daemon: image inspection from a table, the SBOM container's output
    canned; every run is counted by role."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.tags: list[str] = []

    def image(self, ref: str) -> ImageInfo:
        assert ref == IMAGE_ID
        return ImageInfo(IMAGE_ID, tags=(f"verl-env:{TARGET}",), architecture="amd64",
                         size=1 << 20, config={"Labels": {"org.verl-env.accelerator": "cpu",
                                                          "org.verl-env.target": TARGET}})

    def run(self, image: str, command: Sequence[str], *, entrypoint: Sequence[str],
            timeout: float, network: str = "none", files: Mapping[str, bytes] | None = None,
            dirs: Sequence[str] = (), collect: Sequence[str] = (),
            environment: dict[str, str] | None = None, gpus: str | None = None,
            shm_size: str = "2g", role: str = "verify") -> RunResult:
        self.runs[role] += 1
        return RunResult(0, f"{sbom_mod.MARKER}\n{json.dumps(INVENTORY)}\n", 0.1)

    def tag(self, image_id: str, ref: str) -> None:
        self.tags.append(ref)


@pytest.fixture()
def seams(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """Counters on the three things the later stages used to redo, and fakes at the far ends."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    seen = SimpleNamespace(connects=0, lookups=0, engines=[], sboms=[], engine=CountingEngine())

    def connect(cls: type[Engine]) -> Engine:
        seen.connects += 1
        return seen.engine

    real_lookup = verdicts.lookup

    def lookup(image_id: str) -> verdicts.Verdict | None:
        seen.lookups += 1
        return real_lookup(image_id)

    monkeypatch.setattr(Engine, "connect", classmethod(connect))
    monkeypatch.setattr(verdicts, "lookup", lookup)

    # the SIF: conversion and its self-test are the far end (tests/sif runs them for real)
    sif_convert = importlib.import_module("builder.sif.convert")  # the module, not the function

    def build(engine: Engine, backend: str, image: ImageInfo, partial: Path, *a: Any) -> dict:
        seen.engines.append(engine)
        partial.write_bytes(b"SIF")
        return {}

    monkeypatch.setattr("builder.sif.pick_backend", lambda *a, **k: "native")
    monkeypatch.setattr(sif_convert, "pick_backend", lambda *a, **k: "native")
    monkeypatch.setattr(sif_convert, "_build", build)
    monkeypatch.setattr(sif_convert, "verify_sif",
                        lambda *a, **k: {"overall": "pass", "checks": []})

    def sign_sif(sif: Path, verdict: verdicts.Verdict, sbom: dict, provenance: Any,
                 key: Path, pgp_key: Path | None = None, require: str = "build") -> Signed:
        seen.sboms.append(sbom)
        return Signed(sif, sif.with_name(sif.name + ".intoto.jsonl"), "sha256:" + "0" * 64,
                      "f" * 64, None)

    monkeypatch.setattr("builder.trust.sign.sign_sif", sign_sif)

    # the registry: its HTTP calls are the far end (tests/publish runs them for real)
    def push_image(engine: Engine, image: ImageInfo, reg: Any, tag: str, attempts: int) -> str:
        seen.engines.append(engine)
        return "sha256:" + "1" * 64

    def attest(reg: Any, attestations: publish.Attestations, digest: str,
               subjects: list, attempts: int) -> dict:
        seen.sboms.append(attestations.sbom)
        return {"subject": digest, "referrers": [], "fallback_index": None, "cosign_tag": ""}

    monkeypatch.setattr(publish, "preflight", lambda *a, **k: None)
    monkeypatch.setattr(publish, "connect", lambda *a, **k: (
        SimpleNamespace(host="127.0.0.1:5000", repo="verl-env"), "none"))
    monkeypatch.setattr(publish, "check_access", lambda *a, **k: None)
    monkeypatch.setattr(publish, "check_sif_matches", lambda *a, **k: None)
    monkeypatch.setattr(publish, "push_image", push_image)
    monkeypatch.setattr(transfer, "manifest_digest", lambda *a, **k: ("sha256:" + "1" * 64, {}))
    monkeypatch.setattr(publish, "push_sif", lambda *a, **k: ("sha256:" + "2" * 64, {}))
    monkeypatch.setattr(publish, "check_sif_manifest", lambda *a, **k: None)
    monkeypatch.setattr(publish, "release_tags", lambda reg, moves, *a, **k: [m[0] for m in moves])
    monkeypatch.setattr(publish, "attest", attest)
    yield seen


def test_sif_sign_push_connect_once_read_the_verdict_never_and_inventory_once(
        seams: SimpleNamespace, tmp_path: Path) -> None:
    key = keys.generate(tmp_path / "keys")
    sif = tmp_path / "out.sif"
    req = BuildRequest(target=TARGET, sif=sif, sign_key=key.private,
                       push="127.0.0.1:5000/verl-env", quiet=True)
    target: Any = SimpleNamespace(name=TARGET)
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\n")
    report = pipeline.Report(TARGET, False, {"verl": "0.5.0"}, {}, "sha256:" + "3" * 64,
                             "sha256:" + "4" * 64, image_id=IMAGE_ID, result="pass",
                             tags=[f"verl-env:{TARGET}"])
    report.stages["render"] = {"context": str(context)}
    report_path = tmp_path / "report.json"
    report.write(report_path)
    # what run() holds after the gate: the verdict it recorded
    gate = verdicts.Verdict(IMAGE_ID, 0, {"overall": "pass",
                                          "gate": {"scope": "release", "family": "cpu"}})
    recorded = verdicts.record(IMAGE_ID, gate, target=TARGET, tags=report.tags)

    engine = pipeline.preflight(req, target)
    outcome = pipeline._extend(req, target, engine, IMAGE_ID, recorded, report, report_path,
                               pipeline.Console(TARGET, False, True))

    assert outcome.exit_code == 0, outcome.error
    assert sif.read_bytes() == b"SIF" and report.stages["sif"]["keyid"] == "f" * 64
    assert report.stages["publish"]["image_digest"] == "sha256:" + "1" * 64
    assert seams.connects == 1
    assert seams.engine.runs == Counter({"sbom": 1})
    assert seams.lookups == 0  # the verdict the run recorded is handed down, never re-read
    # the SIF and the push used the run's engine; both signatures carry the one SBOM
    assert seams.engines == [engine, engine]
    assert len(seams.sboms) == 3 and all(s is seams.sboms[0] for s in seams.sboms)
    assert report.stages["publish"]["verdict"]["level"] == "build"


def test_a_verdict_about_another_image_is_refused_by_the_later_stages(
        seams: SimpleNamespace, tmp_path: Path) -> None:
    from builder.errors import PublishError, SifError
    from builder.sif import convert_verified

    other = verdicts.Verdict("sha256:" + "cd" * 32, 0, {
        "overall": "pass", "gate": {"scope": "release", "family": "cpu"}}).recorded(
        "sha256:" + "cd" * 32, target=TARGET)
    engine = seams.engine
    image = engine.image(IMAGE_ID)
    with pytest.raises(SifError, match="about sha256:cdcd"):
        convert_verified(engine, image, tmp_path / "x.sif", target=TARGET, verdict=other)
    with pytest.raises(PublishError, match="about sha256:cdcd"):
        publish.publish_verified(engine, image, "127.0.0.1:5000/verl-env", target=TARGET,
                                 sif=None, pins={}, verdict=other)
    assert not (tmp_path / "x.sif").exists() and seams.engines == []


def _docker_imports(path: Path) -> list[str]:
    """``import docker...``/``from docker... import`` statements and ``docker.X`` uses."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"{path}:{node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] == "docker"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "docker":
            found.append(f"{path}:{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Name) and node.id == "docker":
            found.append(f"{path}:{node.lineno}: docker")
    return found


def test_only_the_engine_package_speaks_docker() -> None:
    """No module outside builder/engine/ imports the docker SDK or names it: the rest gets
    ImageInfo, RunResult and BuildResult."""
    offenders = [hit for path in sorted(BUILDER.rglob("*.py"))
                 if "engine" not in path.relative_to(BUILDER).parts[:1]
                 for hit in _docker_imports(path)]
    assert offenders == []
    assert _docker_imports(BUILDER / "engine" / "client.py")  # the check sees an import


class PlanEngine(ContainerEngine):
    """An Engine without a daemon for the plan -> execute seam: base identities and the content
    tag from tables, a build that returns a fixed image, tags recorded."""

    def __init__(self, existing: dict[str, str] | None = None,
                 build_error: BaseException | None = None) -> None:
        self.existing = dict(existing or {})
        self.build_error = build_error
        self.calls: list[str] = []
        self.tags: list[str] = []
        self.removed: list[str] = []

    def remove_orphans(self, role: str | None = None) -> list[str]:
        self.calls.append("remove_orphans")
        return []

    def identity(self, ref: str) -> str:
        self.calls.append(f"identity {ref}")
        return f"{ref}@sha256:" + "9" * 64

    def find(self, ref: str) -> str | None:
        self.calls.append("find")
        return self.existing.get(ref)

    def build(self, context: Path, *, target: str, network: str | None = "host",
              platform: str | None = None, secrets: dict[str, Path] | None = None,
              on_event: Callable[[BuildProgress, str], None] | None = None,
              no_cache: bool = False) -> BuildResult:
        self.calls.append("build")
        assert (context / "Dockerfile").is_file() and target == "cuda-x86_64"
        if self.build_error is not None:
            raise self.build_error
        return BuildResult(IMAGE_ID, 40, 3, 12.5, "")

    def tag_once(self, image_id: str, ref: str) -> None:
        self.tags.append(ref)
        self.existing[ref] = image_id

    def tag(self, image_id: str, ref: str) -> None:
        self.tags.append(ref)

    def remove_candidate(self, image_id: str) -> None:
        self.removed.append(image_id)


@pytest.fixture()
def gate_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The gate (a container run) faked: a release verdict about the image it is given."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    gated: list[str] = []

    def verify_image(engine: Engine, image_id: str, **kwargs: Any) -> verdicts.Verdict:
        gated.append(image_id)
        return verdicts.Verdict(image_id, 0, {"overall": "pass", "checks": [], "gate": {
            "scope": "release", "family": "cuda"}}, seconds=1.0)

    monkeypatch.setattr(pipeline, "verify_image", verify_image)
    return gated


def test_the_plan_is_made_without_the_engine_and_executed_with_it(
        gate_passes: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    req = BuildRequest(target="cuda-x86_64", matrix=REPO / "matrix.yaml",
                       workdir=tmp_path / "work", quiet=True)
    plan = plan_build(req)  # no engine anywhere: Engine.connect is not patched in here
    assert plan.context is not None and plan.context.path == (tmp_path / "work/context").resolve()
    assert plan.base_refs == ("nvidia/cuda:13.0.2-base-ubuntu24.04",
                              "nvidia/cuda:13.0.2-devel-ubuntu24.04")
    assert plan.context_digest == context_digest(plan.context.path)

    engine = PlanEngine()
    outcome = pipeline.execute(plan, engine)
    assert outcome.exit_code == 0 and outcome.report is not None
    report = outcome.report
    assert engine.calls == ["identity nvidia/cuda:13.0.2-base-ubuntu24.04",
                            "identity nvidia/cuda:13.0.2-devel-ubuntu24.04", "find", "build"]
    assert report.content_hash == content_hash(plan.context.path, report.bases, __version__)
    assert report.tags == engine.tags and report.tags[1] == "verl-env:cuda-x86_64"
    assert report.result == "pass" and not report.reused and gate_passes == [IMAGE_ID]
    assert json.loads(plan.report_path.read_text())["result"] == "pass"

    # the same plan again: its content tag exists and holds a release verdict: reused
    again = pipeline.execute(plan, engine)
    assert again.exit_code == 0 and again.report is not None and again.report.reused
    assert engine.calls.count("build") == 1 and gate_passes == [IMAGE_ID]


def test_run_makes_the_plan_under_the_run_lock_and_an_interrupt_removes_the_candidate(
        gate_passes: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = PlanEngine(build_error=KeyboardInterrupt())
    key = pipeline.build_lock_key(REPO / "matrix.yaml", "cuda-x86_64")
    held: list[bool] = []
    real_plan = pipeline.plan_build

    def plan_build(req: BuildRequest, opened: Any = None, **kwargs: Any) -> BuildPlan:
        with pytest.raises(runlock.LockBusy):  # the run holds the target's lock while planning
            with runlock.held(key, what="probe", wait=False):
                pass
        held.append(True)
        return real_plan(req, opened, **kwargs)

    monkeypatch.setattr(Engine, "connect", classmethod(lambda cls: engine))
    monkeypatch.setattr(pipeline, "plan_build", plan_build)
    req = BuildRequest(target="cuda-x86_64", matrix=REPO / "matrix.yaml",
                       workdir=tmp_path / "work", quiet=True)
    outcome = pipeline.run(req)
    assert outcome.exit_code == 130 and outcome.report is not None
    assert outcome.report.result == "interrupted" and engine.tags == [] and gate_passes == []
    assert engine.calls[0] == "remove_orphans" and engine.calls[-1] == "build" and held
    assert engine.removed == []  # nothing was built: no candidate to remove
    assert json.loads((tmp_path / "work/report.json").read_text())["result"] == "interrupted"
    with runlock.held(key, what="test", wait=False):  # released: taken at once
        pass


# ------------------------------------------------------------------- the plan's steps drive the run


def _cuda_plan(tmp_path: Path, **kw: Any) -> BuildPlan:
    return plan_build(BuildRequest(target="cuda-x86_64", matrix=REPO / "matrix.yaml",
                                   workdir=tmp_path / "work", quiet=True, **kw))


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every step the run dispatches, by kind, in order (the real actions still run)."""
    ran: list[str] = []
    for kind, action in list(pipeline.ACTIONS.items()):
        def wrapped(run: Any, kind: str = kind, action: Any = action) -> Any:
            ran.append(kind)
            return action(run)
        monkeypatch.setitem(pipeline.ACTIONS, kind, wrapped)
    return ran


def test_the_run_walks_exactly_the_steps_the_plan_prints(
        gate_passes: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _recording(monkeypatch)
    plan = _cuda_plan(tmp_path)
    printed = plan.to_dict()["steps"]
    assert printed == ["build", "verify", "tag"] == [s.kind for s in plan.steps]
    outcome = pipeline.execute(plan, PlanEngine())
    assert outcome.exit_code == 0 and ran == printed


def test_a_plan_without_its_verify_step_tags_nothing(
        gate_passes: list[str], tmp_path: Path) -> None:
    plan = replace(_cuda_plan(tmp_path), steps=steps_of("build", "tag"))
    engine = PlanEngine()
    outcome = pipeline.execute(plan, engine)
    assert outcome.exit_code == 1 and outcome.report is not None
    assert "nothing was tagged" in (outcome.error or "")
    assert engine.tags == [] and gate_passes == [] and engine.removed == [IMAGE_ID]
    assert outcome.report.result == "error" and outcome.report.tags == []
    assert json.loads(plan.report_path.read_text())["result"] == "error"


def test_a_reordered_plan_is_followed_and_still_tags_nothing_unverified(
        gate_passes: list[str], tmp_path: Path) -> None:
    engine = PlanEngine()
    outcome = pipeline.execute(replace(_cuda_plan(tmp_path),
                                       steps=steps_of("build", "tag", "verify")), engine)
    assert outcome.exit_code == 1 and engine.tags == [] and gate_passes == []
    assert engine.calls[-1] == "build" and engine.removed == [IMAGE_ID]

    # without its tag step the run builds and verifies, and releases nothing
    engine = PlanEngine()
    outcome = pipeline.execute(replace(_cuda_plan(tmp_path), steps=steps_of("build", "verify")),
                               engine)
    assert outcome.exit_code == 1 and engine.tags == [] and gate_passes == [IMAGE_ID]
    assert outcome.report is not None and outcome.report.tags == []


def test_a_later_step_before_the_tag_continues_from_nothing(
        gate_passes: list[str], tmp_path: Path) -> None:
    plan = _cuda_plan(tmp_path, sif=tmp_path / "out.sif")
    assert plan.to_dict()["steps"] == ["build", "verify", "tag", "sif"]
    engine = PlanEngine()
    outcome = pipeline.execute(replace(plan, steps=steps_of("build", "sif", "verify", "tag")),
                               engine)
    assert outcome.exit_code == 1 and "before its tag step" in (outcome.error or "")
    assert engine.tags == [] and gate_passes == [] and not (tmp_path / "out.sif").exists()


def test_an_inspection_added_to_the_plan_runs_first(
        gate_passes: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = PlanEngine()

    def inspected(eng: ContainerEngine, target: Any, lock_file: Path) -> None:
        assert eng is engine and lock_file.name == "cuda-x86_64.txt"
        engine.calls.append("inspect")

    monkeypatch.setattr(vendor, "first_inspection", inspected)
    plan = _cuda_plan(tmp_path)
    plan = replace(plan, steps=steps_of("inspect-base") + plan.steps)
    outcome = pipeline.execute(plan, engine)
    assert outcome.exit_code == 0
    assert engine.calls == ["inspect", "identity nvidia/cuda:13.0.2-base-ubuntu24.04",
                            "identity nvidia/cuda:13.0.2-devel-ubuntu24.04", "find", "build"]

    # the real inspection stops the run: nothing after it is asked of the engine
    def stops(eng: ContainerEngine, target: Any, lock_file: Path) -> None:
        engine.calls.append("inspect")
        raise LockError("inspected it now: re-lock and build again", target=target.name)

    monkeypatch.setattr(vendor, "first_inspection", stops)
    engine.calls.clear()
    with pytest.raises(LockError, match="re-lock"):
        pipeline.execute(plan, engine)
    assert engine.calls == ["inspect"]


def test_print_of_a_vendor_base_lists_its_inspection_and_the_run_does_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-such.sock'}")
    monkeypatch.chdir(tmp_path)
    assert main(["build", "--matrix", str(REPO / "matrix.yaml"), "--target", "rocm-mi300",
                 "--print", "--push", "127.0.0.1:5000/verl-env"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["base"]["inspect_first"] is True and printed["steps"] == ["inspect-base"]

    plan = plan_build(BuildRequest(target="rocm-mi300", matrix=REPO / "matrix.yaml",
                                   workdir=tmp_path / "work"))
    assert [s.kind for s in plan.steps] == printed["steps"] and plan.context is None
    ran = _recording(monkeypatch)
    seen: list[str] = []
    monkeypatch.setattr(vendor, "first_inspection",
                        lambda eng, target, lock: seen.append(lock.name))
    engine = PlanEngine()
    outcome = pipeline.execute(plan, engine)
    assert ran == ["inspect-base"] and seen == ["rocm-mi300.txt"] and engine.calls == []
    assert outcome.exit_code == 1 and outcome.report is None  # nothing but the inspection ran
    assert Step("build").what and pytest.raises(ValueError, Step, "gate")  # kinds are checked
