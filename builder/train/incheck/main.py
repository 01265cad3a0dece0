"""verl-env train check: verl's own checks of one training command, inside the image, no GPUs.

    python3 incheck.pyz --nnodes N --gpus-per-node G [--json PATH] [--engine NAME=MODULE]...
                       -- <main_ppo hydra overrides>

Runs with the image's verl (this package, zipped into one file, is copied into the image or
bound in; it imports nothing of build-env). It does what ``verl.trainer.main_ppo`` does before
the first GPU is needed:

  compose   hydra composes verl's ``ppo_trainer`` config with the overrides (as main_ppo's
            ``@hydra.main`` does), then ``auto_set_device``
  validate  verl's ``validate_config`` ("All configuration checks passed")
  trainer   the modules the trainer's run imports (v1: transfer_queue and the trainer mode;
            legacy: main_ppo_v0) and verl's rollout code for the engine (up to the GPU driver)
  model     the model's config, tokenizer and processor from ``actor_rollout_ref.model.path``
            (verl's HFModelConfig, as the trainer's tokenizer step)
  train_data / val_data
            the row count, and the first row through verl's dataset class (create_rl_dataset:
            chat template, prompt length against data.max_prompt_length, filtering)
  reward    the reward manager class and the score function for the row's data_source, called
            on the row's ground truth
  cluster   nnodes x GPUs per node against the command's trainer.nnodes x n_gpus_per_node, the
            rollout's parallel sizes and the batch against the train rows
  gpu       stop: worker groups, weights, the rollout engine and Ray placement need GPUs

Prints one JSON document (schema verl-env/train-check/v1, level "config") on stdout; verl's own
output goes to stderr. Exit 0 pass, 1 rejected (a stage failed: verl's message quoted, the
override that fixes it named), 3 could not run (verl not importable, the checker broke).
"""


from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from .stages import Check, Tee

SCHEMA = "verl-env/train-check/v1"
EXIT = {"pass": 0, "rejected": 1, "error": 3}
MANIFEST = "/opt/verl-env/manifest.json"


USAGE = ("usage: incheck.pyz --nnodes N --gpus-per-node G [--json PATH] [--manifest PATH] "
         "[--engine NAME=MODULE]... -- OVERRIDE...")


@dataclass
class Args:
    """The command line (parsed by hand: an in-image program, no argparse in builder/ but the
    command layers)."""

    nnodes: int = 0
    gpus_per_node: int = 0
    json: str | None = None
    manifest: str = MANIFEST
    # rollout engines: verl's rollout.name -> the module that engine installs (the host passes
    # its catalogue's, builder.train.shapes.engine_args; a name not given is its own module)
    engines: dict[str, str] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)


def parse(argv: list[str]) -> Args:
    """``--nnodes N --gpus-per-node G [--json PATH] [--manifest PATH] [--engine NAME=MODULE]...
    -- OVERRIDE...``;
    SystemExit(2) with the usage on anything else."""
    args, rest = Args(), list(argv)
    if "--" in rest:
        args.overrides, rest = rest[rest.index("--") + 1:], rest[:rest.index("--")]
    names = {"--nnodes": "nnodes", "--gpus-per-node": "gpus_per_node", "--json": "json",
             "--manifest": "manifest"}
    while rest:
        flag = rest.pop(0)
        if flag in ("-h", "--help"):
            print(USAGE + "\n\n" + (__doc__ or ""), file=sys.stderr)
            raise SystemExit(0)
        known = flag in names or flag == "--engine"
        if not known or not rest:
            _usage(f"{flag} needs a value" if known else f"unexpected {flag!r}")
        if flag == "--engine":
            name, eq, module = rest.pop(0).partition("=")
            if not (name and eq and module):
                _usage("--engine takes NAME=MODULE")
            args.engines[name] = module
            continue
        setattr(args, names[flag], rest.pop(0))
    try:
        args.nnodes, args.gpus_per_node = int(args.nnodes), int(args.gpus_per_node)
    except ValueError:
        _usage("--nnodes and --gpus-per-node take whole numbers")
    if args.nnodes < 1 or args.gpus_per_node < 1:
        _usage("--nnodes and --gpus-per-node are required, each >= 1")
    return args


def _usage(why: str) -> None:
    print(f"{USAGE}\nincheck.pyz: error: {why}", file=sys.stderr)
    raise SystemExit(2)


def _environment(tmp: str) -> None:
    """Offline, and every cache in a scratch directory (the image may be read-only)."""
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                      TOKENIZERS_PARALLELISM="false")
    os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(tmp, "datasets"))
    os.environ.setdefault("HF_HOME", os.path.join(tmp, "hf"))
    os.environ.setdefault("RAY_DISABLE_IMPORT_WARNING", "1")


def verdict(stages: list[dict[str, Any]]) -> str:
    return "rejected" if any(s["status"] == "fail" for s in stages) else "pass"


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    out = sys.stdout
    tee = Tee(sys.stderr)
    start = time.monotonic()
    report: dict[str, Any] = {"schema": SCHEMA, "level": "config", "nnodes": args.nnodes,
                              "gpus_per_node": args.gpus_per_node,
                              "overrides": list(args.overrides)}
    with tempfile.TemporaryDirectory(prefix="verl-env-train-check-") as tmp, \
            contextlib.redirect_stdout(tee):
        _environment(tmp)
        os.makedirs(os.path.join(tmp, "rows"))
        check = Check(args, tee, os.path.join(tmp, "rows"))
        try:
            import verl

            report["verl"] = getattr(verl, "__version__", "?")
        except Exception as exc:  # noqa: BLE001 - nothing to check with
            report.update(status="error", error=f"verl is not importable here: {exc}",
                          stages=[])
        else:
            try:
                check.all()
                report.update(status=verdict(check.stages), stages=check.stages)
                if report["status"] == "pass":
                    check.run("gpu", check.stop)
                    check.stages[-1]["status"] = "stop"
            except Exception as exc:  # noqa: BLE001 - the checker itself broke
                traceback.print_exc(file=sys.stderr)
                report.update(status="error", error=f"the checker broke: {exc!r}",
                              stages=check.stages)
    report["seconds"] = round(time.monotonic() - start, 2)
    text = json.dumps(report, indent=2, default=str)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    out.write(text + "\n")
    out.flush()
    return EXIT[report["status"]]

