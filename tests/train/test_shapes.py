"""The default training command as data (builder/train/shapes.py, verl_commands.yaml): pure."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

from builder.errors import BuildEnvError
from builder.matrix.spec import load_matrix
from builder.train import default_command, logger_env, shapes
from builder.train.shapes import TrainShapeError

REPO = Path(__file__).resolve().parents[2]
PATHS = {"model": "/m/qwen", "train_files": "/d/train.parquet", "val_files": "/d/test.parquet"}


def cmd(**kw) -> list[str]:
    return default_command("0.9.1", **{"rollout": "vllm", "nnodes": 2, "gpus_per_node": 8,
                                       **PATHS, **kw})


def values(argv: list[str]) -> dict[str, str]:
    """key -> value, the last one winning (as hydra)."""
    return dict(w.split("=", 1) for w in argv[3:] if "=" in w)


def test_default_is_grpo_on_main_ppo_with_console_logging() -> None:
    argv = cmd()
    assert argv[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    v = values(argv)
    assert v["algorithm.adv_estimator"] == "grpo"
    assert v["actor_rollout_ref.rollout.name"] == "vllm"
    assert v["trainer.logger"] == "[console]"
    assert v["trainer.nnodes"] == "2" and v["trainer.n_gpus_per_node"] == "8"
    assert v["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "1"
    assert v["data.train_files"] == "/d/train.parquet"
    assert v["data.val_files"] == "/d/test.parquet"
    assert v["actor_rollout_ref.model.path"] == "/m/qwen"
    assert "critic.model.path" not in v


def test_batch_sizes_follow_nodes_times_gpus() -> None:
    """train batch = 4 prompts per GPU, two mini-batches per step, micro batch 2 per GPU."""
    v = values(cmd(nnodes=2, gpus_per_node=8))
    assert v["data.train_batch_size"] == "64"
    assert v["actor_rollout_ref.actor.ppo_mini_batch_size"] == "32"
    for k in ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
              "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"):
        assert v[k] == "2"
    assert values(cmd(nnodes=1, gpus_per_node=1))["data.train_batch_size"] == "4"


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_every_shape_meets_verls_batch_rules(algorithm: str) -> None:
    shape = shapes.shape_for("0.9.1")
    for nnodes, gpus in itertools.product(range(1, 17), range(1, 9)):
        b = shapes.batches(shape, algorithm=algorithm, nnodes=nnodes, gpus_per_node=gpus)
        shapes.check_batches(b)
        assert b.train_batch_size >= b.mini_batch_size


def test_check_batches_refuses_what_verl_refuses() -> None:
    with pytest.raises(TrainShapeError, match="not divisible by verl's minimal batch 3"):
        shapes.check_batches(shapes.Batches(3, 4, 2, 2, 1))
    with pytest.raises(TrainShapeError, match="positive multiple of the micro batch 2"):
        shapes.check_batches(shapes.Batches(4, 4, 4, 2, 1))


def test_ppo_is_gae_with_a_critic_on_the_same_model() -> None:
    v = values(cmd(algorithm="ppo"))
    assert v["algorithm.adv_estimator"] == "gae"
    assert v["critic.model.path"] == "/m/qwen"
    assert v["critic.ppo_micro_batch_size_per_gpu"] == "2"
    assert v["actor_rollout_ref.rollout.n"] == "1"


def test_rollout_and_tp_are_flags() -> None:
    v = values(cmd(rollout="sglang", tp=4))
    assert v["actor_rollout_ref.rollout.name"] == "sglang"
    assert v["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "4"
    with pytest.raises(TrainShapeError, match="--tp 3 does not divide the 16"):
        cmd(tp=3)
    with pytest.raises(TrainShapeError, match="unknown rollout engine 'hf'"):
        cmd(rollout="hf")
    with pytest.raises(TrainShapeError, match="unknown algorithm 'dpo'"):
        cmd(algorithm="dpo")
    with pytest.raises(TrainShapeError, match="--nodes must be a whole number >= 1"):
        cmd(nnodes=0)


def test_overrides_come_last_and_are_validated() -> None:
    argv = cmd(overrides=["data.max_prompt_length=1024", "+trainer.new_key=1",
                          "~trainer.val_before_train"])
    assert argv[-3:] == ["data.max_prompt_length=1024", "+trainer.new_key=1",
                         "~trainer.val_before_train"]
    assert values(argv)["data.max_prompt_length"] == "1024"
    for bad in ("noequals", "=value", "a..b=1", "a.b=1\nrm -rf /"):
        with pytest.raises(TrainShapeError, match="--override"):
            cmd(overrides=[bad])
    assert shapes.parse_override("a.b_c=[x,y]") == ("a.b_c", "a.b_c=[x,y]")


def test_loggers_and_their_keys_by_name() -> None:
    assert values(cmd(loggers=("console", "wandb")))["trainer.logger"] == "[console,wandb]"
    assert logger_env("0.9.1", ["console", "wandb"]) == ["WANDB_API_KEY"]
    assert logger_env("0.9.1", ["console"]) == []
    with pytest.raises(TrainShapeError, match="unknown logger 'splunk'"):
        cmd(loggers=("splunk",))


def test_unknown_verl_version_names_itself_and_the_file() -> None:
    with pytest.raises(TrainShapeError) as err:
        default_command("0.10.0", rollout="vllm", nnodes=1, gpus_per_node=1, **PATHS)
    text = str(err.value)
    assert "verl '0.10.0'" in text and "verl_commands.yaml" in text and "0.9.1" in text
    assert isinstance(err.value, BuildEnvError) and err.value.exit_code == 2
    assert shapes.shape_for("0.9.1+local") is shapes.shape_for("0.9.1")


def test_every_pinned_verl_has_a_command_shape() -> None:
    """The next verl release in the matrix is a data change: its entry must exist."""
    for matrix in (REPO / "matrix.yaml", REPO / "tests" / "fixtures" / "cpu.yaml"):
        for target in load_matrix(matrix).targets.values():
            assert shapes.target_verl(target) in shapes.known_versions(), target.name


def test_rollout_follows_the_target() -> None:
    m = load_matrix(REPO / "matrix.yaml")
    for target in m.targets.values():
        engine = target.engine
        assert shapes.target_rollout(target) == (engine.name if engine else "vllm")
    cpu = load_matrix(REPO / "tests" / "fixtures" / "cpu.yaml").target("cpu-x86_64")
    assert shapes.target_rollout(cpu) == "vllm"


def test_image_labels_name_verl_and_the_engine() -> None:
    labels = {"org.verl-env.pin.verl": "0.9.1", "org.verl-env.provided.vllm": "0.24.0"}
    assert shapes.label_pin(labels, "verl") == "0.9.1"
    assert shapes.label_rollout(labels) == "vllm"
    assert shapes.label_rollout({"org.verl-env.pin.sglang": "0.5.0 (source)"}) == "sglang"
    assert shapes.label_rollout({}) is None


def test_data_file_is_well_formed() -> None:
    data = yaml.safe_load(shapes.DATA.read_text())
    for version, shape in data["verl"].items():
        assert set(shape["algorithms"]) == set(shapes.ALGORITHMS), version
        assert set(shape["rollouts"]) <= set(shapes.ROLLOUTS), version
        assert "console" in shape["loggers"], version
