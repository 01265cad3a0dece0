"""The Slurm job's default trainer for the SGLang target (issue 31 item 1): the rollout engine
follows the target, so the rendered command says `actor_rollout_ref.rollout.name=sglang`."""

from __future__ import annotations

import pytest

from builder.cli import main
from tests.slurm.test_job_training import CUDA, _cmd


def test_the_sglang_target_trains_with_sglang_rollout(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    args = [a if a != "cuda-x86_64" else "cuda-x86_64-sglang" for a in CUDA]
    assert args != CUDA
    assert main(args) == 0
    cmd = _cmd(capsys.readouterr().out)
    assert cmd[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    assert "actor_rollout_ref.rollout.name=sglang" in cmd, cmd
    assert not any(w.startswith("actor_rollout_ref.rollout.name=vllm") for w in cmd)
    assert not any("engine_kwargs.vllm" in w for w in cmd)
