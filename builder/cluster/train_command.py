"""The Slurm job's default training command: ``builder.train``'s command for the verl version
the target pins (rollout engine from the target, batch sizes from nodes x GPUs per node), the
checkpoint directory and the family's trainer overrides, the user's ``--override`` last.

Pure: the matrix target comes in typed; nothing here reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.errors import SlurmError
from builder.matrix.families import FAMILIES
from builder.cluster.job import Inputs, quote_keep_vars
from builder.matrix.spec import Target
from builder.train import (TrainShapeError, checker_path, default_command, logger_env,
                           target_rollout, target_verl)


@dataclass(frozen=True)
class TrainChoice:
    """What the user chose of the default command (``build-env slurm`` options)."""

    nodes: int | None
    gpus_per_node: int | None
    tp: int = 1
    algorithm: str = "grpo"
    loggers: tuple[str, ...] = ("console",)
    overrides: tuple[str, ...] = ()


def default_train_cmd(target: Target, family: str, inputs: Inputs,
                      choice: TrainChoice) -> tuple[str, tuple[str, ...]]:
    """(the training command as one shell line, the variables its loggers need by name)."""
    missing = inputs.missing_for_trainer()
    if choice.nodes is None:
        missing.append("--nodes")
    if not choice.gpus_per_node:
        missing.append("--gpus-per-node")
    if missing:
        raise SlurmError("the default training command (verl.trainer.main_ppo; its batch sizes "
                         f"follow nodes x GPUs per node) needs {' and '.join(missing)}; or "
                         "pass your own --train-cmd")
    assert inputs.model and inputs.train_files and inputs.val_files
    family_overrides = FAMILIES[family].trainer_overrides
    try:
        verl = target_verl(target)
        argv = default_command(
            verl, rollout=target_rollout(target), nnodes=choice.nodes or 1,
            gpus_per_node=choice.gpus_per_node or 1, tp=choice.tp,
            algorithm=choice.algorithm, loggers=choice.loggers, model=inputs.model,
            train_files=inputs.train_files, val_files=inputs.val_files,
            overrides=(f"trainer.default_local_dir={inputs.checkpoint_dir}",
                       *family_overrides, *choice.overrides))
        names = tuple(logger_env(verl, choice.loggers))
    except TrainShapeError as exc:
        raise SlurmError(exc.args[0]) from None  # the message, without its stage prefix
    return " ".join(quote_keep_vars(w) for w in argv), names


def checker_bytes() -> bytes:
    """The in-image train checker the job writes into its directory and runs before Ray."""
    return checker_path().read_bytes()
