"""The training stage (issue 30, item 3) on the rendered script: the default command is
builder.train's for the target's verl, the train check runs in the image before Ray, and the
trainer never starts when Ray does not count the GPUs it waits for."""

from __future__ import annotations

import base64
import os
import shlex
import re
import subprocess
from pathlib import Path

import pytest

from builder.cli import main
from builder.errors import SlurmError
from builder.cluster.render import render_sbatch
from builder.train import checker_bytes
from tests.slurm.test_job_admin import _function
from tests.slurm.test_render import ORAS, job_for

CUDA = ["slurm", "--target", "cuda-x86_64", "--sif", ORAS, "--nodes", "2", "--gpus-per-node",
        "8", "--data", "/shared/gsm8k", "--model", "/shared/models/qwen"]


def _cmd(text: str) -> list[str]:
    line = next(li for li in text.splitlines() if li.strip().startswith("local cmd=("))
    return re.findall(r'"((?:[^"\\]|\\.)*)"', line)


def test_default_command_is_the_train_data_for_the_target(capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    assert main(CUDA) == 0
    text = capsys.readouterr().out
    payload = re.search(r"<<'VERL_ENV_CHECKER'\n(.*?)\nVERL_ENV_CHECKER", text, re.S)
    assert payload and base64.b64decode(payload.group(1)) == checker_bytes()
    cmd = _cmd(text)
    assert cmd[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    for word in ("algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.name=vllm",
                 "trainer.nnodes=2", "trainer.n_gpus_per_node=8", "trainer.logger=[console]",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                 "data.train_files=/shared/gsm8k/train.parquet",
                 "trainer.default_local_dir='${SLURM_SUBMIT_DIR}/verl-env-${SLURM_JOB_ID}/"
                 "checkpoints'",
                 "trainer.resume_mode=auto"):
        assert word in cmd, (word, cmd)
    assert "TRAIN_NNODES=\"2\"" in text and "TRAIN_GPUS_PER_NODE=\"8\"" in text


def test_logger_override_algorithm_and_tp(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CUDA, "--logger", "console", "--logger", "wandb", "--algorithm", "ppo",
                 "--tp", "2", "--override", "data.max_prompt_length=256"]) == 0
    captured = capsys.readouterr()
    cmd = _cmd(captured.out)
    assert "trainer.logger=[console,wandb]" in cmd and "algorithm.adv_estimator=gae" in cmd
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=2" in cmd
    assert cmd[-1] == "data.max_prompt_length=256"  # the user's override last: hydra wins
    assert "BY_NAME=(WANDB_API_KEY)" in captured.out  # the logger's key, by name only
    assert main([*CUDA, "--override", "no-equals-sign"]) == 2
    assert "--override 'no-equals-sign': expected KEY=VALUE" in capsys.readouterr().err


def test_rocm_target_gets_its_rollout_and_family_overrides(capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    assert main([*CUDA[:2], "rocm-mi300", *CUDA[3:]]) == 0
    cmd = _cmd(capsys.readouterr().out)
    assert ("+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_custom_all_reduce=True"
            in cmd)


def test_train_check_runs_in_the_image_before_ray() -> None:
    text = render_sbatch(job_for("cuda", train_cmd="python3 -m verl.trainer.main_ppo "
                                 "trainer.nnodes=2 trainer.n_gpus_per_node=8 x.y=1",
                                 train_checker=checker_bytes()))
    services = _function(text, "stage_services")
    assert services.index("train_check") < services.index("start_ray")
    check = _function(text, "train_check")
    assert '"$VERL_ENV_JOB_DIR/incheck.pyz" --nnodes' in check and '--json "$out"' in check
    payload = re.search(r"<<'VERL_ENV_CHECKER'\n(.*?)\nVERL_ENV_CHECKER", text, re.S)
    assert payload and base64.b64decode(payload.group(1)) == checker_bytes()
    assert 'TRAIN_OVERRIDES=("trainer.nnodes=2" "trainer.n_gpus_per_node=8" "x.y=1")' in text
    assert "traincheck) echo 15" in text
    other = render_sbatch(job_for("cuda", train_cmd="python3 my_trainer.py"))
    assert "TRAIN_MAIN_PPO=0" in other
    assert "rendered without the checker" in other and "VERL_ENV_CHECKER" not in other


@pytest.mark.parametrize("have, cpus, ok", [("16", "24:57", True), ("0", "24:57", False),
                                           ("8", "24:57", False), ("16", "23:57", False),
                                           ("16", "24:56", False)])
def test_trainer_never_waits_for_what_ray_does_not_have(have: str, cpus: str, ok: bool) -> None:
    """verl 0.9.1 waits forever for GPUs Ray lacks, and for CPUs: each GPU's workers are placed
    as a bundle {CPU: 3, GPU: 1}, so 8 GPUs per node need 24 Ray CPUs on every node (found by
    the real-trainer Slurm test: 2-CPU nodes hung silently after verl printed its config)."""
    text = render_sbatch(job_for("cuda"))
    code = ("TRAIN_NNODES=2\nTRAIN_GPUS_PER_NODE=8\nVERL_CPUS_PER_GPU=3\nVERL_TQ_CPUS=9\n"
            "log() { echo \"$*\"; }\nfail() { echo \"FAIL $*\"; exit 1; }\n"
            f"ray_resources() {{ echo {have}:{cpus}; }}\n" + _function(text, "check_ray_gpus")
            + "\ncheck_ray_gpus")
    proc = subprocess.run(["bash", "-c", code], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"]})
    assert (proc.returncode == 0) == ok, proc.stdout
    if have != "16":
        assert (f"FAIL Ray counts {have} GPUs, the trainer needs trainer.nnodes x "
                "trainer.n_gpus_per_node = 2 x 8 = 16") in proc.stdout
    elif cpus.startswith("23"):
        assert ("FAIL a Ray node counts 23 CPUs; verl places each GPU's workers with 3 CPUs, so "
                "8 GPUs per node need 24") in proc.stdout
    elif not ok:
        assert "FAIL the Ray cluster counts 56 CPUs; verl needs 57 (3 per GPU, and 9" in proc.stdout
    assert 'VERL_CPUS_PER_GPU=3' in text


def test_logical_gpus_are_a_cpu_test_knob_only(tmp_path: Path) -> None:
    with pytest.raises(SlurmError, match="cpu test clusters only"):
        job_for("cuda", ray_logical_gpus=2)
    text = render_sbatch(job_for("cpu", runtime="ch-run", sif="/x", train_cmd="true",
                                 ray_logical_gpus=2))
    assert 'RAY_LOGICAL_GPUS="2"' in text
    assert '--num-gpus "${RAY_LOGICAL_GPUS:-$VERL_ENV_GPUS_PER_NODE}"' in text
    assert 'RAY_LOGICAL_GPUS=""' in render_sbatch(job_for("cuda"))  # never the default


@pytest.mark.parametrize("rc, expected", [
    (1, "FAIL(traincheck) verl rejects the training command (train check, /j/train-check.json): "
        "verl: [actor] Please set at least one of actor.ppo_micro_batch_size or"),
    (0, "train check: pass (configuration level"),
    (3, "warning: the train check could not run (exit 3"),
])
def test_train_check_result_is_the_jobs(rc: int, expected: str, tmp_path: Path) -> None:
    """The checker's verdict as the job reads it: a rejection fails the job at its own stage
    (exit 15) quoting verl; a pass says its level; a checker that could not run is a warning."""
    text = render_sbatch(job_for("cuda", train_cmd="python3 -m verl.trainer.main_ppo a=1",
                                 train_checker=b"print('checker')\n"))
    lines = ("  train check fail   config\\n    verl: [actor] Please set at least one of "
             "actor.ppo_micro_batch_size or actor.ppo_micro_batch_size_per_gpu\\n"
             "    fix: --override actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2")
    code = (f"VERL_ENV_JOB_DIR={tmp_path}\nTRAIN_MAIN_PPO=1\nTRAIN_NNODES=1\n"
            "TRAIN_GPUS_PER_NODE=8\nTRAIN_OVERRIDES=(a=1)\nHEAD=node1\nSTAGE=services\n"
            "log() { echo \"$*\"; }\nfail() { echo \"FAIL($STAGE) $*\"; exit 1; }\n"
            "cstep() { case $* in *incheck.pyz*) return " + str(rc) + " ;; "
            f"*) printf '{lines}\\n' ;; esac; }}\n"
            + _function(text, "train_check") + "\ntrain_check\necho \"after $STAGE\"")
    code = code.replace('"$VERL_ENV_JOB_DIR/train-check.json"', '"/j/train-check.json"')
    proc = subprocess.run(["bash", "-c", code], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"]})
    assert expected in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert (proc.returncode == 0) == (rc != 1)
    assert (tmp_path / "incheck.pyz").read_text() == "print('checker')\n"
    if rc != 1:
        assert "after services" in proc.stdout


def test_build_env_slurm_says_where_the_train_check_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Rendering never needs the image: without one at hand the script is written and the
    line says the job runs the check before Ray."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    out = tmp_path / "job.sh"
    assert main([*CUDA, "--output", str(out)]) == 0
    err = capsys.readouterr().err
    assert "train check: not run here (verl-env:cuda-x86_64: " in err
    assert "the job runs it on the head node before Ray" in err and out.exists()
    assert main([*CUDA, "--no-train-check"]) == 0
    assert "train check: not run here (--no-train-check)" in capsys.readouterr().err
    assert main([*CUDA, "--train-cmd", "python3 mine.py"]) == 0
    assert "not verl.trainer.main_ppo" in capsys.readouterr().err


def test_build_env_slurm_refuses_a_command_verl_rejects(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """With the image at hand, a rejected command writes nothing (exit 1) and prints verl's
    message and the fix. The engine and the checker's verdict are stand-ins here (the command's
    logic only); tests/train runs the real checker in the real image."""
    from builder.commands import slurm as command
    from builder.train.check import TrainCheck

    seen: dict[str, object] = {}

    class Image:
        id = "sha256:abc"

    def run_check(engine: object, image: str, argv: list[str], *, nnodes: int,
                  gpus_per_node: int) -> TrainCheck:
        seen.update(image=image, argv=argv, nnodes=nnodes, gpus=gpus_per_node)
        stage = {"name": "config", "status": "fail", "fix": "data.max_prompt_length=1024",
                 "message": "prompt longer than data.max_prompt_length"}
        return TrainCheck(image, "rejected", {"stages": [stage]}, 1.0, "", (stage,))

    monkeypatch.setattr(command._shared, "engine_image", lambda ref, t, e: (object(), Image()))
    monkeypatch.setattr(command.train_check, "run_check", run_check)
    out = tmp_path / "job.sh"
    assert main([*CUDA, "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert "verl: prompt longer than data.max_prompt_length" in err
    assert "--override data.max_prompt_length=1024" in err and "no script written" in err
    assert not out.exists()
    assert seen["nnodes"] == 2 and seen["gpus"] == 8 and seen["image"] == "sha256:abc"
    argv = seen["argv"]
    assert isinstance(argv, list) and ("trainer.default_local_dir="
                                       f"'{os.getcwd()}/verl-env-0/checkpoints'") in argv
    # ${SLURM_SUBMIT_DIR}: where sbatch runs, here; the job id is not known yet


@pytest.mark.parametrize("said", [
    # raised in verl's worker at init_model, as Ray prints it (tests/slurm/test_requeue.py)
    "ray::WorkerDict.actor_rollout_init_model() (pid=7, ip=127.0.0.1, actor_id=1)\n"
    "RuntimeError: Torch not compiled with CUDA enabled",
    # what verl 0.9.1's workers say in the real two-node test (init_model on a CPU torch)
    "ray::WorkerDict.actor_rollout_init_model() (pid=7, ip=127.0.0.1, actor_id=1)\n"
    "RuntimeError: Distributed package doesn't have NCCL built in"])
def test_gpu_boundary_is_its_own_result(tmp_path: Path, said: str) -> None:
    """A trainer that stops where a real GPU is needed (logical GPUs on a test cluster) ends
    the job with its own result line and exit 16, not "training failed"."""
    text = render_sbatch(job_for("cpu", runtime="ch-run", sif="/x", ray_logical_gpus=1,
                                 train_cmd="python3 -m verl.trainer.main_ppo a=1"))
    tlog = tmp_path / "training.log"
    code = (f"VERL_ENV_JOB_DIR={tmp_path}\nRAY_LOGICAL_GPUS=1\nTRAIN_MAIN_PPO=0\nHEAD=node1\n"
            "RAY_PIDS=()\nLOST=()\nSTAGE=setup\nNODES=(node1)\nTRAIN_NNODES=1\n"
            "TRAIN_GPUS_PER_NODE=1\nlog() { echo \"$*\"; }\n"
            + _function(text, "gpu_boundary") + "\n"
            + re.search(r"^GPU_FIRST_CALLS=.*$", text, re.M).group(0) + "\n"
            + _function(text, "stage_code") + "\n" + _function(text, "fail") + "\n"
            + "cleanup() { :; }\n" + _function(text, "on_exit") + "\ntrap on_exit EXIT\n"
            + "enter() { STAGE=$1; }\nwatch_step() { wait \"$1\"; }\n"
            + f"cstep() {{ echo {shlex.quote(said)} >{tlog}; "
            + "return 1; }\n" + re.search(r"^GPU_BOUNDARY=.*$", text, re.M).group(0) + "\n"
            + _function(text, "stage_training") + "\nstage_training")
    proc = subprocess.run(["bash", "-c", code], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"]})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 16, out
    assert "training stopped where a GPU is needed" in out
    assert "result: stopped at the GPU boundary (exit 16)" in out
    assert "training command exited" not in out
