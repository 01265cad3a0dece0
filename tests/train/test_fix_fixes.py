"""Issue 39 item 5: the train check's suggested overrides fix what they name. The checker's
cluster stage and its rule for verl's "train_batch_size must be >= ppo_mini_batch_size" run on
a configuration made from the default command (builder.train.shapes); the fix is applied and
the same stage run again: it passes, and the fixed sizes meet verl's batch rules as
builder.train.shapes holds them (check_batches), an implementation apart from the checker's."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import pytest

from builder.train import default_command, shapes
from builder.train.incheck import args as cli
from builder.train.incheck import rules, stages

PATHS = {"model": "/m", "train_files": "/d/train.parquet", "val_files": "/d/test.parquet"}


class Node(SimpleNamespace):
    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


def config(argv: list[str]) -> Node:
    """The namespace of a command's ``key=value`` overrides (numbers as ints)."""
    root = Node()
    for word in argv[3:]:
        key, _, value = word.lstrip("+").partition("=")
        *parents, leaf = key.split(".")
        node = root
        for p in parents:
            node = node.__dict__.setdefault(p, Node())
        setattr(node, leaf, int(value) if value.isdigit() else value)
    return root


def apply(cfg: Node, fix: str) -> None:
    for word in fix.split(" "):
        key, _, value = word.partition("=")
        *parents, leaf = key.split(".")
        node = cfg
        for p in parents:
            node = getattr(node, p)
        setattr(node, leaf, int(value))


def cluster(cfg: Node, nnodes: int, gpus: int, rows: int) -> dict[str, Any]:
    args = cli.Args(nnodes=nnodes, gpus_per_node=gpus)
    check = stages.Check(args, stages.Tee(io.StringIO()), "/nonexistent")
    check.cfg, check.rows_count = cfg, {"train": rows}
    return check.cluster()


def verl_rules_hold(cfg: Node, n_gpus: int, megatron: int = 0) -> None:
    a = cfg.actor_rollout_ref.actor
    b = shapes.Batches(n_gpus, cfg.data.train_batch_size, a.ppo_mini_batch_size,
                       a.ppo_micro_batch_size_per_gpu, cfg.actor_rollout_ref.rollout.n,
                       n_gpus // megatron if megatron else n_gpus, megatron > 0)
    shapes.check_batches(b)
    assert b.mini_batch_size <= b.train_batch_size


@pytest.mark.parametrize("nnodes, gpus, rows, algorithm", [
    (16, 8, 64, "grpo"),  # the case: 128 was suggested, more than the 64 rows
    (16, 8, 300, "ppo"), (2, 8, 50, "grpo"), (1, 8, 31, "grpo"), (4, 8, 96, "ppo")])
def test_the_rows_fix_passes_the_same_check(nnodes: int, gpus: int, rows: int,
                                            algorithm: str) -> None:
    cfg = config(default_command("0.9.1", rollout="vllm", nnodes=nnodes, gpus_per_node=gpus,
                                 algorithm=algorithm, **PATHS))
    with pytest.raises(rules.Rejected) as err:
        cluster(cfg, nnodes, gpus, rows)
    fix = err.value.fix
    assert fix and fix.startswith("data.train_batch_size="), fix
    apply(cfg, fix)
    out = cluster(cfg, nnodes, gpus, rows)  # the same check, with the fix applied
    assert out["train_batch_size"] <= rows and out["steps_per_epoch"] >= 1
    verl_rules_hold(cfg, nnodes * gpus)


def test_too_few_rows_for_any_batch_says_how_many() -> None:
    """16 x 8 GPUs with GRPO's 4 responses: the smallest batch verl takes is 64 prompts."""
    cfg = config(default_command("0.9.1", rollout="vllm", nnodes=16, gpus_per_node=8,
                                 **PATHS))
    with pytest.raises(rules.Rejected) as err:
        cluster(cfg, 16, 8, 40)
    assert err.value.fix == "at least 64 train rows (this cluster shape's smallest batch)"


def test_the_mini_batch_fix_passes_verls_rules() -> None:
    """verl's "train_batch_size (128) must be >= actor.ppo_mini_batch_size (256)" (the second
    failure of the issue's case): the fix keeps every batch rule."""
    cfg = config(default_command("0.9.1", rollout="vllm", nnodes=16, gpus_per_node=8,
                                 **PATHS))
    cfg.data.train_batch_size = 128
    fix = rules.fix_for("train_batch_size (128) must be >= actor.ppo_mini_batch_size (256)",
                          cfg)
    assert fix and fix.startswith("data.train_batch_size=128 "), fix
    apply(cfg, fix)
    verl_rules_hold(cfg, 128)


def test_megatron_fix_counts_its_data_parallel_size() -> None:
    argv = default_command("0.9.1", rollout="vllm", nnodes=2, gpus_per_node=8, tp=2, pp=2,
                           layer="megatron", **PATHS)
    cfg = config(argv)
    cfg.actor_rollout_ref.actor.strategy = "megatron"  # verl's ppo_megatron_trainer says so
    with pytest.raises(rules.Rejected) as err:
        cluster(cfg, 2, 8, 30)
    apply(cfg, err.value.fix)
    assert cluster(cfg, 2, 8, 30)["train_batch_size"] <= 30
    verl_rules_hold(cfg, 16, megatron=4)


def test_fix_is_typed_as_one_override_each() -> None:
    from builder.train.check import fix_options

    assert fix_options("data.train_batch_size=64 actor_rollout_ref.actor.ppo_mini_batch_size=64"
                       ) == ("--override data.train_batch_size=64 --override "
                             "actor_rollout_ref.actor.ppo_mini_batch_size=64")
    assert fix_options("at least 64 train rows") == "at least 64 train rows"
