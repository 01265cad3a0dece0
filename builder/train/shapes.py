"""The default training command as data: ``verl_commands.yaml`` holds, per verl version the
matrix pins, the trainer module, the hydra keys, the fixed settings and the batch-size rule;
:func:`default_command` fills them in for one job (algorithm, rollout engine, cluster shape,
loggers, paths) and layers the user's ``--override KEY=VALUE`` last. Pure: no I/O but reading
the data file.

The batch-size rule (docs/train-check.md): with ``n_gpus = nnodes * gpus_per_node``,
``data.train_batch_size = prompts_per_gpu * n_gpus``, ``ppo_mini_batch_size = train_batch_size
/ mini_batches_per_step`` and every micro batch ``micro_batch_size_per_gpu``; verl 0.9.1 then
needs ``train_batch_size * rollout.n % n_gpus == 0`` and ``ppo_mini_batch_size * rollout.n /
n_gpus`` a positive multiple of the micro batch, which :func:`check_batches` holds the data to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from builder import catalog
from builder.errors import BuildEnvError
from builder.matrix.spec import Target
from builder.train import overrides as hydra

DATA = Path(__file__).resolve().parent / "verl_commands.yaml"
ALGORITHMS = ("grpo", "ppo")
#: The rollout engines verl drives, by verl's ``rollout.name`` (the upstream catalogue's).
ROLLOUTS = catalog.shipped().engine_names()
# a hydra override: an optional +/++/~ prefix, a dotted key, '=', any value (may be empty)
_OVERRIDE = re.compile(r"^(\+\+|\+|~)?([A-Za-z_][A-Za-z0-9_\-]*(?:\.[A-Za-z0-9_\-]+)*)=(.*)$",
                       re.DOTALL)
_DELETE = re.compile(r"^~([A-Za-z_][A-Za-z0-9_\-]*(?:\.[A-Za-z0-9_\-]+)*)$")
_LOGGER = re.compile(r"^[a-z][a-z0-9_]*$")


class TrainShapeError(BuildEnvError):
    """A training command that cannot be made: unknown verl version, bad shape or override
    (exit 2, bad input)."""

    stage = "train-check"


@dataclass(frozen=True)
class Batches:
    """The batch sizes of one cluster shape (see the module doc for the rule)."""

    n_gpus: int
    train_batch_size: int
    mini_batch_size: int
    micro_batch_size_per_gpu: int
    rollout_n: int
    #: the actor's data-parallel size: n_gpus on FSDP, n_gpus / (tp x pp) on Megatron
    dp: int = 0
    model_parallel: bool = False  # the actor's data-parallel size is dp, its minimal dp x micro

    def __post_init__(self) -> None:
        if not self.dp:  # FSDP: every GPU is a data-parallel rank
            object.__setattr__(self, "dp", self.n_gpus)

    @property
    def minimal(self) -> int:
        """verl's minimal batch (validate_config): the GPUs on FSDP, dp x micro on Megatron."""
        return self.dp * self.micro_batch_size_per_gpu if self.model_parallel else self.n_gpus


@lru_cache(maxsize=4)
def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or data.get("schema") != 1 or not isinstance(
            data.get("verl"), dict):
        raise TrainShapeError(f"{path}: not a verl command table (schema 1 with a 'verl' map)")
    return data


def known_versions(path: Path = DATA) -> list[str]:
    """The verl versions the data file has a command shape for."""
    return sorted(_load(path)["verl"])


def newest_version(path: Path = DATA) -> str:
    """The newest verl version the data file has a command shape for."""
    return max(known_versions(path),
               key=lambda v: tuple(int(p) if p.isdigit() else -1 for p in v.split(".")))


def trainer_module(verl_version: str | None = None) -> str:
    """verl's trainer entry point (``python3 -m MODULE``) of ``verl_version`` (the newest)."""
    return str(shape_for(verl_version or newest_version())["module"])


def shape_for(verl_version: str, path: Path = DATA) -> dict[str, Any]:
    """The command shape of ``verl_version``; an unknown version names itself and the file."""
    table = _load(path)["verl"]
    version = verl_version.split("+", 1)[0].strip()
    if version not in table:
        raise TrainShapeError(
            f"no default training command for verl {verl_version!r} in {path} (it has "
            f"{', '.join(sorted(table)) or 'none'}); add an entry for it, or pass --train-cmd")
    return table[version]


def batches(shape: Mapping[str, Any], *, algorithm: str, nnodes: int,
            gpus_per_node: int, model_parallel: int = 0) -> Batches:
    """The batch sizes for a cluster shape, by the data's rule; ``model_parallel``: a Megatron
    actor's tp x pp (0: FSDP)."""
    n_gpus = nnodes * gpus_per_node
    train = int(shape["prompts_per_gpu"]) * n_gpus
    per_step = int(shape["mini_batches_per_step"])
    if train % per_step:
        raise TrainShapeError(f"train batch {train} is not divisible by mini_batches_per_step "
                              f"{per_step} ({DATA.name})")
    return Batches(n_gpus, train, train // per_step, int(shape["micro_batch_size_per_gpu"]),
                   int(shape["algorithms"][algorithm]["rollout_n"]),
                   n_gpus // model_parallel if model_parallel else n_gpus, model_parallel > 0)


def check_batches(b: Batches) -> None:
    """verl 0.9.1's batch rules (validate_config and the workers' normalisation), held early."""
    if (b.train_batch_size * b.rollout_n) % b.minimal:
        raise TrainShapeError(f"train_batch_size * rollout.n ({b.train_batch_size} * "
                              f"{b.rollout_n}) is not divisible by verl's minimal batch "
                              f"{b.minimal}")
    per_gpu, rest = divmod(b.mini_batch_size * b.rollout_n, b.dp)
    if rest or per_gpu <= 0 or per_gpu % b.micro_batch_size_per_gpu:
        raise TrainShapeError(
            f"ppo_mini_batch_size * rollout.n / dp ({b.mini_batch_size} * {b.rollout_n} / "
            f"{b.dp}) must be a positive multiple of the micro batch "
            f"{b.micro_batch_size_per_gpu}")


def parse_override(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (hydra's ``+KEY=``, ``++KEY=``, ``~KEY[=VALUE]`` too) -> (key, text);
    anything else is a TrainShapeError naming the override."""
    m = _OVERRIDE.match(text) or _DELETE.match(text)
    if m is None:
        raise TrainShapeError(f"--override {text!r}: expected KEY=VALUE (a dotted hydra key, "
                              f"e.g. data.max_prompt_length=1024)")
    if "\n" in text or "\x00" in text:
        raise TrainShapeError(f"--override {text!r}: a newline or NUL is not allowed")
    key = m.group(2) if m.re is _OVERRIDE else m.group(1)
    value = m.group(3) if m.re is _OVERRIDE else None
    why = hydra.problem(value) if value is not None else None
    if why is not None and value is not None:
        raise TrainShapeError(
            f"--override {text!r}: hydra does not read {value!r} as one value ({why}); quote "
            f"it: --override \"{(m.group(1) or '') + hydra.suggestion(key, value)}\"")
    return key, text


def logger_list(loggers: Sequence[str], shape: Mapping[str, Any]) -> list[str]:
    """The loggers, checked against what this verl's Tracking supports; console first."""
    if not loggers:
        raise TrainShapeError("at least one logger is needed (console)")
    known = list(shape.get("loggers", ()))
    for name in loggers:
        if not _LOGGER.match(name) or name not in known:
            raise TrainShapeError(f"unknown logger {name!r} (this verl has: {', '.join(known)})")
    return list(dict.fromkeys(loggers))


def logger_env(verl_version: str, loggers: Sequence[str]) -> list[str]:
    """Environment variable names the loggers need, passed by name (never by value):
    wandb -> WANDB_API_KEY."""
    table = shape_for(verl_version).get("logger_env", {})
    out: list[str] = []
    for name in loggers:
        out += [v for v in table.get(name, ()) if v not in out]
    return out


def _fill(items: Sequence[str], values: Mapping[str, Any]) -> list[str]:
    return [str(item).format(**values) for item in items]


def _validate(verl_version: str, *, rollout: str, nnodes: int, gpus_per_node: int, tp: int,
              pp: int, algorithm: str, shape: Mapping[str, Any], paths: Mapping[str, str],
              layer: Mapping[str, Any] | None) -> None:
    if rollout not in shape.get("rollouts", ROLLOUTS):
        raise TrainShapeError(f"unknown rollout engine {rollout!r} for verl {verl_version} "
                              f"(known: {', '.join(shape.get('rollouts', ROLLOUTS))})")
    if algorithm not in shape["algorithms"]:
        raise TrainShapeError(f"unknown algorithm {algorithm!r} (known: "
                              f"{', '.join(shape['algorithms'])})")
    for what, n in (("--nodes", nnodes), ("--gpus-per-node", gpus_per_node), ("--tp", tp),
                    ("--pp", pp)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise TrainShapeError(f"{what} must be a whole number >= 1, not {n!r}")
    n_gpus = nnodes * gpus_per_node
    if n_gpus % tp:
        raise TrainShapeError(f"--tp {tp} does not divide the {n_gpus} GPUs ({nnodes} node(s) "
                              f"x {gpus_per_node})")
    if pp > 1 and layer is None:
        raise TrainShapeError(f"--pp {pp}: pipeline parallelism is the actor's on a target "
                              f"with a stack layer of {DATA.name} "
                              f"({', '.join(shape.get('layers', {})) or 'none'}); this target "
                              "has none (its actor is FSDP)")
    if layer is not None and n_gpus % (tp * pp):
        raise TrainShapeError(f"--tp {tp} x --pp {pp} = {tp * pp} does not divide the {n_gpus} "
                              f"GPUs ({nnodes} node(s) x {gpus_per_node})")
    for what, value in paths.items():
        if not value or any(c in value for c in "\n\x00"):
            raise TrainShapeError(f"the {what} path is empty or holds a newline")


def _layer(shape: Mapping[str, Any], layer: str | None, verl_version: str
           ) -> Mapping[str, Any] | None:
    """The command data of a stack layer (``layers.NAME``: a Megatron target's trainer
    configuration); None for none."""
    if layer is None:
        return None
    found = shape.get("layers", {}).get(layer)
    if found is None:
        raise TrainShapeError(f"no default training command for the {layer} layer of verl "
                              f"{verl_version} in {DATA} (layers.{layer}); pass --train-cmd")
    return found


def default_command(verl_version: str, *, rollout: str, nnodes: int, gpus_per_node: int,
                    tp: int = 1, pp: int = 1, layer: str | None = None, algorithm: str = "grpo",
                    loggers: tuple[str, ...] = ("console",), model: str, train_files: str,
                    val_files: str, checkpoint_dir: str | None = None,
                    overrides: Sequence[str] = ()) -> list[str]:
    """The argv of ``python3 -m <the version's trainer module>`` with hydra overrides, the
    checkpoint directory (when given) then the user's ``overrides`` last (hydra: the last value
    of a key wins)."""
    shape = shape_for(verl_version)
    stack = _layer(shape, layer, verl_version)
    paths = {"model": model, "train_files": train_files, "val_files": val_files}
    _validate(verl_version, rollout=rollout, nnodes=nnodes, gpus_per_node=gpus_per_node, tp=tp,
              pp=pp, algorithm=algorithm, shape=shape, paths=paths, layer=stack)
    for text in overrides:
        parse_override(text)
    b = batches(shape, algorithm=algorithm, nnodes=nnodes, gpus_per_node=gpus_per_node,
                model_parallel=tp * pp if stack else 0)
    check_batches(b)
    keys, algo = shape["keys"], shape["algorithms"][algorithm]
    head = ([f"--config-name={stack['config_name']}", f"{stack['keys']['tp']}={tp}",
             f"{stack['keys']['pp']}={pp}"] if stack else [])
    values = {**{k: hydra.quote(v) for k, v in paths.items()},
              "micro": b.micro_batch_size_per_gpu}
    argv = ["python3", "-m", shape["module"], *head,
            f"{keys['adv_estimator']}={algo['adv_estimator']}",
            f"{keys['rollout']}={rollout}",
            f"{keys['rollout_n']}={b.rollout_n}",
            f"{keys['tp']}={tp}",
            f"{keys['nnodes']}={nnodes}",
            f"{keys['gpus_per_node']}={gpus_per_node}",
            f"{keys['train_batch_size']}={b.train_batch_size}",
            f"{keys['mini_batch']}={b.mini_batch_size}",
            *(f"{k}={b.micro_batch_size_per_gpu}" for k in keys["micro_batches"]),
            f"{keys['logger']}=[{','.join(logger_list(loggers, shape))}]",
            *_fill(shape["paths"], values), *_fill(shape["fixed"], values),
            *_fill(algo["args"], values)]
    if checkpoint_dir is not None:
        argv += _resume(keys, checkpoint_dir)
    return argv + list(overrides)


def _resume(keys: Mapping[str, Any], checkpoint_dir: str) -> list[str]:
    """Checkpoints under ``checkpoint_dir``, and verl resuming from the newest one there (a
    requeued job's next attempt goes on where the last one saved)."""
    return [f"{keys['checkpoint_dir']}={hydra.quote(checkpoint_dir)}",
            f"{keys['resume_mode']}=auto"]


def job_command(*, model: str, train_files: str, val_files: str, checkpoint_dir: str,
                nnodes: str, gpus_per_node: str, overrides: Sequence[str] = (),
                verl_version: str | None = None) -> list[str]:
    """The trainer argv whose cluster shape the job fills in (``nnodes``, ``gpus_per_node``:
    words it expands, e.g. ``${SLURM_NNODES}``): the paths, the checkpoint directory and the
    shape, then ``overrides``; no batch sizes (verl's own defaults). ``verl_version``: the
    newest in the data file when None."""
    shape = shape_for(verl_version or newest_version())
    keys = shape["keys"]
    paths = {"model": hydra.quote(model), "train_files": hydra.quote(train_files),
             "val_files": hydra.quote(val_files)}
    return ["python3", "-m", shape["module"], *_fill(shape["paths"], paths),
            *_resume(keys, checkpoint_dir), f"{keys['nnodes']}={nnodes}",
            f"{keys['gpus_per_node']}={gpus_per_node}", *overrides]


def hydra_overrides(argv: Sequence[str]) -> list[str]:
    """The hydra overrides of a trainer argv (what follows ``python3 -m MODULE``)."""
    if len(argv) >= 3 and argv[1] == "-m":
        return list(argv[3:])
    return list(argv)


def target_verl(target: Target) -> str:
    """The verl version a matrix target pins (the key into the data file)."""
    p = target.package("verl")
    if p is None:
        raise TrainShapeError(f"{target.where('packages')}: target {target.name} pins no verl")
    return p.version


def target_layer(target: Target) -> str | None:
    """The stack layer a target switches on (``megatron``), whose trainer configuration its
    default command uses; None for none."""
    return target.layer.name if target.layer is not None else None


def default_rollout() -> str:
    """verl's default rollout engine (the catalogue's default engine)."""
    return catalog.shipped().default_engine().name


def target_rollout(target: Target) -> str:
    """The rollout engine that follows the target: its enabled engine pin. A target with none
    (the CPU fixture) gets verl's default engine, for a configuration check."""
    pin = target.engine
    if pin is None:
        return default_rollout()
    engine = catalog.shipped().engine_of({pin.name})
    return engine.name if engine is not None else pin.name


PIN_LABEL = "org.verl-env.{}.{}"  # builder.render.baked: pin.NAME / provided.NAME


def label_pin(labels: Mapping[str, str], name: str) -> str | None:
    """A package's version from an image's OCI labels (a pin or a vendor base's provided)."""
    for kind in ("pin", "provided"):
        value = labels.get(PIN_LABEL.format(kind, name))
        if value:
            return value.split(" ", 1)[0]
    return None


def label_rollout(labels: Mapping[str, str]) -> str | None:
    """The rollout engine an image's labels name (by its distribution's pin), None when
    none."""
    return next((e.name for e in catalog.shipped().engines.values()
                 if e.installable and label_pin(labels, e.distribution)), None)


def engine_modules() -> dict[str, str]:
    """Each rollout engine's import name by verl's ``rollout.name`` (the catalogue's): what the
    in-image checker is told, since it cannot read the catalogue (``--engine NAME=MODULE``)."""
    return {e.name: e.module for e in catalog.shipped().engines.values()}


def engine_args() -> list[str]:
    """:func:`engine_modules` as the in-image checker's arguments."""
    return [w for n, m in engine_modules().items() for w in ("--engine", f"{n}={m}")]


@dataclass(frozen=True)
class TrainShape:
    """What the job checks of a trainer command: is it verl's trainer entry point
    (``python3 -m MODULE`` of a version in the data file), its hydra overrides, and the GPUs it
    waits for (``trainer.nnodes`` x ``n_gpus_per_node``, as words the job expands; verl's
    defaults when the command does not set them)."""

    main_ppo: bool
    overrides: tuple[str, ...]
    nnodes: str
    gpus_per_node: str


def _entry(argv: Sequence[str]) -> Mapping[str, Any] | None:
    """The newest command shape whose trainer module ``argv`` runs (``python3 -m MODULE``)."""
    table = _load(DATA)["verl"]
    for version in sorted(table, key=lambda v: v != newest_version()):
        module = table[version]["module"]
        if module in argv[:3] and argv[argv.index(module) - 1:][:1] == ["-m"]:
            return table[version]
    return None


def train_shape(argv: list[str]) -> TrainShape:
    """The :class:`TrainShape` of a training command's argv (a user's or the default)."""
    shape = _entry(argv)
    if shape is None:
        return TrainShape(False, (), *_defaults(shape_for(newest_version())))
    overrides = tuple(argv[argv.index(shape["module"]) + 1:])
    nnodes, gpus = _defaults(shape)
    keys = shape["keys"]
    for word in overrides:
        key, _, value = word.lstrip("+").partition("=")
        if key == keys["nnodes"]:
            nnodes = value
        elif key == keys["gpus_per_node"]:
            gpus = value
    return TrainShape(True, overrides, nnodes, gpus)


def _defaults(shape: Mapping[str, Any]) -> tuple[str, str]:
    d = shape["trainer_defaults"]
    return str(d["nnodes"]), str(d["gpus_per_node"])


def local_argv(argv: list[str], here: Mapping[str, str]
               ) -> tuple[list[str], int, int] | str:
    """The training argv as the head node will run it, ``$VAR``s that ``here`` knows filled in,
    with its nnodes and GPUs per node; or why it cannot be checked on this host."""
    shape = train_shape(argv)
    if not shape.main_ppo:
        return f"the training command is not {trainer_module()}"
    words = [re.sub(r"\$\{(\w+)\}|\$(\w+)",
                    lambda m: here.get(m.group(1) or m.group(2), m.group(0)), w) for w in argv]
    if any("$" in w for w in words) or not (shape.nnodes.isdigit()
                                            and shape.gpus_per_node.isdigit()):
        return "the command uses variables only the job's nodes set"
    return words, int(shape.nnodes), int(shape.gpus_per_node)
