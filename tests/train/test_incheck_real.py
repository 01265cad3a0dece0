"""The checker (builder/train/incheck, as its zip application) run for real with verl 0.9.1 on this host: the tiny
model and data, verl's own hydra composition, validate_config, dataset and reward code."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.train.conftest import RunChecker, make_tiny, tiny_command

STAGES = ["compose", "validate", "trainer", "model", "train_data", "val_data", "reward",
          "cluster", "gpu"]


@pytest.mark.parametrize("rollout,algorithm", [("vllm", "grpo"), ("sglang", "ppo")])
def test_default_command_passes_verl(run_checker: RunChecker, core_py: str, tiny: dict,
                                     rollout: str, algorithm: str) -> None:
    """Both rollout engines and both algorithms (two runs: each run costs half a minute)."""
    r = run_checker(core_py, tiny_command(tiny, rollout=rollout, algorithm=algorithm))
    assert r.code == 0, (r.report, r.stderr[-3000:])
    assert r.report["schema"] == "verl-env/train-check/v1"
    assert r.report["level"] == "config" and r.report["status"] == "pass"
    assert r.report["verl"] == "0.9.1"
    assert [s["name"] for s in r.report["stages"]] == STAGES
    assert "All configuration checks passed" in r.stage("validate")["verl_says"]
    assert r.stage("validate")["critic"] is (algorithm == "ppo")
    assert r.stage("model")["model_type"] == "qwen2"
    assert r.stage("train_data")["rows"] == 64 and r.stage("val_data")["rows"] == 16
    assert 0 < r.stage("train_data")["prompt_tokens"] <= 512
    assert r.stage("reward")["train_score_of_ground_truth"] == 1.0
    assert r.stage("cluster")["n_gpus"] == 2
    assert r.stage("gpu")["status"] == "stop" and "needs GPUs" in r.stage("gpu")["reason"]
    assert rollout in r.stage("trainer")["rollout"]


def test_main_command_shape_is_rejected_quoting_verl(run_checker: RunChecker, core_py: str,
                                                     tiny: dict) -> None:
    """The command main's slurm.py wrote (data, model, checkpoints, the cluster shape, nothing
    else): verl 0.9.1 refuses it before any GPU, and the check says which override fixes it."""
    words = [f"data.train_files={tiny['train']}", f"data.val_files={tiny['val']}",
             f"actor_rollout_ref.model.path={tiny['model']}",
             "trainer.default_local_dir=/tmp/ckpt", "trainer.nnodes=1",
             "trainer.n_gpus_per_node=2"]
    r = run_checker(core_py, words)
    assert r.code == 1 and r.report["status"] == "rejected"
    v = r.stage("validate")
    assert v["status"] == "fail"
    assert "Please set at least one of 'actor.ppo_micro_batch_size' or " \
           "'actor.ppo_micro_batch_size_per_gpu'" in v["message"]
    assert v["fix"].startswith("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=")


def test_each_stage_finds_its_fault(run_checker: RunChecker, core_py: str,
                                     tiny: dict) -> None:
    """One run, three independent faults: the micro batch removed (verl's validate_config),
    prompts over data.max_prompt_length (verl's dataset), a command for 1 x 2 GPUs in a job of
    2 x 2 (the cluster shape). Each stage quotes its finding and names the override."""
    words = tiny_command(tiny, overrides=[
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
        "data.max_prompt_length=16"])
    r = run_checker(core_py, words, nnodes=2, gpus_per_node=2)
    assert r.code == 1 and r.report["status"] == "rejected"
    assert r.failed() == ["validate", "train_data", "val_data", "cluster"]
    v = r.stage("validate")
    assert "[actor] Please set at least one of 'actor.ppo_micro_batch_size'" in v["message"]
    assert v["fix"] == "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"
    d = r.stage("train_data")
    assert "over data.max_prompt_length (16)" in d["message"]
    assert d["fix"] == "data.max_prompt_length=64"
    assert r.stage("reward")["status"] == "skip"
    c = r.stage("cluster")
    assert "trainer.nnodes=1 x trainer.n_gpus_per_node=2 but the job has 2 node(s)" in c["message"]
    assert c["fix"] == "trainer.nnodes=2 trainer.n_gpus_per_node=2"
    assert "gpu" not in [s["name"] for s in r.report["stages"]]


def test_an_engine_whose_rollout_code_does_not_import_is_rejected(
        run_checker: RunChecker, core_py: str, tiny: dict) -> None:
    """An installed engine (here: the catalogue maps vllm to a module this host has) is held to
    verl's own rollout code: get_rollout_class imports verl's vLLM ServerAdapter, which needs
    the vllm package; the trainer stage fails quoting that, instead of "installed"."""
    r = run_checker(core_py, tiny_command(tiny, rollout="vllm"), engines={"vllm": "json"})
    assert r.code == 1 and r.report["status"] == "rejected", r.report
    t = r.stage("trainer")
    assert t["status"] == "fail", t
    assert t["message"].startswith("actor_rollout_ref.rollout.name=vllm: verl's vllm rollout "
                                   "code does not import in this image: "), t
    # verl's words: its vllm_rollout finds no vllm version (a ValueError, not an ImportError)
    assert "vllm version None not supported" in t["message"], t
    assert t["fix"] == "an image whose vllm stack imports (build-env verify)"


def test_plain_verl_cannot_start_the_trainer(run_checker: RunChecker, plain_py: str,
                                             tiny: dict, tmp_path: Path) -> None:
    """verl 0.9.1 without its [verl-core] extra (the CPU fixture's pin): configuration passes,
    but main_ppo's trainer imports transfer_queue (v1) and cachetools (both): rejected there.
    The same run: rows whose data_source verl has no reward for, and a batch (4 x 8 GPUs x 4
    prompts = 128) larger than the 64 train rows."""
    out = make_tiny(plain_py, "--data", str(tmp_path / "d"), "--data-source", "acme/unknown")
    words = tiny_command({**tiny, "train": out["data"]["train"], "val": out["data"]["test"]},
                         nnodes=4, gpus_per_node=8)
    r = run_checker(plain_py, words, nnodes=4, gpus_per_node=8)
    assert r.code == 1 and r.failed() == ["trainer", "reward", "cluster"]
    assert r.stage("validate")["status"] == "pass"
    t = r.stage("trainer")
    assert "No module named 'transfer_queue'" in t["message"] and "verl-core" in t["fix"]
    rw = r.stage("reward")
    assert "acme/unknown" in rw["message"] and "custom_reward_function.path" in rw["fix"]
    c = r.stage("cluster")
    assert "data.train_batch_size (128) is more than the 64 train rows" in c["message"]
    assert c["fix"].startswith("data.train_batch_size=64")


def test_no_verl_could_not_run(run_checker: RunChecker, tiny: dict) -> None:
    """A python without verl: exit 3 and status error, never a pass or a rejection."""
    r = run_checker(sys.executable, tiny_command(tiny))
    assert r.code == 3 and r.report["status"] == "error"
    assert "verl is not importable" in r.report["error"]


def test_megatron_command_passes_verls_configuration_checks(run_checker: RunChecker,
                                                            core_py: str, tiny: dict) -> None:
    """Issue 39 item 4: a Megatron target's default command (verl's ppo_megatron_trainer, the
    actor's tensor/pipeline sizes from --tp/--pp) composes in verl 0.9.1's own hydra config and
    passes its validate_config, whose Megatron branch counts dp = GPUs / (tp x pp)."""
    words = tiny_command(tiny, layer="megatron", tp=1, pp=2)
    assert words[0] == "--config-name=ppo_megatron_trainer"
    r = run_checker(core_py, words)
    assert r.stage("compose")["status"] == "pass", r.stage("compose")
    assert r.stage("compose")["config_name"] == "ppo_megatron_trainer"
    assert r.stage("validate")["status"] == "pass", r.stage("validate")
    assert "All configuration checks passed" in r.stage("validate")["verl_says"]
    assert r.stage("cluster")["status"] == "pass", r.stage("cluster")


def test_paths_hydra_needs_quoted_reach_verl_as_given(run_checker: RunChecker, core_py: str,
                                                      tiny: dict, tmp_path: Path) -> None:
    """Issue 39 item 3: `--data "/data/my data,v2"` (and a quote and '=' in the model's path):
    unquoted, verl's hydra read the comma as a sweep and refused it; the default command quotes
    them, and verl's composition, dataset and model stages read the files at those paths."""
    import shutil

    data = tmp_path / "my data,v2"
    model = tmp_path / "it's=model"
    data.mkdir()
    shutil.copy(tiny["train"], data / "train.parquet")
    shutil.copy(tiny["val"], data / "test.parquet")
    shutil.copytree(tiny["model"], model)
    words = tiny_command({"model": str(model), "train": str(data / "train.parquet"),
                          "val": str(data / "test.parquet")})
    r = run_checker(core_py, words)
    assert r.code == 0, (r.report, r.stderr[-3000:])
    for stage in ("compose", "validate", "model", "train_data", "val_data", "cluster"):
        assert r.stage(stage)["status"] == "pass", r.stage(stage)
    assert r.stage("train_data")["rows"] == 64
