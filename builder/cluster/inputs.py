"""What the Slurm job's trainer reads and writes: the data, the model, the checkpoint directory
and any further bind, each a path for the nodes (absolute, ``$VAR``- or ``~``-relative), checked
on each node and bound into every container (:class:`Inputs`); and the job's default training
command on them, which is :mod:`builder.train.shapes`'s (its data:
``builder/train/verl_commands.yaml``, keyed by the verl version): the cluster shape left to the
job (:meth:`Inputs.trainer_command`) or made for a matrix target (:func:`default_train_cmd`).

Pure: the matrix target comes in typed; nothing here reads the environment."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder.cluster.shell import quote_keep_vars
from builder.errors import SlurmError
from builder.matrix import grammar
from builder.matrix.families import FAMILIES
from builder.matrix.spec import Target
from builder.train import shapes

#: The job's directory (on the shared filesystem the job is submitted from): a requeued job
#: keeps its job id, so its next attempt finds what the last one left there.
DEFAULT_JOB_DIR = "${SLURM_SUBMIT_DIR}/verl-env-${SLURM_JOB_ID}"
#: Where checkpoints go when the user names no --checkpoint-dir: under the job's directory, so
#: that the default command's trainer.resume_mode=auto resumes this job's own checkpoints after a
#: requeue and never another job's (a directory shared by every job from one submit directory
#: would resume an unrelated run); --checkpoint-dir to go on across jobs.
DEFAULT_CHECKPOINT_DIR = DEFAULT_JOB_DIR + "/checkpoints"


@dataclass(frozen=True)
class Bind:
    """One path bound into every container: ``src`` on the nodes, ``dst`` inside."""

    src: str
    dst: str
    ro: bool = False
    what: str = "bind"  # named in the job-time error when ``src`` is missing

    @classmethod
    def parse(cls, spec: str) -> "Bind":
        """``SRC[:DST[:ro]]`` as ``--bind`` takes it (DST defaults to SRC)."""
        parts = spec.split(":")
        if not parts[0] or len(parts) > 3 or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise SlurmError(f"--bind expects SRC[:DST[:ro]], got {spec!r}")
        if len(parts) == 2 and parts[1] in ("ro", "rw"):
            parts = [parts[0], parts[0], parts[1]]
        src = absolute_path(parts[0], "--bind")
        dst = parts[1] if len(parts) > 1 and parts[1] else src
        if not dst.startswith(("/", "$")):
            raise SlurmError(f"--bind destination {dst!r} must be an absolute path")
        return cls(src, dst, len(parts) == 3 and parts[2] == "ro", f"--bind {spec}")


def home_path(path: str, option: str) -> str:
    """``~`` and ``~/…`` as ``${HOME}…``, which the job expands on the nodes (a ``~`` inside the
    script's double quotes would stay a literal ``~``); ``~user`` is refused: the nodes' home
    of another user is not this tool's to guess."""
    if path == "~" or path.startswith("~/"):
        return "${HOME}" + path[1:]
    raise SlurmError(f"{option} {path!r}: only ~ and ~/… are expanded (on the nodes, as "
                     "${HOME}); give another user's home as an absolute path")


def absolute_path(path: str, option: str) -> str:
    """A path for the nodes: absolute, ``$VAR``-relative, ``~``-relative (``${HOME}`` on the
    nodes), or made absolute against the cwd (the generator runs where the job is submitted
    from). Held to the path grammar (builder.matrix.grammar) first, the error naming
    ``option``: what the user typed, not what is made of it."""
    if not path:
        raise SlurmError(f"{option} is empty")
    try:
        grammar.path(path)
    except grammar.GrammarError as exc:
        raise SlurmError(f"{option}: {exc}") from None
    if path.startswith(("/", "$")):
        return path
    if path.startswith("~"):
        return home_path(path, option)
    return str(Path(path).absolute())


def is_model_path(model: str) -> bool:
    """A local model directory (bound into the container) rather than a hub id (``org/name``,
    fetched into HF_HOME)."""
    return model.startswith(("/", ".", "~", "$"))


@dataclass(frozen=True)
class Inputs:
    """What the trainer reads and writes; every path is checked on each node and bound."""

    train_files: str | None = None
    val_files: str | None = None
    model: str | None = None
    checkpoint_dir: str = DEFAULT_CHECKPOINT_DIR
    binds: tuple[Bind, ...] = ()

    @classmethod
    def from_options(cls, data: str | None = None, train_files: str | None = None,
                     val_files: str | None = None, model: str | None = None,
                     checkpoint_dir: str | None = None, binds: list[str] | None = None
                     ) -> "Inputs":
        if data and (train_files or val_files):
            raise SlurmError("give --data DIR or --train-files/--val-files, not both")
        if data:
            root = absolute_path(data, "--data").rstrip("/") or "/"
            train_files, val_files = f"{root}/train.parquet", f"{root}/test.parquet"
        else:
            train_files = absolute_path(train_files, "--train-files") if train_files else None
            val_files = absolute_path(val_files, "--val-files") if val_files else None
        if model and is_model_path(model):
            model = absolute_path(model, "--model")
        elif model:
            try:
                grammar.plain(model)
            except grammar.GrammarError as exc:
                raise SlurmError(f"--model: {exc}") from None
        return cls(train_files, val_files, model,
                   absolute_path(checkpoint_dir, "--checkpoint-dir") if checkpoint_dir
                   else DEFAULT_CHECKPOINT_DIR,
                   tuple(Bind.parse(b) for b in binds or ()))

    def missing_for_trainer(self) -> list[str]:
        """The options the default training command cannot do without."""
        out = []
        if not self.train_files:
            out.append("--data (or --train-files)")
        if not self.val_files:
            out.append("--data (or --val-files)")
        if not self.model:
            out.append("--model")
        return list(dict.fromkeys(out))

    def checks(self) -> list[tuple[str, str]]:
        """(what, path) pairs that must exist on every node before anything starts."""
        out = [("train files", self.train_files), ("validation files", self.val_files)]
        if self.model and is_model_path(self.model):
            out.append(("model", self.model))
        out += [(b.what, b.src) for b in self.binds]
        return [(w, p) for w, p in out if p]

    def all_binds(self) -> list[Bind]:
        """Every bind of the job: data parents and model read-only, checkpoints read-write."""
        out: list[Bind] = []
        for path in (self.train_files, self.val_files):
            if path:
                parent = path.rsplit("/", 1)[0] or "/"
                out.append(Bind(parent, parent, True, "data"))
        if self.model and is_model_path(self.model):
            out.append(Bind(self.model, self.model, True, "model"))
        out.append(Bind(self.checkpoint_dir, self.checkpoint_dir, False, "checkpoints"))
        out += self.binds
        seen: dict[str, Bind] = {}
        for b in out:
            if b.dst not in seen:
                seen[b.dst] = b
        return list(seen.values())

    def trainer_command(self, overrides: tuple[str, ...] = ()) -> str:
        """verl's trainer (:func:`builder.train.shapes.job_command`) with data, model,
        checkpoints and the cluster shape the job expands filled in, then ``overrides`` (the
        family's trainer overrides, builder.matrix.families: vLLM custom all-reduce off on
        ROCm)."""
        missing = self.missing_for_trainer()
        if missing:
            raise SlurmError(f"the default training command ({shapes.trainer_module()}) needs "
                             f"{' and '.join(missing)}; or pass your own --train-cmd")
        assert self.model and self.train_files and self.val_files
        words = shapes.job_command(
            model=self.model, train_files=self.train_files, val_files=self.val_files,
            checkpoint_dir=self.checkpoint_dir, nnodes="${SLURM_NNODES}",
            gpus_per_node="${VERL_ENV_GPUS_PER_NODE}", overrides=overrides)
        return " ".join(quote_keep_vars(w) for w in words)


@dataclass(frozen=True)
class TrainChoice:
    """What the user chose of the default command (``build-env slurm`` options)."""

    nodes: int | None
    gpus_per_node: int | None
    tp: int = 1
    pp: int = 1
    algorithm: str = "grpo"
    loggers: tuple[str, ...] = ("console",)
    overrides: tuple[str, ...] = ()


def default_train_cmd(target: Target, family: str, inputs: Inputs,
                      choice: TrainChoice) -> tuple[str, tuple[str, ...]]:
    """The job's default training command for a matrix target: :mod:`builder.train.shapes`'s
    for the verl version the target pins (rollout engine from the target, batch sizes from
    nodes x GPUs per node), the checkpoint directory and the family's trainer overrides, the
    user's ``--override`` last. (the command as one shell line, the variables its loggers need
    by name)."""
    missing = inputs.missing_for_trainer()
    if choice.nodes is None:
        missing.append("--nodes")
    if choice.gpus_per_node is None:
        missing.append("--gpus-per-node")
    if missing:
        raise SlurmError(f"the default training command ({shapes.trainer_module()}; its batch "
                         f"sizes follow nodes x GPUs per node) needs {' and '.join(missing)}; "
                         "or pass your own --train-cmd")
    assert inputs.model and inputs.train_files and inputs.val_files
    try:
        verl = shapes.target_verl(target)
        argv = shapes.default_command(
            verl, rollout=shapes.target_rollout(target), nnodes=choice.nodes or 1,
            gpus_per_node=choice.gpus_per_node or 0, tp=choice.tp, pp=choice.pp,
            layer=shapes.target_layer(target), algorithm=choice.algorithm, loggers=choice.loggers, model=inputs.model,
            train_files=inputs.train_files, val_files=inputs.val_files,
            checkpoint_dir=inputs.checkpoint_dir,
            overrides=(*FAMILIES[family].trainer_overrides, *choice.overrides))
        names = tuple(shapes.logger_env(verl, choice.loggers))
    except shapes.TrainShapeError as exc:
        raise SlurmError(exc.args[0]) from None  # the message, without its stage prefix
    return " ".join(quote_keep_vars(w) for w in argv), names


