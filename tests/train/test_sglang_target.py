"""verl 0.9.1's own configuration check accepts the default command of the shipped SGLang
target (issue 31 item 1): the rollout it gets from the matrix (builder.train.target_rollout)
is run through the in-image checker with verl's hydra composition and validate_config."""

from __future__ import annotations

from pathlib import Path

from builder.matrix.spec import load_matrix
from builder.train import target_rollout
from tests.train.conftest import RunChecker, tiny_command

REPO = Path(__file__).resolve().parents[2]


def test_verl_accepts_the_sglang_targets_rollout(run_checker: RunChecker, core_py: str,
                                                 tiny: dict) -> None:
    rollout = target_rollout(load_matrix(REPO / "matrix.yaml").target("cuda-x86_64-sglang"))
    assert rollout == "sglang"
    r = run_checker(core_py, tiny_command(tiny, rollout=rollout))
    assert r.code == 0, (r.report, r.stderr[-3000:])
    assert r.report["status"] == "pass" and r.report["verl"] == "0.9.1"
    assert "All configuration checks passed" in r.stage("validate")["verl_says"]
    assert "sglang" in r.stage("trainer")["rollout"]
