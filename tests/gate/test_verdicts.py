"""Pure logic: the one verdict model, its levels and the one release rule (builder.gate.verdicts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.gate import verdicts
from builder.errors import BuildEnvError
from builder.matrix.families import FAMILIES
from builder.gate.verdicts import Verdict, release_problem
from tests.trust.conftest import CUDA_BUILD_VERDICT, PARTIAL_VERDICT, RELEASE_VERDICT

ROOT = Path(__file__).resolve().parents[2]


def _gpu_report() -> dict:
    """The self-test report of a real run on one H100 (docs/gpu-h100), with the gate section
    verify adds when the engine's host shows that GPU."""
    report = json.loads((ROOT / "docs" / "gpu-h100" / "gpus-1.json").read_text())
    phases = list(FAMILIES["cuda"].release_phases)
    report["gate"] = {"schema": "verl-env/gate/v1", "family": "cuda", "phases": phases,
                      "required_phases": phases, "scope": "release", "partial_reason": None,
                      "gpus": {"expected": 1, "reason": "the engine's host shows 1 nvidia GPU(s)"}}
    return report


def test_levels_say_what_was_proven() -> None:
    cpu = Verdict.from_dict(RELEASE_VERDICT)
    assert cpu.level == "build" and cpu.gpu.status == "none"
    assert release_problem(cpu) is None and release_problem(cpu, "gpu") is None
    assert cpu.describe() == "pass, build verdict"

    cuda = Verdict.from_dict(CUDA_BUILD_VERDICT)
    assert cuda.level == "build" and cuda.gpu.status == "pending"
    assert "engine's host shows 0 nvidia GPU(s)" in cuda.gpu.reason
    assert release_problem(cuda) is None  # a build verdict unlocks tags, SIF and publish
    problem = release_problem(cuda, "gpu")
    assert problem and "where a GPU verdict is required (--require gpu)" in problem
    assert "gpu: pending" in cuda.describe()
    labels = cuda.labels()
    assert labels["org.verl-env.verdict.level"] == "build"
    assert labels["org.verl-env.verdict.gpu"] == "pending"
    assert "0 nvidia GPU(s)" in labels["org.verl-env.verdict.gpu.reason"]

    gpu = Verdict(image="img", exit_code=0, report=_gpu_report())
    assert gpu.level == "gpu" and release_problem(gpu, "gpu") is None
    ev = gpu.gpu
    assert (ev.count, ev.models, ev.driver, ev.runtime, ev.library, ev.transport) == (
        1, ("NVIDIA H100 80GB HBM3",), "580.159.04", "CUDA 13.0", "NCCL 2.28.9", "intra-node")
    assert ev.busbw_gbps is None and "1 rank" in (ev.busbw_note or "")
    assert gpu.labels()["org.verl-env.verdict.gpu"] == "proven"
    assert "1x NVIDIA H100 80GB HBM3, driver 580.159.04, CUDA 13.0, NCCL 2.28.9" in gpu.describe()


def test_gpu_phases_skipped_or_expected_none_stay_pending() -> None:
    report = _gpu_report()
    for c in report["checks"]:
        if c["id"] == "collective.nccl_allreduce":
            c.update(status="skip", required=False, reason="no GPU visible (build host)")
    v = Verdict(image="img", exit_code=0, report=report)
    assert v.level == "build" and "collective.nccl_allreduce did not pass: skip" in v.gpu.reason
    report = _gpu_report()
    report["gate"]["phases"] = [p for p in report["gate"]["phases"] if p != "collective"]
    assert Verdict(image="i", exit_code=0, report=report).gpu.reason == \
        "phase(s) collective did not run"


def test_partial_older_and_inconsistent_records_are_refused() -> None:
    partial = Verdict.from_dict(PARTIAL_VERDICT)
    assert partial.level is None and partial.scope == "partial"
    assert "partial (phases gpu, collective not run)" in (release_problem(partial) or "")
    older = {k: v for k, v in RELEASE_VERDICT.items() if k not in ("scope", "level", "schema")}
    older["report"] = {k: v for k, v in older["report"].items() if k != "gate"}
    assert "older build-env" in (release_problem(Verdict.from_dict(older)) or "")
    # the top level says release, the report's gate says partial: the gate wins
    lying = {**PARTIAL_VERDICT, "scope": "release", "level": "gpu"}
    assert "partial" in (release_problem(Verdict.from_dict(lying)) or "")
    # and the other way round
    assert "record says scope 'partial'" in (
        release_problem(Verdict.from_dict({**RELEASE_VERDICT, "scope": "partial"})) or "")
    failed = {**RELEASE_VERDICT, "overall": "fail"}
    assert release_problem(Verdict.from_dict(failed)) == "overall is 'fail', not 'pass'"
    report_says = {**RELEASE_VERDICT, "report": {**RELEASE_VERDICT["report"],
                                                 "overall": "incomplete"}}
    assert "self-test report says overall 'incomplete'" in (
        release_problem(Verdict.from_dict(report_says)) or "")
    assert "exited 2" in (release_problem(Verdict.from_dict({**RELEASE_VERDICT,
                                                              "exit_code": 2})) or "")
    assert release_problem(None) and "no verdict" in (release_problem(None) or "")
    with pytest.raises(ValueError, match="not a JSON object"):
        Verdict.from_dict(["pass"])


def test_one_serialisation_round_trips() -> None:
    for record in (RELEASE_VERDICT, PARTIAL_VERDICT, CUDA_BUILD_VERDICT):
        assert Verdict.from_dict(record).to_dict() == record
    gpu = Verdict(image="img", exit_code=0, report=_gpu_report()).recorded(
        "sha256:" + "b" * 64, target="cuda-x86_64", tags=["verl-env:cuda-x86_64"])
    back = Verdict.from_dict(json.loads(verdicts.dump(gpu)))
    assert back.to_dict() == gpu.to_dict() and back.level == "gpu"
    assert back.to_dict()["gpu"]["models"] == ["NVIDIA H100 80GB HBM3"]


def test_requirement(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(verdicts.REQUIRE_ENV, raising=False)
    assert verdicts.requirement(None) == "build" and verdicts.requirement("gpu") == "gpu"
    monkeypatch.setenv(verdicts.REQUIRE_ENV, "gpu")
    assert verdicts.requirement(None) == "gpu" and verdicts.requirement("build") == "build"
    monkeypatch.setenv(verdicts.REQUIRE_ENV, "cluster")
    with pytest.raises(BuildEnvError, match=r"\$VERL_ENV_REQUIRE: 'cluster' is not a verdict"):
        verdicts.requirement(None)


def test_local_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    iid = "sha256:" + "a" * 64
    assert not verdicts.is_verified(iid) and "no verdict" in (verdicts.release_problem(verdicts.lookup(iid)) or "")
    verdicts.record(iid, Verdict.from_dict(PARTIAL_VERDICT), target="t", tags=["r:t"])
    assert not verdicts.is_verified(iid)
    assert "partial (phases gpu, collective not run)" in (verdicts.release_problem(verdicts.lookup(iid)) or "")
    rec = verdicts.lookup(iid)
    assert rec and rec.scope == "partial" and rec.tags == ("r:t",) and rec.recorded_at
    assert rec.image_id == iid and verdicts.short(rec) == "partial"
    verdicts.record(iid, Verdict.from_dict(CUDA_BUILD_VERDICT), target="t")
    assert verdicts.is_verified(iid) and not verdicts.is_verified(iid, "gpu")
    assert "gpu: pending" in (verdicts.release_problem(verdicts.lookup(iid), "gpu") or "")
    assert verdicts.short(verdicts.latest_for_target("t")) == "build (gpu pending)"
    assert verdicts.latest_for_target("other") is None
    # a record from before the gate recorded its scope does not count
    (verdicts.state_dir() / f"{'a' * 64}.json").write_text(json.dumps(
        {"overall": "pass", "exit_code": 0, "report": {"overall": "pass"}}))
    assert not verdicts.is_verified(iid)
    assert "older build-env" in (verdicts.release_problem(verdicts.lookup(iid)) or "")
    assert not list(tmp_path.rglob("*.part"))
