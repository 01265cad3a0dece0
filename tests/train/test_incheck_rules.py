"""The checker's pure parts (builder/train/incheck.py imports only the standard library at its
top): its command line, and the rules that turn verl's messages into the override that fixes
them. The messages are verl 0.9.1's own (verl/utils/config.py, verl/workers/config/actor.py)."""

from __future__ import annotations

import importlib.util
import sys
from types import SimpleNamespace

import pytest

from builder.train import checker_path

spec = importlib.util.spec_from_file_location("verl_env_incheck", checker_path())
incheck = importlib.util.module_from_spec(spec)
sys.modules.setdefault("verl_env_incheck", incheck)  # dataclasses look their module up
spec.loader.exec_module(incheck)  # type: ignore[union-attr]

CFG = SimpleNamespace(
    trainer=SimpleNamespace(nnodes=2, n_gpus_per_node=8),
    actor_rollout_ref=SimpleNamespace(actor=SimpleNamespace(ppo_mini_batch_size=32),
                                      rollout=SimpleNamespace(n=4)),
    data=SimpleNamespace(train_batch_size=60))


@pytest.mark.parametrize("message,fix", [
    ("[actor] Please set at least one of 'actor.ppo_micro_batch_size' or "
     "'actor.ppo_micro_batch_size_per_gpu' if use_dynamic_bsz is not enabled.",
     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"),
    ("[actor_rollout_ref.rollout] Please set at least one of "
     "'actor_rollout_ref.rollout.log_prob_micro_batch_size' or "
     "'actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu'.",
     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2"),
    ("[actor] You have set both 'actor.ppo_micro_batch_size' AND "
     "'actor.ppo_micro_batch_size_per_gpu'.", "actor_rollout_ref.actor.ppo_micro_batch_size=null"),
    ("real_train_batch_size (240) must be divisible by minimal possible batch size (16)",
     "data.train_batch_size=64"),
    ("Missing mandatory value: actor_rollout_ref.rollout.name",
     "actor_rollout_ref.rollout.name=VALUE"),
])
def test_verls_messages_name_their_fix(message: str, fix: str) -> None:
    assert incheck.fix_for(message, CFG) == fix


def test_no_rule_no_fix() -> None:
    assert incheck.fix_for("something verl never said", CFG) is None


def test_root_message_unwraps_hydra() -> None:
    try:
        try:
            raise AssertionError("[actor] Please set at least one of ...")
        except AssertionError as inner:
            raise RuntimeError("Error in call to target 'FSDPActorConfig'") from inner
    except RuntimeError as outer:
        assert incheck.root_message(outer) == "[actor] Please set at least one of ..."


def test_command_line() -> None:
    a = incheck.parse(["--nnodes", "2", "--gpus-per-node", "8", "--", "a=1", "--b"])
    assert (a.nnodes, a.gpus_per_node, a.overrides) == (2, 8, ["a=1", "--b"])
    for bad in (["--nnodes", "2"], ["--nnodes", "x", "--gpus-per-node", "1"],
                ["--nnodes", "1", "--gpus-per-node", "1", "--what", "x"]):
        with pytest.raises(SystemExit) as err:
            incheck.parse(bad)
        assert err.value.code == 2
