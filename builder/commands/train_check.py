"""``build-env train-check``: verl's own configuration checks of the default training command
(or a user's overrides of it), run inside the image without GPUs (:mod:`builder.train`,
docs/train-check.md). A configuration check: never read as GPU-proven."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from builder.argtypes import positive_float, positive_int
from builder.commands import _shared
from builder.cluster.inputs import Inputs, is_model_path
from builder.matrix.spec import load_matrix
from builder.train import check as lib
from builder.train import shapes

NAME = "train-check"
HELP = "run verl's configuration checks of the training command in the image, without GPUs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--target", help="check in the release image of this matrix target")
    src.add_argument("--image", metavar="REF", help="check in this image (reference or ID)")
    p.add_argument("--tag-prefix", default="verl-env", metavar="REPO",
                   help="repository of the local release tags (default: verl-env)")
    io = p.add_argument_group("what the trainer reads")
    io.add_argument("--model", required=True, metavar="DIR",
                    help="the model directory (its config and tokenizer are read, not its "
                         "weights)")
    io.add_argument("--data", default=None, metavar="DIR",
                    help="directory holding train.parquet and test.parquet")
    io.add_argument("--train-files", default=None, metavar="PATH", help="training parquet file")
    io.add_argument("--val-files", default=None, metavar="PATH", help="validation parquet file")
    shape_options(p)
    p.add_argument("--timeout", type=positive_float, default=300, metavar="SECONDS",
                   help="seconds before the check's container is killed (default 300)")
    p.add_argument("--print-command", action="store_true",
                   help="print the training command and stop (no image needed)")
    _shared.json_flag(p, "the checker's report")


def shape_options(p: argparse.ArgumentParser) -> None:
    """The default command's options (the Slurm job offers the same)."""
    g = p.add_argument_group("the training command (docs/train-check.md)")
    g.add_argument("--nodes", type=positive_int, default=1, metavar="N", help="nodes (default 1)")
    g.add_argument("--gpus-per-node", type=positive_int, default=8, metavar="G",
                   help="GPUs per node (default 8)")
    g.add_argument("--tp", type=positive_int, default=1, metavar="K",
                   help="the rollout's tensor-parallel size (default 1)")
    g.add_argument("--pp", type=positive_int, default=1, metavar="P",
                   help="the actor's pipeline-parallel size on a target whose stack layer has "
                        "its own trainer configuration (default 1; tp x pp "
                        "must divide nodes x GPUs per node)")
    g.add_argument("--algorithm", choices=shapes.ALGORITHMS, default="grpo",
                   help="grpo (default) or ppo (GAE with a critic)")
    g.add_argument("--rollout", choices=shapes.ROLLOUTS, default=None,
                   help="rollout engine (default: the target's or the image's)")
    g.add_argument("--logger", action="append", default=None, metavar="NAME",
                   help="trainer logger, repeatable (default: console); wandb's key "
                        "(WANDB_API_KEY) then passes by name")
    g.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="a hydra override layered last, repeatable")
    g.add_argument("--verl", default=None, metavar="VERSION",
                   help="the verl version whose command shape to use (default: the target's "
                        "pin, or the image's label)")


def run(args: argparse.Namespace) -> int:
    inputs = Inputs.from_options(data=args.data, train_files=args.train_files,
                                 val_files=args.val_files, model=args.model)
    if not is_model_path(args.model):
        raise lib.TrainCheckError(f"--model {args.model}: the check reads a local model "
                                  "directory (a hub id cannot be read without network)")
    missing = [m for m in inputs.missing_for_trainer() if "--model" not in m]
    if missing:
        raise lib.TrainCheckError(f"the training command needs {' and '.join(missing)}")
    ref, target = _shared.verified_source(args)
    verl, rollout, layer = args.verl, args.rollout, None
    if target is not None:
        t = load_matrix(args.matrix).target(target)
        verl, rollout = verl or shapes.target_verl(t), rollout or shapes.target_rollout(t)
        layer = shapes.target_layer(t)
    if args.print_command and verl and rollout:
        print(shlex.join(_argv(args, inputs, verl, rollout, layer)))
        return 0
    engine, image = _shared.engine_image(ref, target, lib.TrainCheckError)
    verl = verl or shapes.label_pin(image.labels, "verl")
    if verl is None:
        raise lib.TrainCheckError(f"{ref}: its labels name no verl pin; give --verl VERSION")
    argv = _argv(args, inputs, verl, rollout or shapes.label_rollout(image.labels)
                 or shapes.default_rollout(), layer)
    if args.print_command:
        print(shlex.join(argv))
        return 0
    with _shared.progress(args, f"train check in {ref}"):
        result = lib.run_check(engine, image.id, argv, nnodes=args.nodes,
                               gpus_per_node=args.gpus_per_node, timeout=args.timeout)
    if args.json:
        print(json.dumps({**result.report, "image": ref, "command": argv}, indent=2))
    else:
        for line in lib.summary_lines(result):
            print(line, file=sys.stdout)
    return result.exit_code


def _argv(args: argparse.Namespace, inputs: Inputs, verl: str, rollout: str,
          layer: str | None) -> list[str]:
    """The default command (a Megatron target's on verl's Megatron trainer configuration)."""
    return shapes.default_command(
        verl, rollout=rollout, nnodes=args.nodes, gpus_per_node=args.gpus_per_node, tp=args.tp,
        pp=args.pp, layer=layer, algorithm=args.algorithm, loggers=tuple(args.logger or ("console",)),
        model=str(inputs.model), train_files=str(inputs.train_files),
        val_files=str(inputs.val_files), overrides=args.override)
