"""Issue 39 items 3 and 4 on `build-env slurm`: what the user types reaches verl in a form it
takes, or is refused when the job is written, naming the option the user typed."""

from __future__ import annotations

import pytest

from builder.cli import main
from tests.slurm.test_job_training import CUDA, _cmd

TRAIN = ["--train-cmd", "python3 -m verl.trainer.main_ppo trainer.logger=[console,wandb]"]


def test_data_with_space_and_comma_is_one_hydra_value(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    args = [a if a != "/shared/gsm8k" else "/data/my data,v2" for a in CUDA]
    assert main([*args, "--no-train-check"]) == 0
    cmd = _cmd(capsys.readouterr().out)
    assert "data.train_files='/data/my data,v2/train.parquet'" in cmd
    assert "trainer.resume_mode=auto" in cmd
    # checkpoints under the job's directory: a requeued job (same id) resumes its own, a new
    # job never resumes another's
    assert ("trainer.default_local_dir='${SLURM_SUBMIT_DIR}/verl-env-${SLURM_JOB_ID}/"
            "checkpoints'") in cmd


@pytest.mark.parametrize("extra, option", [
    (["--override", "x=1"], "--override"), (["--logger", "wandb"], "--logger"),
    (["--algorithm", "ppo"], "--algorithm"), (["--tp", "16"], "--tp"), (["--pp", "2"], "--pp")])
def test_default_command_options_beside_train_cmd_are_refused(
        extra: list[str], option: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CUDA, *TRAIN, *extra, "--no-train-check"]) == 2
    err = capsys.readouterr().err
    assert f"{option} shapes the default training command only" in err


def test_train_cmd_logger_key_passes_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CUDA, *TRAIN, "--no-train-check"]) == 0
    assert "BY_NAME=(WANDB_API_KEY)" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["-2", "0", "5000"])
def test_nodes_has_one_range_message(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--nodes -2` and `--nodes 0` once got different messages (0 was read as 1 by the default
    command, -2 refused as `nnodes`)."""
    assert main([*CUDA[:5], f"--nodes={value}", *CUDA[7:], "--no-train-check"]) == 2
    err = capsys.readouterr().err
    assert f"--nodes must be a whole number from 1 to 4096, not {value}" in err
    assert len(err.strip().splitlines()) == 1


def test_gpus_per_node_zero_is_a_range_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CUDA[:8], "0", *CUDA[9:], "--no-train-check"]) == 2
    err = capsys.readouterr().err
    assert "--gpus-per-node must be a whole number from 1 to 64 for a cuda job, not 0" in err
    assert "needs" not in err


def test_line_separator_in_data_names_data(capsys: pytest.CaptureFixture[str]) -> None:
    args = [a if a != "/shared/gsm8k" else "/data/a\u2028b" for a in CUDA]
    assert main([*args, "--no-train-check"]) == 2
    err = capsys.readouterr().err
    assert "--data: '/data/a\\u2028b'" in err and "train_cmd" not in err


@pytest.mark.parametrize("args, said", [
    ("--strict; rm -rf /", "the self-test refuses it"), ("--bogus", "the self-test refuses it"),
    ("--json /x", "--json is set by the job"), ("--help", "--help and --version")])
def test_selftest_args_are_the_selftests_own(args: str, said: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CUDA, f"--selftest-args={args}", "--no-train-check"]) == 2
    assert said in capsys.readouterr().err


def test_selftest_args_it_takes_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CUDA, "--selftest-args", "--strict --bw-iters 5", "--no-train-check"]) == 0


def test_megatron_target_uses_verls_megatron_trainer(capsys: pytest.CaptureFixture[str]) -> None:
    args = [a if a != "cuda-x86_64" else "cuda-x86_64-megatron" for a in CUDA]
    assert main([*args, "--tp", "2", "--pp", "2", "--no-train-check"]) == 0
    cmd = _cmd(capsys.readouterr().out)
    assert cmd[:4] == ["python3", "-m", "verl.trainer.main_ppo",
                       "--config-name=ppo_megatron_trainer"]
    assert "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2" in cmd
    assert "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2" in cmd
    assert main([*args, "--tp", "4", "--pp", "8", "--no-train-check"]) == 2
    assert "--tp 4 x --pp 8 = 32 does not divide the 16 GPUs" in capsys.readouterr().err
    assert main([*CUDA, "--pp", "2", "--no-train-check"]) == 2
    assert "--pp 2: pipeline parallelism is the actor's on a target with a stack layer" in (
        capsys.readouterr().err)
