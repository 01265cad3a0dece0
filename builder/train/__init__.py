"""The training stage's command and its check: :mod:`builder.train.shapes` (the default
``verl.trainer.main_ppo`` command as data keyed by the verl version), ``incheck.py`` (the
checker that runs inside the image with the image's verl) and :mod:`builder.train.check` (the
host side: run the checker through the engine, read its verdict). docs/train-check.md."""

from __future__ import annotations

from pathlib import Path

from builder.train.shapes import (TrainShapeError, default_command, hydra_overrides, logger_env,
                                  parse_override, target_rollout, target_verl)

CHECKER = Path(__file__).resolve().parent / "incheck.py"
SCHEMA = "verl-env/train-check/v1"


def checker_path() -> Path:
    """The in-image checker, one Python file: ``python3 incheck.py --nnodes N --gpus-per-node G
    -- <the main_ppo hydra overrides>`` prints one JSON verdict (exit 0 pass, 1 rejected, 3
    could not run)."""
    return CHECKER


__all__ = ["CHECKER", "SCHEMA", "TrainShapeError", "checker_path", "default_command",
           "hydra_overrides", "logger_env", "parse_override", "target_rollout", "target_verl"]
