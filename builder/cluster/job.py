"""The Slurm job as a model: :class:`SlurmJob`, everything the sbatch script that runs verl on
several nodes from a verified image needs, and :func:`validate`, which refuses a field that
cannot make a working script. Pure: :mod:`builder.cluster.render` turns a job into shell text;
its inputs are :mod:`builder.cluster.inputs`, its ports :mod:`builder.cluster.ports`, what
differs per container runtime :mod:`builder.cluster.runtime`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from builder.cluster.inputs import DEFAULT_JOB_DIR, Inputs, absolute_path, home_path
from builder.cluster.requeue import Resilience
from builder.cluster.ports import (SHARED_RAY_PORTS, SHARED_SELFTEST_PORT, RayPorts, check_ports,
                                   slot_count)
from builder.cluster.runtime import DIGEST, REMOTE, RUNTIMES
from builder.cluster.shell import shell_word
from builder.errors import SlurmError
from builder.matrix import grammar
from builder.matrix.families import ALL_PHASES, FAMILIES, Family

# --------------------------------------------------------------------------- family data
#: The per-family NCCL/RCCL profile and runtime flags come from builder.matrix.families (the one place
#: that says what a family means); the job template reads them as ``profile``.
FAMILY_PROFILES: Mapping[str, Family] = FAMILIES
FAMILY_NAMES = tuple(FAMILIES)

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SBATCH_VALUE = re.compile(r"[A-Za-z0-9_.:,+=@%/-]+")
_CONSTRAINT = re.compile(r"[A-Za-z0-9_.:,+=@%/&|()\[\]*!-]+")
_MEM = re.compile(r"\d+[KMGT]?")
_CPU_BIND = re.compile(r"[a-z_]+(:[0-9a-fx,]+)?(,[a-z_]+(:[0-9a-fx,]+)?)*")
_TIME = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}|INFINITE|UNLIMITED")

#: Bounds of the numbers a job takes (Slurm's own limits are higher; these are what a verl job
#: can mean: a larger number is a typo).
MAX_NODES = 4096
MAX_GPUS_PER_NODE = 64
MAX_CPUS_PER_TASK = 8192
MAX_SECONDS = 7 * 24 * 3600
MAX_CHECK_INTERVAL = 3600
MAX_RAY_START_ATTEMPTS = 10  # each failed start costs about 40 s of the allocation
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
    # incheck.pyz, which build-env slurm passes in); empty: the job logs that it has none.
    train_checker: bytes = b""
    ray_tmp_root: str = "/tmp"
    ray_wait_timeout: int = 300
    # Ray started on every node at most this many times when a node's Ray gives up with its
    # own startup timeout ("The current node timed out during startup": a busy node)
    ray_start_attempts: int = 3
    selftest_phases: str | None = None
    selftest_args: str = ""  # more self-test options, e.g. "--strict --bw-ref /shared/bw.json"
    selftest_port: int | None = None  # None: 29500 on whole nodes, SHARED_SELFTEST_PORT else
    selftest_timeout: int = 900
    # while Ray starts, the self-test and training run: seconds between checks that every node
    # of the job still answers (a step on each; a lost node fails the stage, naming it)
    node_check_interval: int = 30
    job_dir: str = DEFAULT_JOB_DIR
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
    resilience: Resilience = field(default_factory=Resilience)  # requeue and resume

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
            object.__setattr__(self, "port_slots", 1 if self.exclusive else slot_count(self))
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
    if job.runtime == "ch-run" and job.sif.startswith(REMOTE):
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
    if job.sif.startswith(REMOTE) and not DIGEST.search(job.sif):
        raise _fail(f"SIF reference {job.sif!r} must be pinned by digest (…@sha256:<64 hex>): "
                    "the shared cache is keyed by digest", job)
    if job.train_cmd is not None and not job.train_cmd.strip():
        raise _fail("the training command is empty", job)
    try:
        command = training_command(job)
    except SlurmError as exc:
        raise _fail(str(exc), job) from None
    try:
        words = shlex.split(job.selftest_args)
    except ValueError as exc:
        raise _fail(f"cannot split the self-test arguments: {exc}", job) from None
    _check_selftest_args(job, words)
    _check_phases(job)
    check_ports(job)
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
    _bounded(job, "ray_start_attempts", job.ray_start_attempts, 1, MAX_RAY_START_ATTEMPTS)
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


def _check_selftest_args(job: SlurmJob, words: list[str]) -> None:
    """``--selftest-args`` read by the self-test's own parser (builder.selftest.cli), here:
    what it would refuse on every node after the allocation is refused when the job is
    written; ``--json`` is the job's (it reads each node's report)."""
    # the self-test's own parser (stdlib-only, shipped into images), only for --selftest-args
    from builder.selftest.cli import UsageError, read_args

    if {"-h", "--help", "--version"} & set(words):
        raise _fail("--selftest-args: --help and --version run no self-test", job)
    try:
        parsed = read_args(words)
    except UsageError as exc:
        raise _fail(f"--selftest-args {job.selftest_args!r}: the self-test refuses it: {exc}",
                    job) from None
    if "json" in parsed.changed:
        raise _fail("--selftest-args: --json is set by the job (it reads each node's report)",
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



def training_command(job: SlurmJob) -> str:
    """``--train-cmd``, else verl's trainer on the job's data and model (refused without them)."""
    return job.train_cmd if job.train_cmd is not None else job.inputs.trainer_command(
        FAMILY_PROFILES[job.family].trainer_overrides)




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
    return sif if sif.startswith(REMOTE + ("$",)) else absolute_path(sif, "--sif")
