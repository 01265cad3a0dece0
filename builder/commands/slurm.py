"""``build-env slurm``: an sbatch script for a target; its family comes from the matrix."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from builder.commands import _requeue as requeue
from builder.commands import _shared
from builder.errors import BuildEnvError, SlurmError
from builder.cluster.inputs import (DEFAULT_CHECKPOINT_DIR, Inputs, TrainChoice, absolute_path,
                                    default_train_cmd)
from builder.cluster.job import (FAMILY_NAMES, MAX_GPUS_PER_NODE, MAX_NODES,
                                 MAX_RAY_START_ATTEMPTS, SELFTEST_PHASES, SlurmJob, image_source,
                                 job_warnings, parse_env, training_command)
from builder.cluster.render import render_sbatch, write_sbatch
from builder.cluster.runtime import RUNTIMES
from builder.cluster.shell import train_argv
from builder.sif import checks as sif_checks
from builder.sif.format import is_sif
from builder.matrix.spec import Target
from builder.train import check as train_check
from builder.train import checker_bytes, overrides as hydra, shapes

NAME = "slurm"
HELP = "write an sbatch script"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _shared.common(p)
    p.add_argument("--target", default=None, help="matrix target (sets the accelerator family)")
    _options(p)
    requeue.add_arguments(p)
    _shared.json_flag(p, "what was written (with --output) or the script itself")
    _shared.quiet(p)


def job_from_args(args: argparse.Namespace, family: str | None = None,
                  target: Target | None = None) -> SlurmJob:
    """The :class:`SlurmJob` of parsed ``build-env slurm`` options; ``family``: the --target's,
    when --family names none; ``target``: the matrix target the default command is made for."""
    family = args.family or family
    if family is None:
        raise SlurmError("no accelerator family: pass --family (or a --target the CLI resolves)")
    if not args.sif:
        raise SlurmError("no image: pass --sif (oras://…@sha256:…, docker://…@sha256:… or a path)")
    inputs = Inputs.from_options(data=args.data, train_files=args.train_files,
                                 val_files=args.val_files, model=args.model,
                                 checkpoint_dir=args.checkpoint_dir, binds=args.bind)

    def path(value: str | None, option: str) -> str | None:
        return absolute_path(value, option) if value else None

    env = parse_env(args.env)
    train_cmd = args.train_cmd
    _check_ranges(args, family)
    if train_cmd is not None:
        given = [o for o, v in (("--override", args.override), ("--logger", args.logger),
                                ("--algorithm", args.algorithm), ("--tp", args.tp),
                                ("--pp", args.pp)) if v is not None]
        if given:
            raise SlurmError(f"{', '.join(given)} shape{'s' if len(given) == 1 else ''} the "
                             "default training command only; with --train-cmd write "
                             f"{'it' if len(given) == 1 else 'them'} into your command (hydra "
                             "overrides of verl's trainer)")
        env = {**{n: None for n in _command_logger_env(train_cmd, target)}, **env}
    elif target is not None:
        choice = TrainChoice(nodes=args.nodes,
                             gpus_per_node=args.gpus_per_node or args.ray_logical_gpus,
                             tp=args.tp or 1, pp=args.pp or 1,
                             algorithm=args.algorithm or "grpo",
                             loggers=tuple(args.logger or ("console",)),
                             overrides=tuple(args.override or ()))
        train_cmd, names = default_train_cmd(target, family, inputs, choice)
        env = {**{n: None for n in names}, **env}
    elif train_cmd is None:
        raise SlurmError("the default training command is made for the verl version a matrix "
                         "target pins: pass --target (or your own --train-cmd)")
    trust_key = path(args.trust_key, "--trust-key")
    if trust_key and "$" not in trust_key:
        local = Path(trust_key.replace("${HOME}", str(Path.home()), 1))
        if not local.is_file():
            raise SlurmError(f"--trust-key {args.trust_key}: {local} is not a file (the job "
                             "reads it on the batch host; give a path that exists there and "
                             "here)")

    return SlurmJob(
        target=getattr(args, "target", None) or family, family=family,
        sif=image_source(args.sif), nodes=args.nodes, gpus_per_node=args.gpus_per_node,
        cpus_per_task=args.cpus_per_task, partition=args.partition, time=args.time,
        interface=args.interface, cache_dir=absolute_path(args.cache_dir, "--cache-dir"),
        hf_home=path(args.hf_home, "--hf-home"),
        train_cmd=train_cmd, inputs=inputs, env=env, runtime=args.runtime,
        ray_logical_gpus=getattr(args, "ray_logical_gpus", None),
        train_checker=checker_bytes(),
        roce=args.roce, account=args.account, qos=args.qos, constraint=args.constraint,
        reservation=args.reservation, mem=args.mem, cpu_bind=args.cpu_bind,
        selftest_phases=args.selftest_phases, selftest_args=args.selftest_args,
        ray_wait_timeout=args.ray_wait_timeout, ray_start_attempts=args.ray_start_attempts,
        exclusive=args.exclusive,
        node_check_interval=args.node_check_interval,
        trust_key=trust_key,
        trust_pgp=path(args.trust_pgp, "--trust-pgp"), cluster=args.cluster,
        verdict_sif=path(args.verdict_sif, "--verdict-sif"), resilience=requeue.from_args(args))


def run(args: argparse.Namespace) -> int:
    target = _shared.site(args).matrix.target(args.target) if args.target else None
    family = target.accelerator if target else None
    try:
        if family and args.family and args.family != family:
            raise SlurmError(f"--family {args.family} contradicts --target {args.target}, a "
                             f"{family} target; drop --family (the target sets it)")
        job = job_from_args(args, family, target)
        for warning in job_warnings(job):
            print(f"warning: {warning}", file=sys.stderr)
        _missing_names(job)
        if _train_check(args, job, target) == 1:
            return 1
        summary = {"target": job.target, "family": job.family, "runtime": job.runtime,
                   "image": job.sif, "nodes": job.nodes, "gpus_per_node": job.gpus_per_node}
        if args.output:
            path = write_sbatch(job, args.output)
            if args.json:
                _shared.emit_json("slurm", {**summary, "script": str(path)})
            _shared.info(args, f"wrote {path} (submit with: sbatch {shlex.quote(str(path))})")
        elif args.json:
            _shared.emit_json("slurm", {**summary, "script": None, "text": render_sbatch(job)})
        else:
            sys.stdout.write(render_sbatch(job))
    except SlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


def _command_logger_env(train_cmd: str, target: Target | None) -> list[str]:
    """The variables the loggers of a given verl trainer command (its ``trainer.logger``)
    need, passed by name like the default command's (wandb: WANDB_API_KEY)."""
    shape = shapes.train_shape(train_argv(train_cmd))
    loggers: list[str] = []
    for word in shape.overrides:
        key, eq, value = word.lstrip("+").partition("=")
        if eq and key == "trainer.logger":
            loggers = hydra.items(value)
    verl = shapes.target_verl(target) if target is not None else shapes.newest_version()
    try:
        return shapes.logger_env(verl, loggers)
    except shapes.TrainShapeError:
        return shapes.logger_env(shapes.newest_version(), loggers)


def _check_ranges(args: argparse.Namespace, family: str) -> None:
    """The numbers the default training command is made of, each in its range, one message per
    option whatever is out of it, before anything is made of them (``--nodes -2`` and
    ``--nodes 0`` alike; ``--gpus-per-node 0`` on a GPU family is a range error, not a missing
    option). The job's other numbers are held to theirs by SlurmJob (builder.cluster.job)."""
    low_gpus = 0 if family == "cpu" else 1
    for option, value, low, high in (
            ("--nodes", args.nodes, 1, MAX_NODES),
            ("--gpus-per-node", args.gpus_per_node, low_gpus, MAX_GPUS_PER_NODE),
            ("--tp", args.tp, 1, MAX_NODES * MAX_GPUS_PER_NODE),
            ("--pp", args.pp, 1, MAX_NODES * MAX_GPUS_PER_NODE)):
        if value is not None and not low <= value <= high:
            scope = f" for a {family} job" if option == "--gpus-per-node" else ""
            raise SlurmError(f"{option} must be a whole number from {low} to {high}{scope}, "
                             f"not {value}")


def _note(line: str) -> None:
    print(line, file=sys.stderr, flush=True)  # stdout may be the script itself


def _check_argv(job: SlurmJob) -> tuple[list[str], int, int] | str:
    """The training argv as the head node will run it, with its nnodes and GPUs per node; or
    why it cannot be checked here."""
    # the job id is not known before sbatch; the check reads no checkpoint (the default one is
    # under the job's directory, ${SLURM_SUBMIT_DIR}/verl-env-${SLURM_JOB_ID}/checkpoints)
    here = {"SLURM_SUBMIT_DIR": os.getcwd(), "HOME": str(Path.home()), "SLURM_JOB_ID": "0"}
    return shapes.local_argv(train_argv(training_command(job)), here)


def _train_check(args: argparse.Namespace, job: SlurmJob, target: Target | None) -> int:
    """verl's configuration checks of the job's training command in the image, when the image
    is at hand here: ``--check-image``, else the job's own SIF when ``--sif`` is a local SIF file
    (run by apptainer, singularity or ch-run), else the engine's ``verl-env:TARGET``; 1 when verl
    rejects it (nothing is written)."""
    later = "the job runs it on the head node before Ray"
    if args.no_train_check:
        _note(f"train check: not run here (--no-train-check); {later}")
        return 0
    sif = None if args.check_image else _local_sif(job.sif)
    ref = args.check_image or (f"verl-env:{target.name}" if target else None)
    prepared = _check_argv(job)
    if isinstance(prepared, str) or (ref is None and sif is None):
        why = prepared if isinstance(prepared, str) else "no image: --check-image or --target"
        _note(f"train check: not run here ({why}); {later}")
        return 0
    argv, nnodes, gpus = prepared
    try:
        if sif is not None:
            result = train_check.run_check_sif(sif, argv, nnodes=nnodes, gpus_per_node=gpus,
                                               runner=sif_checks.argv_runner(job.runtime))
        elif ref is not None:
            engine, image = _shared.engine_image(ref, None, SlurmError)
            result = train_check.run_check(engine, image.id, argv, nnodes=nnodes,
                                           gpus_per_node=gpus)
        else:  # neither: said above
            return 0
    except BuildEnvError as exc:
        _note(f"train check: not run here ({sif or ref}: {exc}); {later}")
        return 0
    for line in train_check.summary_lines(result):
        _note(line)
    if result.exit_code == 1:
        _note("error: slurm: verl rejects the training command (above); no script written")
        return 1
    return 0


def _local_sif(source: str) -> Path | None:
    """The job's image as a SIF file here (the image the job runs), or None: a registry
    reference, a ``$VAR`` path, a directory (ch-run) or an enroot squashfs."""
    path = Path(source)
    if source.startswith(("oras://", "docker://", "$")) or not path.is_file():
        return None
    return path if is_sif(path) else None


def _missing_names(job: SlurmJob) -> None:
    """``--env NAME`` passes NAME from the environment ``sbatch`` runs in: say so when it is not
    set here (the job itself fails at setup if it is not set there either)."""
    for name in job.by_name:
        if name not in os.environ:
            print(f"warning: --env {name}: not set in this environment; export it before "
                  "sbatch (the job fails at setup without it)", file=sys.stderr)


def _options(parser: argparse.ArgumentParser) -> None:
    """Options of ``build-env slurm`` (the CLI adds ``--target`` and resolves it to a family)."""
    d = SlurmJob(target="t", family="cpu", sif="x.sif", train_cmd="true")
    parser.add_argument("--family", choices=FAMILY_NAMES, help="accelerator family of the target")
    parser.add_argument("--sif", "--image", dest="sif", default=None,
                        help="oras://…@sha256:…, docker://…@sha256:… or a .sif path (apptainer, "
                             "singularity); docker://…@sha256:… or an enroot .sqsh path "
                             "(pyxis); an unpacked image directory (ch-run)")
    parser.add_argument("--runtime", choices=RUNTIMES, default=d.runtime,
                        help="container runtime on the nodes: apptainer, singularity, pyxis "
                             "(srun --container-image, enroot underneath) or ch-run (cpu family "
                             "only)")
    io = parser.add_argument_group("what the trainer reads and writes (bound into every container)")
    io.add_argument("--data", default=None, metavar="DIR",
                    help="directory holding train.parquet and test.parquet (verl's preprocessing "
                         "output)")
    io.add_argument("--train-files", default=None, metavar="PATH", help="training parquet file")
    io.add_argument("--val-files", default=None, metavar="PATH", help="validation parquet file")
    io.add_argument("--model", default=None, metavar="PATH_OR_ID",
                    help="model directory (bound read-only) or a hub id fetched into --hf-home")
    io.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                    help=f"where verl writes checkpoints (default {DEFAULT_CHECKPOINT_DIR})")
    io.add_argument("--bind", action="append", default=[], metavar="SRC[:DST[:ro]]",
                    help="another path bound into every container (repeatable)")
    io.add_argument("--train-cmd", default=None,
                    help="training command in the image, instead of the default: "
                         f"{shapes.trainer_module()} for the target's verl (docs/slurm.md)")
    _train_options(parser)


def _train_options(parser: argparse.ArgumentParser) -> None:
    train = parser.add_argument_group("the default training command (without --train-cmd)")
    train.add_argument("--algorithm", choices=shapes.ALGORITHMS, default=None,
                       help="grpo (default) or ppo")
    train.add_argument("--tp", type=int, default=None, metavar="N",
                       help="tensor-parallel size (default 1): the rollout's, and on a target "
                            "whose stack layer has its own trainer configuration the actor's "
                            "(docs/train-check.md)")
    train.add_argument("--pp", type=int, default=None, metavar="N",
                       help="the actor's pipeline-parallel size on such a target (default 1; "
                            "tp x pp must divide nodes x GPUs per node)")
    train.add_argument("--logger", action="append", metavar="NAME",
                       help="trainer.logger entry (repeatable; default console); a logger's "
                            "key (wandb: WANDB_API_KEY) is passed by name")
    train.add_argument("--override", action="append", metavar="KEY=VALUE",
                       help="a hydra override layered last (repeatable)")
    train.add_argument("--ray-logical-gpus", type=int, default=None, metavar="N",
                       help=argparse.SUPPRESS)  # test clusters only: docs/slurm.md
    _site_options(parser)


def _site_options(parser: argparse.ArgumentParser) -> None:
    """Allocation, network, caches, self-test and the cluster verdict."""
    d = SlurmJob(target="t", family="cpu", sif="x.sif", train_cmd="true")
    alloc = parser.add_argument_group("allocation (a #SBATCH line only for what you give)")
    alloc.add_argument("--nodes", type=int, default=None,
                       help="nodes (default: no #SBATCH line; sbatch -N or the partition "
                            "decides)")
    alloc.add_argument("--gpus-per-node", type=int, default=None)
    alloc.add_argument("--cpus-per-task", type=int, default=None,
                       help="CPUs per node (Ray's --num-cpus otherwise comes from the allocation)")
    alloc.add_argument("--partition", default=None)
    alloc.add_argument("--time", default=None, help="time limit (MM, HH:MM:SS, D-HH:MM:SS)")
    alloc.add_argument("--mem", default=None, help="memory per node (e.g. 500G; 0: all of it)")
    alloc.add_argument("--account", default=None)
    alloc.add_argument("--qos", default=None)
    alloc.add_argument("--constraint", default=None, help="node features (e.g. 'a100&ib')")
    alloc.add_argument("--reservation", default=None)
    alloc.add_argument("--cpu-bind", default=d.cpu_bind,
                       help=f"--cpu-bind of every step (default {d.cpu_bind}); each step asks "
                            "for all CPUs of its node's allocation")
    alloc.add_argument("--no-exclusive", dest="exclusive", action="store_false",
                       help="share nodes (default: #SBATCH --exclusive, whole nodes); the job's "
                            "ports then move with its job id, and --cpus-per-task is needed")
    net = parser.add_argument_group("network")
    net.add_argument("--interface", default=d.interface,
                     help="network interface for Ray, NCCL and gloo (default ib0)")
    net.add_argument("--env", action="append", metavar="NAME[=VALUE]",
                     help="NAME=VALUE: a site setting (NCCL/RCCL...) written into the script and "
                          "passed into the container so that it wins over the image's own; NAME "
                          "alone: passed by name from the environment sbatch runs in, its value "
                          "never written (secrets: --env WANDB_API_KEY, --env HF_TOKEN); "
                          "repeatable")
    net.add_argument("--roce", action="store_true",
                     help="NCCL_IB_HCA also lists RoCE (Ethernet link layer) ports")
    parser.add_argument("--cache-dir", default=d.cache_dir,
                        help="shared SIF cache directory (~ and $VAR expand on the nodes)")
    parser.add_argument("--hf-home", default=None,
                        help="shared Hugging Face cache (default: the user's $HF_HOME, else "
                             "$HOME/.cache/huggingface)")
    parser.add_argument("--selftest-phases", default=None,
                        help=f"phases for the node self-test (comma list of "
                             f"{', '.join(SELFTEST_PHASES)})")
    parser.add_argument("--selftest-args", default="",
                        help="more self-test options (e.g. '--strict --bw-ref FILE')")
    parser.add_argument("--ray-wait-timeout", type=int, default=d.ray_wait_timeout)
    parser.add_argument("--ray-start-attempts", type=int, default=d.ray_start_attempts,
                        metavar="N",
                        help="how often the job starts Ray at most when a node's Ray gives up "
                             "with Ray's own startup timeout (a busy node; default "
                             f"{d.ray_start_attempts}, 1-{MAX_RAY_START_ATTEMPTS})")
    parser.add_argument("--node-check-interval", type=int, default=d.node_check_interval,
                        metavar="SECONDS",
                        help="how often a watched stage checks that every node still answers "
                             "(a lost node fails the stage naming it; default "
                             f"{d.node_check_interval})")
    parser.add_argument("--trust-key", default=None, metavar="PUB",
                        help="before any node starts, run `build-env trust verify` on the SIF "
                             "with this public key (needs build-env on the batch node)")
    parser.add_argument("--trust-pgp", default=None, metavar="PUB.asc",
                        help="also check the SIF's own OpenPGP signature (local SIFs)")
    verdict = parser.add_argument_group("the job's cluster verdict (written by build-env cluster "
                                        "on the batch host, when installed there)")
    verdict.add_argument("--cluster", default=None, metavar="NAME",
                         help="the site/cluster name the verdict holds for (default: Slurm's "
                              "$SLURM_CLUSTER_NAME)")
    verdict.add_argument("--verdict-sif", default=None, metavar="PATH",
                         help="the SIF the verdict names (default: the SIF the job runs; with "
                              "ch-run: the SIF the image directory was unpacked from)")
    parser.add_argument("--output", "-o", default=None, help="write here (default: stdout)")
    check = parser.add_argument_group("the train check before writing (docs/slurm.md)")
    check.add_argument("--check-image", default=None, metavar="REF",
                       help="run verl's configuration checks of the training command in this "
                            "local engine image first (default: the --sif file when it is a "
                            "local SIF and apptainer, singularity or ch-run is installed, else "
                            "verl-env:TARGET when the engine has it); a rejected command writes "
                            "nothing (exit 1)")
    check.add_argument("--no-train-check", action="store_true",
                       help="do not run the train check here (the job still runs it)")
