"""Render sbatch scripts that run verl on several nodes from a verified image (Apptainer or
Singularity SIF, an enroot squashfs or registry image through pyxis, or a ch-run directory).

Pure core: this module only turns a :class:`SlurmJob` into shell text (jinja2,
``StrictUndefined``); the script itself does the work on the cluster. What the script does,
stage by stage, is documented in ``docs/slurm.md`` and in the template's header. The template is
``templates/job/main.j2`` with one include per stage and one per runtime (``job/runtime/``).
"""

from __future__ import annotations

import base64
import os
import re
import shlex
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import jinja2

from builder.matrix import grammar
from builder.errors import SlurmError
from builder.matrix.families import ALL_PHASES, FAMILIES, Family
from builder.files import atomic_write_text

TEMPLATE_DIR = Path(__file__).parent / "templates"
TEMPLATE = "job/main.j2"

RUNTIMES = ("apptainer", "singularity", "pyxis", "ch-run")
#: The template part (``job/runtime/<part>.j2``) of each runtime.
RUNTIME_PARTS = {"apptainer": "apptainer", "singularity": "apptainer", "pyxis": "pyxis",
                 "ch-run": "chrun"}
#: The oldest Slurm the script supports: the one the tests run (Debian 12's 22.05). ``srun
#: --overlap`` came with 20.11, but steps sharing the Ray steps' GPUs and memory through it is
#: documented from 22.05 on, and a step no longer inheriting ``--cpus-per-task`` (which every
#: step here sets) is 22.05's behaviour; checked by the job at setup.
MIN_SLURM = "22.05"
#: Where checkpoints go when the user names no --checkpoint-dir (shared, survives the job).
DEFAULT_CHECKPOINT_DIR = "${SLURM_SUBMIT_DIR}/checkpoints"


# --------------------------------------------------------------------------- family data
#: The per-family NCCL/RCCL profile and runtime flags come from builder.matrix.families (the one place
#: that says what a family means); the job template reads them as ``profile``.
FAMILY_PROFILES: Mapping[str, Family] = FAMILIES
FAMILY_NAMES = tuple(FAMILIES)

#: Variables the job script hands to the container explicitly (besides every ``--env`` name),
#: so that they win over an image ENV of the same name; passed only when set.
PASSED_PREFIXES = ("NCCL_", "RCCL_", "GLOO_", "HSA_", "TORCH_NCCL_", "UCX_", "SLURM_", "RAY_")
PASSED_NAMES = ("HF_HOME", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
                "HIP_VISIBLE_DEVICES",
                "VERL_ENV_TARGET", "VERL_ENV_FAMILY", "VERL_ENV_CPUS_PER_NODE",
                "VERL_ENV_GPUS_PER_NODE", "VERL_ENV_JOB_DIR", "VERL_ENV_NODE_DEVICES",
                "PYTHONUNBUFFERED", "PYTHONNOUSERSITE", "LANG", "TZ")
#: What a runtime that starts from an empty environment needs as well (apptainer sets these
#: itself and refuses them as APPTAINERENV_*).
CLEAN_START_NAMES = ("HOME", "USER")


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
    from)."""
    if not path:
        raise SlurmError(f"{option} is empty")
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
        """verl's PPO trainer with data, model, checkpoints and the cluster shape filled in, then
        the family's trainer overrides (builder.matrix.families: vLLM custom all-reduce off on ROCm)."""
        missing = self.missing_for_trainer()
        if missing:
            raise SlurmError("the default training command (verl.trainer.main_ppo) needs "
                             f"{' and '.join(missing)}; or pass your own --train-cmd")
        words = ["python3", "-m", "verl.trainer.main_ppo",
                 f"data.train_files={self.train_files}", f"data.val_files={self.val_files}",
                 f"actor_rollout_ref.model.path={self.model}",
                 f"trainer.default_local_dir={self.checkpoint_dir}",
                 "trainer.nnodes=${SLURM_NNODES}",
                 "trainer.n_gpus_per_node=${VERL_ENV_GPUS_PER_NODE}", *overrides]
        return " ".join(quote_keep_vars(w) for w in words)


def quote_keep_vars(word: str) -> str:
    """shlex-quote ``word`` for train_argv() while keeping it one word; ``$VAR`` survives since
    shell_word() re-opens those references."""
    return shlex.quote(word) if re.search(r"[^\w@%+=:,./${}-]", word) else word

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VAR_REF = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")
_SBATCH_VALUE = re.compile(r"[A-Za-z0-9_.:,+=@%/-]+")
_CONSTRAINT = re.compile(r"[A-Za-z0-9_.:,+=@%/&|()\[\]*!-]+")
_MEM = re.compile(r"\d+[KMGT]?")
_CPU_BIND = re.compile(r"[a-z_]+(:[0-9a-fx,]+)?(,[a-z_]+(:[0-9a-fx,]+)?)*")
_TIME = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}|INFINITE|UNLIMITED")
_DIGEST = re.compile(r"@sha256:([0-9a-f]{64})$")
_REMOTE = ("oras://", "docker://")


@dataclass(frozen=True)
class RayPorts:
    """Every port a Ray node opens, fixed so that firewalls and ``doctor`` can know them.

    ``gcs``, ``dashboard`` and ``client`` are opened by the head only; the rest by every node.
    """

    gcs: int = 6379
    dashboard: int = 8265
    client: int = 10001
    node_manager: int = 6800
    object_manager: int = 6801
    runtime_env_agent: int = 6802
    dashboard_agent_grpc: int = 6803
    metrics_export: int = 6804
    dashboard_agent_listen: int = 52365
    min_worker: int = 10002
    max_worker: int = 19999

    def head_only(self) -> dict[str, int]:
        """The ports only the head node opens."""
        return {"gcs": self.gcs, "dashboard": self.dashboard, "client": self.client}

    def per_node(self, index: int = 0, stride: int = 0) -> dict[str, int]:
        """The single ports node ``index`` opens (shifted by ``index * stride``)."""
        shift = index * stride
        names = ("node_manager", "object_manager", "runtime_env_agent", "dashboard_agent_grpc",
                 "metrics_export", "dashboard_agent_listen")
        return {n: getattr(self, n) + shift for n in names}

    def worker_range(self, index: int = 0, stride: int = 0) -> range:
        """The worker port range of node ``index`` (inclusive of ``max_worker``)."""
        shift = index * stride
        return range(self.min_worker + shift, self.max_worker + shift + 1)


#: The ports of a job on shared nodes (``--no-exclusive``): one compact block of 400 (head,
#: self-test rendezvous, per-node ports, 390 worker ports), moved by the job id (below).
SHARED_RAY_PORTS = RayPorts(gcs=20000, dashboard=20001, client=20002, node_manager=20004,
                            object_manager=20005, runtime_env_agent=20006,
                            dashboard_agent_grpc=20007, metrics_export=20008,
                            dashboard_agent_listen=20009, min_worker=20010, max_worker=20399)
SHARED_SELFTEST_PORT = 20003
#: Ports stay below Linux's default ephemeral range (32768-60999), where the kernel hands out
#: client ports that a listener could collide with.
PORT_CEILING = 32767
#: Bounds of the numbers a job takes (Slurm's own limits are higher; these are what a verl job
#: can mean: a larger number is a typo).
MAX_NODES = 4096
MAX_GPUS_PER_NODE = 64
MAX_CPUS_PER_TASK = 8192
MAX_SECONDS = 7 * 24 * 3600
MAX_CHECK_INTERVAL = 3600
#: The self-test phases ``--selftest-phases`` may name (the image's ``--phases``).
SELFTEST_PHASES = (*ALL_PHASES, "all")


@dataclass(frozen=True)
class SlurmJob:
    """Everything the generated sbatch script needs. Paths and the training command may use
    ``$VAR``/``${VAR}`` references; the job script expands them on the batch node."""

    target: str
    family: str
    sif: str
    nodes: int | None = None  # None: no #SBATCH line, the allocation decides (sbatch -N)
    gpus_per_node: int | None = None  # None: no #SBATCH line, the allocation decides
    cpus_per_task: int | None = None  # None: no #SBATCH line, the allocation decides
    partition: str | None = None
    time: str | None = None  # None: the partition's default limit
    interface: str = "ib0"
    cache_dir: str = "${HOME}/.cache/verl-env/sif"
    hf_home: str | None = None  # None: the user's HF_HOME, else ${HOME}/.cache/huggingface
    train_cmd: str | None = None  # None: verl's trainer on ``inputs`` (needs data and model)
    inputs: Inputs = field(default_factory=Inputs)
    # site NCCL/RCCL overrides, win last; a None value: passed by name from the submitting
    # environment (a secret's value is never written into the script or the job directory)
    env: Mapping[str, str | None] = field(default_factory=dict)
    runtime: str = "apptainer"
    # site options: a #SBATCH line each, only when given
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    reservation: str | None = None
    mem: str | None = None  # per node, as --mem takes it (0: all of it)
    cpu_bind: str = "cores"  # every step's --cpu-bind (it gets its node's CPUs with -c)
    roce: bool = False  # NCCL_IB_HCA also lists RoCE (Ethernet link layer) ports
    ray_ports: RayPorts | None = None  # None: RayPorts() on whole nodes, SHARED_RAY_PORTS else
    port_stride: int = 0  # >0 only when several Slurm nodes share one host (test clusters)
    # Jobs sharing a node must not share ports: the job's ports move by
    # (SLURM_JOB_ID % port_slots) * the span of its ports. None: 1 on whole nodes (--exclusive),
    # else as many slots as fit below PORT_CEILING. A test cluster that hands the job a free
    # block of its own sets 1.
    port_slots: int | None = None
    # Test clusters only (cpu family): Ray declares this many logical GPUs per node (ray start
    # --num-gpus), so that verl's placement over the nodes can be reached on CPU nodes; the
    # trainer then stops where it needs a real GPU. Never a default.
    ray_logical_gpus: int | None = None
    # The train check the job runs in the image on the head node before Ray (builder.train's
    # incheck.py, which build-env slurm passes in); empty: the job logs that it has none.
    train_checker: bytes = b""
    ray_tmp_root: str = "/tmp"
    ray_wait_timeout: int = 300
    selftest_phases: str | None = None
    selftest_args: str = ""  # more self-test options, e.g. "--strict --bw-ref /shared/bw.json"
    selftest_port: int | None = None  # None: 29500 on whole nodes, SHARED_SELFTEST_PORT else
    selftest_timeout: int = 900
    # while Ray starts, the self-test and training run: seconds between checks that every node
    # of the job still answers (a step on each; a lost node fails the stage, naming it)
    node_check_interval: int = 30
    job_dir: str = "${SLURM_SUBMIT_DIR}/verl-env-${SLURM_JOB_ID}"
    exclusive: bool = True
    job_name: str | None = None
    # build-env trust verify before any node starts: the SIF's attestations (its sidecar, or
    # the registry's referrers for oras://), signed by this public key (and the SIF's own
    # OpenPGP signature with trust_pgp)
    trust_key: str | None = None
    trust_pgp: str | None = None
    # the job's cluster verdict (builder/cluster/verdict.py, run by build-env on the batch
    # host): the site/cluster it holds for (None: Slurm's $SLURM_CLUSTER_NAME) and the SIF it
    # names (None: the SIF the job runs; ch-run runs an unpacked directory: the SIF it was
    # unpacked from)
    cluster: str | None = None
    verdict_sif: str | None = None

    def __post_init__(self) -> None:
        if self.job_name is None:
            object.__setattr__(self, "job_name", f"verl-{self.target}")
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        shared_layout = self.ray_ports is None and not self.exclusive
        if self.ray_ports is None:
            object.__setattr__(self, "ray_ports",
                               SHARED_RAY_PORTS if shared_layout else RayPorts())
        if self.selftest_port is None:
            object.__setattr__(self, "selftest_port",
                               SHARED_SELFTEST_PORT if shared_layout else 29500)
        for name in ("cache_dir", "hf_home", "job_dir", "ray_tmp_root", "verdict_sif",
                     "trust_key", "trust_pgp", "sif"):
            value = getattr(self, name)
            if value is not None and value.startswith("~"):
                object.__setattr__(self, name, home_path(value, f"--{name.replace('_', '-')}"))
        if self.port_slots is None:
            object.__setattr__(self, "port_slots", 1 if self.exclusive else _slots(self))
        validate(self)

    @property
    def ports(self) -> RayPorts:
        """The job's base ports (before the job-id shift; ``ray_ports`` resolved)."""
        assert self.ray_ports is not None
        return self.ray_ports

    @property
    def by_name(self) -> tuple[str, ...]:
        """``--env NAME`` names: passed from the submitting environment, values never written."""
        return tuple(sorted(k for k, v in self.env.items() if v is None))


def _fail(message: str, job: SlurmJob | None = None) -> SlurmError:
    return SlurmError(message, target=job.target if job else None)


def validate(job: SlurmJob) -> None:
    """Raise :class:`SlurmError` naming the first field that cannot make a working script."""
    if job.family not in FAMILY_NAMES:
        raise _fail(f"family must be one of {', '.join(FAMILY_NAMES)}, not {job.family!r}", job)
    if job.runtime not in RUNTIMES:
        raise _fail(f"runtime must be one of {', '.join(RUNTIMES)}, not {job.runtime!r}", job)
    refusal = FAMILY_PROFILES[job.family].chrun_refusal
    if job.runtime == "ch-run" and refusal:
        raise _fail(f"--runtime ch-run is refused for the {job.family} family: {refusal}", job)
    if job.runtime == "ch-run" and job.sif.startswith(_REMOTE):
        raise _fail("ch-run runs a local image directory; unpack the image on the shared "
                    f"filesystem and pass its path instead of {job.sif!r}", job)
    if job.trust_key and job.runtime == "ch-run":
        raise _fail("--trust-key checks a SIF (or its registry reference); ch-run runs an "
                    "unpacked directory, which carries no attestations", job)
    _check_image(job)
    if job.cluster is not None and not _SBATCH_VALUE.fullmatch(job.cluster):
        raise _fail(f"cluster {job.cluster!r} has characters a cluster name cannot hold", job)
    if job.verdict_sif is not None and not job.verdict_sif.endswith(".sif"):
        raise _fail(f"--verdict-sif names the SIF the image came from (a .sif file), not "
                    f"{job.verdict_sif!r}", job)
    if job.trust_pgp and not job.trust_key:
        raise _fail("--trust-pgp goes with --trust-key", job)
    _check_numbers(job)
    _check_grammar(job)
    _check_sbatch_values(job)
    _check_env(job)
    if job.sif.startswith(_REMOTE) and not _DIGEST.search(job.sif):
        raise _fail(f"SIF reference {job.sif!r} must be pinned by digest (…@sha256:<64 hex>): "
                    "the shared cache is keyed by digest", job)
    if job.train_cmd is not None and not job.train_cmd.strip():
        raise _fail("the training command is empty", job)
    try:
        command = training_command(job)
    except SlurmError as exc:
        raise _fail(str(exc), job) from None
    try:
        shlex.split(job.selftest_args)
    except ValueError as exc:
        raise _fail(f"cannot split the self-test arguments: {exc}", job) from None
    _check_phases(job)
    _check_ports(job)
    for text in (job.cache_dir, job.hf_home or "", job.verdict_sif or "", job.runtime,
                 job.ray_tmp_root, job.job_dir, job.selftest_phases or "", job.selftest_args,
                 job.sif, job.trust_key or "", job.trust_pgp or "",
                 *(v for v in job.env.values() if v is not None), command,
                 *(p for b in job.inputs.all_binds() for p in (b.src, b.dst))):
        try:
            shell_word(text)
        except ValueError as exc:
            raise _fail(str(exc), job) from None


def _bounded(job: SlurmJob, name: str, value: int | None, low: int, high: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(f"{name} must be a whole number from {low} to {high}, not {value!r}", job)


def _check_numbers(job: SlurmJob) -> None:
    """Every number within what a verl job can mean (a larger one is a typo)."""
    _bounded(job, "nodes", job.nodes, 1, MAX_NODES)
    _bounded(job, "cpus_per_task", job.cpus_per_task, 1, MAX_CPUS_PER_TASK)
    _bounded(job, "gpus_per_node", job.gpus_per_node, 0, MAX_GPUS_PER_NODE)
    if job.gpus_per_node is not None:
        if job.family != "cpu" and job.gpus_per_node < 1:
            raise _fail(f"a {job.family} job needs gpus_per_node >= 1", job)
        if job.family == "cpu" and job.gpus_per_node > 0:
            raise _fail("a cpu job asks for no GPUs (gpus_per_node must be 0 or unset)", job)
    for name in ("ray_wait_timeout", "selftest_timeout"):
        _bounded(job, name, getattr(job, name), 1, MAX_SECONDS)
    _bounded(job, "node_check_interval", job.node_check_interval, 1, MAX_CHECK_INTERVAL)
    _bounded(job, "port_stride", job.port_stride, 0, 10000)
    _bounded(job, "ray_logical_gpus", job.ray_logical_gpus, 1, MAX_GPUS_PER_NODE)
    if job.ray_logical_gpus is not None and job.family != "cpu":
        raise _fail("logical GPUs for Ray are for cpu test clusters only; a GPU job's Ray "
                    "counts the allocation's GPUs", job)


def _check_sbatch_values(job: SlurmJob) -> None:
    """What goes onto a #SBATCH line or into a Slurm option: Slurm's own syntax only."""
    for name in ("target", "job_name", "partition", "interface", "account", "qos", "reservation"):
        value = getattr(job, name)
        if value is not None and not _SBATCH_VALUE.fullmatch(value):
            raise _fail(f"{name} {value!r} has characters a Slurm option cannot hold", job)
    if job.constraint is not None and not _CONSTRAINT.fullmatch(job.constraint):
        raise _fail(f"constraint {job.constraint!r} is not a Slurm feature expression", job)
    if job.mem is not None and not _MEM.fullmatch(job.mem):
        raise _fail(f"mem {job.mem!r} is not a Slurm memory size (e.g. 500G, 0 for all)", job)
    if not _CPU_BIND.fullmatch(job.cpu_bind):
        raise _fail(f"cpu_bind {job.cpu_bind!r} is not a Slurm --cpu-bind value", job)
    if job.time is not None and not _TIME.fullmatch(job.time):
        raise _fail(f"time {job.time!r} is not a Slurm time (MM, MM:SS, HH:MM:SS, D-HH, "
                    "D-HH:MM, D-HH:MM:SS or UNLIMITED)", job)


#: The string fields that reach the template, by the grammar each must fit (builder.matrix.grammar);
#: the template then quotes what it emits (shell_word), so only $NAME/${NAME} expand.
_PATH_FIELDS = ("sif", "cache_dir", "hf_home", "ray_tmp_root", "job_dir", "trust_key",
                "trust_pgp", "verdict_sif")
_PLAIN_FIELDS = ("target", "job_name", "partition", "interface", "account", "qos", "reservation",
                 "constraint", "mem", "cpu_bind", "time", "cluster", "selftest_phases",
                 "selftest_args", "train_cmd")


def _check_grammar(job: SlurmJob) -> None:
    checks: list[tuple[str, object, object]] = []
    checks += [(n, getattr(job, n), grammar.path) for n in _PATH_FIELDS]
    checks += [(n, getattr(job, n), grammar.plain) for n in _PLAIN_FIELDS]
    checks += [(f"env {k}", k, grammar.env_name) for k in job.env]
    checks += [(f"env {k}", v, grammar.plain) for k, v in job.env.items()]
    checks += [(b.what, p, grammar.path) for b in job.inputs.all_binds() for p in (b.src, b.dst)]
    for what, value, check in checks:
        if value is None:
            continue
        try:
            check(value)  # type: ignore[operator]
        except grammar.GrammarError as exc:
            raise _fail(f"{what}: {exc}", job) from None


def _check_env(job: SlurmJob) -> None:
    for key, value in job.env.items():
        if not _NAME.fullmatch(key):
            raise _fail(f"environment name {key!r} is not a valid shell variable name", job)
        if value is not None and not isinstance(value, str):
            raise _fail(f"environment value of {key} must be text or None (passed by name)",
                        job)


def _check_phases(job: SlurmJob) -> None:
    if job.selftest_phases is None:
        return
    names = [p.strip() for p in job.selftest_phases.split(",")]
    bad = [p for p in names if p not in SELFTEST_PHASES]
    if not names or bad:
        raise _fail(f"--selftest-phases {job.selftest_phases!r}: unknown phase(s) "
                    f"{', '.join(repr(p) for p in bad) or '(none named)'}; choose from "
                    f"{', '.join(SELFTEST_PHASES)}", job)


def _check_image(job: SlurmJob) -> None:
    """The image each runtime can run: pyxis an enroot squashfs or a registry image by digest;
    apptainer and singularity a SIF (path, oras:// or docker://)."""
    if job.runtime == "pyxis":
        if job.sif.startswith("oras://"):
            raise _fail("pyxis (enroot) imports OCI images, not SIF artifacts: pass "
                        "docker://REGISTRY/IMAGE@sha256:… or an enroot .sqsh (build-env sqsh)",
                        job)
        if not job.sif.startswith("docker://") and job.sif.endswith(".sif"):
            raise _fail(f"pyxis runs an enroot squashfs (.sqsh, from build-env sqsh), not the "
                        f"SIF {job.sif!r}", job)
        if job.trust_key:
            raise _fail("--trust-key checks a SIF and its attestations; with pyxis run "
                        "build-env trust verify on the image reference before submitting", job)
        for b in job.inputs.all_binds():
            if "," in b.src + b.dst or ":" in b.src + b.dst:
                raise _fail(f"pyxis takes its mounts as one comma- and colon-separated list: "
                            f"the bind {b.src}:{b.dst} cannot hold ',' or ':'", job)
    elif job.runtime != "ch-run" and job.sif.endswith(".sqsh"):
        raise _fail(f"{job.sif!r} is an enroot squashfs: run it with --runtime pyxis (or pass "
                    f"a SIF to {job.runtime})", job)


def pyxis_image(source: str) -> str:
    """What ``srun --container-image`` takes: a path as it is; ``docker://REG/IMG@sha256:…``
    in enroot's form ``REG#IMG@sha256:…`` (a first component without ``.`` or ``:`` is a
    Docker Hub namespace, passed as it is)."""
    if not source.startswith("docker://"):
        return source
    ref = source[len("docker://"):]
    first, sep, rest = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return ref


def sbatch_options(job: SlurmJob) -> list[tuple[str, str | None]]:
    """The #SBATCH lines beyond the tasks per node, only for what was asked."""
    out: list[tuple[str, str | None]] = []
    for option, value in (("nodes", job.nodes), ("cpus-per-task", job.cpus_per_task),
                          ("gpus-per-node", job.gpus_per_node), ("mem", job.mem),
                          ("partition", job.partition), ("account", job.account),
                          ("qos", job.qos), ("constraint", job.constraint),
                          ("reservation", job.reservation), ("time", job.time)):
        if value:
            out.append((option, str(value)))
    if job.exclusive:
        out.append(("exclusive", None))
    return out


def job_devices(job: SlurmJob) -> tuple[str, ...]:
    """Device paths bound into the container when a node has them. ch-run shares the host's
    /dev; pyxis leaves NVIDIA GPUs and InfiniBand to enroot's hooks."""
    profile = FAMILY_PROFILES[job.family]
    if job.runtime == "ch-run":
        return ()
    if job.runtime == "pyxis":
        return (*profile.pyxis_devices, *profile.node_devices)
    return ("/dev/infiniband", *profile.node_devices)


def training_command(job: SlurmJob) -> str:
    """``--train-cmd``, else verl's trainer on the job's data and model (refused without them)."""
    return job.train_cmd if job.train_cmd is not None else job.inputs.trainer_command(
        FAMILY_PROFILES[job.family].trainer_overrides)


def _port_claims(job: SlurmJob) -> list[tuple[int, str]]:
    """Every port the job opens before its job-id shift, with what opens it."""
    ports = job.ports
    claims = [(p, f"head {n}") for n, p in ports.head_only().items()]
    claims.append((job.selftest_port or 0, "self-test rendezvous"))
    for i in range((job.nodes or 1) if job.port_stride else 1):
        claims += [(p, f"node {i} {n}") for n, p in ports.per_node(i, job.port_stride).items()]
        claims += [(p, f"node {i} worker range") for p in ports.worker_range(i, job.port_stride)]
    return claims


def port_span(job: SlurmJob) -> int:
    """How far apart two jobs' port blocks are: the span of the job's ports."""
    claimed = [p for p, _ in _port_claims(job)]
    return max(claimed) - min(claimed) + 1


def _slots(job: SlurmJob) -> int:
    """How many job-id slots fit between the job's ports and PORT_CEILING (at least 1)."""
    try:
        top = max(p for p, _ in _port_claims(job))
        return max(1, (PORT_CEILING - top) // port_span(job) + 1)
    except (TypeError, ValueError):  # validate() names what is wrong
        return 1


def _check_ports(job: SlurmJob) -> None:
    ports = job.ports
    seen: dict[int, str] = {}
    if ports.min_worker > ports.max_worker:
        raise _fail("min_worker port is above max_worker", job)
    if job.port_stride and job.nodes is None:
        raise _fail("a per-node port stride needs the node count (nodes)", job)
    slots = job.port_slots or 1
    if slots < 1:
        raise _fail("port_slots must be >= 1", job)
    top = (slots - 1) * port_span(job)
    for port, what in _port_claims(job):
        if not 1024 <= port <= 65535 - top:
            raise _fail(f"{what} port {port} is outside 1024-{65535 - top}"
                        + (f" (the job-id shift adds up to {top})" if top else ""), job)
        if port in seen:
            raise _fail(f"port {port} is used twice ({seen[port]} and {what})", job)
        seen[port] = what


def shell_word(text: str) -> str:
    """Quote ``text`` as one double-quoted shell word in which only ``$NAME`` and ``${NAME}``
    expand; every other ``$``, backquote, backslash and quote is literal. Raises ValueError on
    control characters."""
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ValueError(f"{text!r} contains control characters")
    out, pos = [], 0
    for match in _VAR_REF.finditer(text):
        out.append(_escape(text[pos:match.start()]))
        out.append(match.group(0))
        pos = match.end()
    out.append(_escape(text[pos:]))
    return '"' + "".join(out) + '"'


def _escape(text: str) -> str:
    return re.sub(r'([\\"$`])', r"\\\1", text)


def train_argv(cmd: str) -> list[str]:
    """Split the training command like a shell would (no pipes, redirections or ``$(...)``)."""
    try:
        argv = shlex.split(cmd)
    except ValueError as exc:
        raise SlurmError(f"cannot split the training command: {exc}") from None
    if any(tok in {"|", "||", "&&", ";", "&", ">", "<"} for tok in argv):
        raise SlurmError("the training command must be one command; wrap pipelines in "
                         "`bash -c '...'` inside the image")
    return argv


@dataclass(frozen=True)
class TrainShape:
    """What the job checks of verl's trainer command: is it ``verl.trainer.main_ppo``, its
    hydra overrides, and the GPUs it waits for (``trainer.nnodes`` x ``n_gpus_per_node``, as
    words the job expands; verl's defaults 1 and 8 when the command does not set them)."""

    main_ppo: bool
    overrides: tuple[str, ...]
    nnodes: str
    gpus_per_node: str


def train_shape(argv: list[str]) -> TrainShape:
    main_ppo = "verl.trainer.main_ppo" in argv[:3] and argv[argv.index(
        "verl.trainer.main_ppo") - 1:][:1] == ["-m"]
    overrides = tuple(argv[argv.index("verl.trainer.main_ppo") + 1:]) if main_ppo else ()
    nnodes, gpus = "1", "8"
    for word in overrides:
        key, _, value = word.lstrip("+").partition("=")
        if key == "trainer.nnodes":
            nnodes = value
        elif key == "trainer.n_gpus_per_node":
            gpus = value
    return TrainShape(main_ppo, overrides, nnodes, gpus)


def sif_cache_name(source: str) -> str | None:
    """File name of a pulled SIF in the shared cache (by scheme and digest), None for a path."""
    if not source.startswith(_REMOTE):
        return None
    match = _DIGEST.search(source)
    if match is None:  # validate() refuses this earlier; keep the function total
        raise SlurmError(f"{source!r} is not pinned by digest")
    return f"{source.split('://', 1)[0]}-sha256-{match.group(1)}.sif"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        comment_start_string="{##",  # bash's ${#array[@]} must not open a jinja comment
        comment_end_string="##}",
    )
    env.filters["sh"] = shell_word
    env.filters["lit"] = lambda text: '"' + _escape(text) + '"'  # shown as is: no $VAR expansion
    return env


def render_sbatch(job: SlurmJob) -> str:
    """Return the sbatch script for ``job`` as text."""
    validate(job)
    values = {f.name: getattr(job, f.name) for f in fields(job)}
    values.update(
        env={k: v for k, v in sorted(job.env.items()) if v is not None},
        by_name=job.by_name,
        ports=job.ports,
        port_span=port_span(job),
        train_argv=train_argv(training_command(job)),
        profile=FAMILY_PROFILES[job.family],
        binds=job.inputs.all_binds(),
        path_checks=job.inputs.checks(),
        checkpoint_dir=job.inputs.checkpoint_dir,
        passed_prefixes=PASSED_PREFIXES,
        passed_names=PASSED_NAMES + (CLEAN_START_NAMES if job.runtime in ("pyxis", "ch-run")
                                     else ()),
        sbatch_options=sbatch_options(job),
        train_shape=train_shape(train_argv(training_command(job))),
        checker_b64=base64.b64encode(job.train_checker).decode(),
        runtime_part=RUNTIME_PARTS[job.runtime],
        pyxis_image=pyxis_image(job.sif),
        devices=job_devices(job),
        min_slurm=MIN_SLURM,
        env_prefix="SINGULARITYENV_" if job.runtime == "singularity" else "APPTAINERENV_",
        selftest_argv=shlex.split(job.selftest_args),
        sif_name=None if job.runtime == "pyxis" else sif_cache_name(job.sif),
        generator="build-env slurm",
    )
    return _environment().get_template(TEMPLATE).render(**values)


def write_sbatch(job: SlurmJob, path: str | os.PathLike[str]) -> Path:
    """Write the script atomically (temp file in the same directory, then rename), mode 0755."""
    dest = Path(path)
    atomic_write_text(dest, render_sbatch(job), mode=0o755)
    return dest


def parse_env(items: list[str] | None) -> dict[str, str | None]:
    """``["K=V", "NAME", ...]`` from repeated ``--env`` options into a dict (later wins); a
    bare ``NAME`` maps to None: passed by name from the submitting environment, its value never
    written into the script (secrets: ``--env WANDB_API_KEY``)."""
    out: dict[str, str | None] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not _NAME.fullmatch(key):
            raise SlurmError(f"--env expects NAME or NAME=VALUE, got {item!r}")
        out[key] = value if sep else None
    return out


def job_warnings(job: SlurmJob) -> list[str]:
    """What the user should know before submitting (printed by ``build-env slurm``)."""
    out = []
    if not job.exclusive and job.cpus_per_task is None:
        out.append("--no-exclusive without --cpus-per-task: Slurm gives the job 1 CPU per "
                   "node, and Ray gets --num-cpus 1 (verl's workers then wait for CPUs); "
                   "pass --cpus-per-task N")
    return out


def image_source(sif: str) -> str:
    """The image the job runs as ``--sif`` names it: a registry reference (``oras://``,
    ``docker://``) or a ``$VAR`` path as given, any other path made absolute."""
    return sif if sif.startswith(_REMOTE + ("$",)) else absolute_path(sif, "--sif")
