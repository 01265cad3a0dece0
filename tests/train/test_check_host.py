"""The train check's host side (builder/train/check.py) and its command: what goes into the
container, how the checker's report is read, the one-line errors. The engine is a fake here
(pure logic); tests/train/test_train_check_docker.py runs the real one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from builder.cli import main
from builder.engine import ContainerEngine
from builder.engine.results import RunResult
from builder.errors import InfraError
from builder.train import CHECKER_NAME, check, checker_bytes
from builder.train.shapes import engine_args

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "cpu.yaml"


def argv(inputs: dict[str, Path], *extra: str) -> list[str]:
    return ["python3", "-m", "verl.trainer.main_ppo",
            f"data.train_files={inputs['data'] / 'train.parquet'}",
            f"data.val_files=[{inputs['data'] / 'test.parquet'}]",
            f"actor_rollout_ref.model.path={inputs['model']}", *extra]


class FakeEngine(ContainerEngine):
    """Answers run() with a canned report; keeps what it was asked."""

    def __init__(self, report: dict[str, Any] | None, code: int | None) -> None:
        self.report, self.code, self.calls = report, code, []

    def run(self, image, command, **kw):  # type: ignore[override]
        self.calls.append({"image": image, "command": list(command), **kw})
        files = {check.REPORT: json.dumps(self.report).encode()} if self.report else {}
        return RunResult(self.code, "some logs", 12.5, files)


def report(status: str, stages: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"schema": check.SCHEMA, "level": "config", "status": status,
            "stages": stages or []}


def test_data_and_model_paths_of_a_command(inputs: dict[str, Path]) -> None:
    words = argv(inputs, "data.train_files=/x/a.parquet")
    assert check.data_files(words) == ["/x/a.parquet", str(inputs["data"] / "test.parquet")]
    assert check.model_path(words) == str(inputs["model"])


def test_inputs_carry_config_and_tokenizer_never_weights(inputs: dict[str, Path]) -> None:
    files = check.inputs(argv(inputs))
    assert str(inputs["model"] / "config.json") in files
    assert str(inputs["model"] / "tokenizer.json") in files
    assert str(inputs["model"] / "model.safetensors") not in files
    assert files[str(inputs["data"] / "train.parquet")] == b"PAR1"


def test_missing_inputs_are_bad_input(inputs: dict[str, Path]) -> None:
    with pytest.raises(check.TrainCheckError, match="no such file"):
        check.inputs(argv(inputs, "data.val_files=/nope/test.parquet"))
    with pytest.raises(check.TrainCheckError, match="no such directory"):
        check.inputs(argv(inputs, "actor_rollout_ref.model.path=/nope"))


def test_run_check_sends_the_checker_and_reads_its_verdict(inputs: dict[str, Path]) -> None:
    stages = [{"name": "validate", "status": "fail", "message": "[actor] Please set ...",
               "fix": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"}]
    engine = FakeEngine(report("rejected", stages), 1)
    result = check.run_check(engine, "img", argv(inputs), nnodes=2, gpus_per_node=4)
    call = engine.calls[0]
    assert call["network"] == "none" and call.get("gpus") is None
    assert call["files"][f"{check.IN_DIR}/{CHECKER_NAME}"] == checker_bytes()
    assert call["command"][:6] == ["--nnodes", "2", "--gpus-per-node", "4", "--json",
                                   check.REPORT]
    # the rollout engines' modules, from the host's catalogue (the checker cannot read it)
    engines = engine_args()
    assert call["command"][6:6 + len(engines)] == engines and "vllm=vllm" in engines
    rest = call["command"][6 + len(engines):]
    assert rest[0] == "--" and rest[1].startswith("data.train_files=")
    assert result.status == "rejected" and result.exit_code == 1
    lines = check.summary_lines(result)
    assert "never GPU-proven" in lines[0]
    assert "verl: [actor] Please set ..." in "\n".join(lines)
    assert "fix:  --override actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2" in \
        "\n".join(lines)


@pytest.mark.parametrize("rep,code,words", [
    (None, 1, "wrote no report"),
    (report("pass"), None, "was killed"),
    (report("pass"), 1, "said pass but exited 1"),
    ({"schema": "other", "status": "pass"}, 0, "wrote no report"),
])
def test_a_checker_that_did_not_answer_is_infrastructure(inputs: dict[str, Path], rep, code,
                                                         words) -> None:
    with pytest.raises(InfraError, match=words) as err:
        check.run_check(FakeEngine(rep, code), "img", argv(inputs), nnodes=1, gpus_per_node=1)
    assert err.value.exit_code == 3


def test_cli_prints_the_command_without_an_image(inputs: dict[str, Path],
                                                 capsys: pytest.CaptureFixture) -> None:
    code = main(["train-check", "--target", "cpu-x86_64", "--matrix", str(FIXTURE),
                 "--model", str(inputs["model"]), "--data", str(inputs["data"]), "--nodes", "2",
                 "--gpus-per-node", "4", "--logger", "console", "--logger", "wandb",
                 "--override", "trainer.total_epochs=1", "--print-command"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo ")
    assert "trainer.nnodes=2 trainer.n_gpus_per_node=4 data.train_batch_size=32" in out
    assert "'trainer.logger=[console,wandb]'" in out and out.rstrip().endswith(
        "trainer.total_epochs=1")


@pytest.mark.parametrize("extra,words", [
    (["--override", "oops"], "--override 'oops': expected KEY=VALUE"),
    (["--verl", "0.10.0"], "no default training command for verl '0.10.0'"),
    (["--tp", "3"], "--tp 3 does not divide the 8 GPUs"),
])
def test_cli_bad_input_is_one_line_exit_2(inputs: dict[str, Path], extra: list[str],
                                          words: str, capsys: pytest.CaptureFixture) -> None:
    code = main(["train-check", "--target", "cpu-x86_64", "--matrix", str(FIXTURE),
                 "--model", str(inputs["model"]), "--data", str(inputs["data"]),
                 "--print-command", *extra])
    err = capsys.readouterr().err
    assert code == 2 and words in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_cli_refuses_a_hub_model_id(inputs: dict[str, Path],
                                    capsys: pytest.CaptureFixture) -> None:
    code = main(["train-check", "--target", "cpu-x86_64", "--matrix", str(FIXTURE),
                 "--model", "Qwen/Qwen2.5-0.5B", "--data", str(inputs["data"])])
    assert code == 2 and "local model directory" in capsys.readouterr().err


def test_cli_megatron_target_checks_verls_megatron_trainer(inputs: dict[str, Path],
                                                           capsys: pytest.CaptureFixture) -> None:
    """Issue 39 item 4: a Megatron target's command is verl's Megatron trainer configuration,
    tensor/pipeline sizes from --tp/--pp (what the check then runs verl's checks on)."""
    code = main(["train-check", "--target", "cuda-x86_64-megatron", "--matrix",
                 str(REPO / "matrix.yaml"), "--model", str(inputs["model"]), "--data",
                 str(inputs["data"]), "--nodes", "2", "--gpus-per-node", "8", "--tp", "2",
                 "--pp", "2", "--print-command"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer "
                          "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 "
                          "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 ")
    code = main(["train-check", "--target", "cuda-x86_64-megatron", "--matrix",
                 str(REPO / "matrix.yaml"), "--model", str(inputs["model"]), "--data",
                 str(inputs["data"]), "--nodes", "1", "--gpus-per-node", "8", "--tp", "4",
                 "--pp", "4", "--print-command"])
    assert code == 2 and "--tp 4 x --pp 4 = 16 does not divide the 8 GPUs" in (
        capsys.readouterr().err)
