"""``build-env slurm`` runs the train check from the job's own SIF, for real: the installed
tool, the CPU fixture image built and gated by the pipeline, its native SIF (``build-env sif``),
charliecloud's ``ch-run`` on a squashfuse mount of it, verl 0.9.1 inside, the tiny model and
data (tests/support/tiny_verl.py). The engine also has ``verl-env:cpu-x86_64``: the SIF, the
image the job runs, is preferred, and the verdict line names it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import FIXTURE, run_build_env

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow]


@pytest.fixture(scope="module")
def job_sif(cpu_sif: dict) -> Path:
    """The session's SIF of the fixture image (``build-env sif``, tests/conftest.py)."""
    return Path(cpu_sif["path"])


def slurm(sif: Path, tiny: dict, out: Path, *extra: str) -> tuple[int, str]:
    proc = run_build_env("slurm", "--target", "cpu-x86_64", "--matrix", str(FIXTURE),
                         "--runtime", "ch-run", "--sif", str(sif), "--data", tiny["data"],
                         "--model", tiny["model"], "--nodes", "2", "--ray-logical-gpus", "1",
                         "--output", str(out), *extra, timeout=900)
    return proc.returncode, proc.stderr


def test_the_jobs_sif_passes_and_the_script_is_written(job_sif: Path, tiny: dict,
                                                       tmp_path: Path) -> None:
    out = tmp_path / "job.sh"
    code, err = slurm(job_sif, tiny, out)
    assert code == 0, err[-3000:]
    assert f"train check of {job_sif} (ch-run): pass (level config" in err, err[-3000:]
    assert "pass   validate: " in err and "All configuration checks passed" in err
    assert "stop   gpu" in err
    assert out.is_file() and "verl.trainer.main_ppo" in out.read_text()
    # the report names the paths as given, not the scratch copy the check read
    assert "/tmp/verl-env-train-check-" not in err


def test_a_rejected_override_writes_nothing(job_sif: Path, tiny: dict, tmp_path: Path) -> None:
    out = tmp_path / "job.sh"
    code, err = slurm(job_sif, tiny, out, "--override",
                      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null")
    assert code == 1, err[-3000:]
    assert f"train check of {job_sif} (ch-run): rejected" in err
    assert "verl: [actor] Please set at least one of 'actor.ppo_micro_batch_size'" in err
    assert "fix:  --override actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=" in err
    assert "no script written" in err and not out.exists()
