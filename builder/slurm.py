"""Render sbatch scripts that run verl on several nodes from a verified Apptainer image.

Pure core: this module only turns a :class:`SlurmJob` into shell text (jinja2,
``StrictUndefined``); the script itself does the work on the cluster. What the script does,
stage by stage, is documented in ``docs/slurm.md`` and in the template's header.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import jinja2

from builder.errors import SlurmError

FAMILIES = ("cuda", "rocm", "cpu")
TEMPLATE_DIR = Path(__file__).parent / "templates"
TEMPLATE = "job.sbatch.j2"

#: verl's PPO trainer entry, with the cluster shape filled in by the job script from Slurm.
DEFAULT_TRAIN_CMD = (
    "python3 -m verl.trainer.main_ppo trainer.nnodes=${SLURM_NNODES} "
    "trainer.n_gpus_per_node=${VERL_ENV_GPUS_PER_NODE}"
)

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VAR_REF = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")
_SBATCH_VALUE = re.compile(r"[A-Za-z0-9_.:,+=@%/-]+")
_TIME = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}|\d+-\d+")
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


@dataclass(frozen=True)
class SlurmJob:
    """Everything the generated sbatch script needs. Paths and the training command may use
    ``$VAR``/``${VAR}`` references; the job script expands them on the batch node."""

    target: str
    family: str
    sif: str
    nodes: int = 2
    gpus_per_node: int | None = None  # None: 8 for cuda/rocm, 0 for cpu
    cpus_per_task: int = 32
    partition: str | None = None
    time: str = "04:00:00"
    interface: str = "ib0"
    cache_dir: str = "${HOME}/.cache/verl-env/sif"
    hf_home: str = "${HOME}/.cache/huggingface"
    train_cmd: str = DEFAULT_TRAIN_CMD
    env: Mapping[str, str] = field(default_factory=dict)  # site NCCL/RCCL overrides, win last
    runtime: str = "apptainer"
    ray_ports: RayPorts = field(default_factory=RayPorts)
    port_stride: int = 0  # >0 only when several Slurm nodes share one host (test clusters)
    ray_tmp_root: str = "/tmp"
    ray_wait_timeout: int = 300
    selftest_phases: str | None = None
    selftest_args: str = ""  # more self-test options, e.g. "--strict --bw-ref /shared/bw.json"
    selftest_port: int = 29500
    selftest_timeout: int = 900
    job_dir: str = "${SLURM_SUBMIT_DIR}/verl-env-${SLURM_JOB_ID}"
    exclusive: bool = True
    job_name: str | None = None

    def __post_init__(self) -> None:
        if self.gpus_per_node is None:
            object.__setattr__(self, "gpus_per_node", 0 if self.family == "cpu" else 8)
        if self.job_name is None:
            object.__setattr__(self, "job_name", f"verl-{self.target}")
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        validate(self)


def _fail(message: str, job: SlurmJob | None = None) -> SlurmError:
    return SlurmError(message, target=job.target if job else None)


def validate(job: SlurmJob) -> None:
    """Raise :class:`SlurmError` naming the first field that cannot make a working script."""
    if job.family not in FAMILIES:
        raise _fail(f"family must be one of {', '.join(FAMILIES)}, not {job.family!r}", job)
    gpus = job.gpus_per_node or 0
    if job.nodes < 1 or job.cpus_per_task < 1 or gpus < 0:
        raise _fail("nodes and cpus_per_task must be >= 1 and gpus_per_node >= 0", job)
    if job.family != "cpu" and gpus < 1:
        raise _fail(f"a {job.family} job needs gpus_per_node >= 1", job)
    for name in ("target", "job_name", "partition", "interface"):
        value = getattr(job, name)
        if value is not None and not _SBATCH_VALUE.fullmatch(value):
            raise _fail(f"{name} {value!r} has characters a Slurm option cannot hold", job)
    if not _TIME.fullmatch(job.time):
        raise _fail(f"time {job.time!r} is not a Slurm time (MM, HH:MM:SS or D-HH:MM:SS)", job)
    for key in job.env:
        if not _NAME.fullmatch(key):
            raise _fail(f"environment name {key!r} is not a valid shell variable name", job)
    if job.sif.startswith(_REMOTE) and not _DIGEST.search(job.sif):
        raise _fail(f"SIF reference {job.sif!r} must be pinned by digest (…@sha256:<64 hex>): "
                    "the shared cache is keyed by digest", job)
    if not job.train_cmd.strip():
        raise _fail("the training command is empty", job)
    try:
        shlex.split(job.selftest_args)
    except ValueError as exc:
        raise _fail(f"cannot split the self-test arguments: {exc}", job) from None
    for timeout in (job.ray_wait_timeout, job.selftest_timeout):
        if timeout < 1:
            raise _fail("timeouts must be >= 1 s", job)
    _check_ports(job)
    for text in (job.cache_dir, job.hf_home, job.runtime, job.ray_tmp_root, job.job_dir,
                 job.selftest_phases or "", job.selftest_args, *job.env.values(), job.train_cmd):
        try:
            shell_word(text)
        except ValueError as exc:
            raise _fail(str(exc), job) from None


def _check_ports(job: SlurmJob) -> None:
    ports = job.ray_ports
    seen: dict[int, str] = {}
    claims = [(p, f"head {n}") for n, p in ports.head_only().items()]
    claims.append((job.selftest_port, "self-test rendezvous"))
    for i in range(job.nodes if job.port_stride else 1):
        claims += [(p, f"node {i} {n}") for n, p in ports.per_node(i, job.port_stride).items()]
        claims += [(p, f"node {i} worker range") for p in ports.worker_range(i, job.port_stride)]
    if ports.min_worker > ports.max_worker:
        raise _fail("min_worker port is above max_worker", job)
    for port, what in claims:
        if not 1024 <= port <= 65535:
            raise _fail(f"{what} port {port} is outside 1024-65535", job)
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
    return env


def render_sbatch(job: SlurmJob) -> str:
    """Return the sbatch script for ``job`` as text."""
    validate(job)
    values = {f.name: getattr(job, f.name) for f in fields(job)}
    values.update(
        env=dict(sorted(job.env.items())),
        ports=job.ray_ports,
        node_ports=job.ray_ports.per_node(),
        train_argv=train_argv(job.train_cmd),
        selftest_argv=shlex.split(job.selftest_args),
        sif_name=sif_cache_name(job.sif),
        generator="build-env slurm",
    )
    return _environment().get_template(TEMPLATE).render(**values)


def write_sbatch(job: SlurmJob, path: str | os.PathLike[str]) -> Path:
    """Write the script atomically (temp file in the same directory, then rename), mode 0755."""
    text = render_sbatch(job)
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def parse_env(items: list[str] | None) -> dict[str, str]:
    """``["K=V", ...]`` from repeated ``--env`` options into a dict (later wins)."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not _NAME.fullmatch(key):
            raise SlurmError(f"--env expects NAME=VALUE, got {item!r}")
        out[key] = value
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``build-env slurm`` (the CLI adds ``--target`` and resolves it to a family)."""
    d = SlurmJob(target="t", family="cpu", sif="x.sif")
    parser.add_argument("--family", choices=FAMILIES, help="accelerator family of the target")
    parser.add_argument("--nodes", type=int, default=d.nodes)
    parser.add_argument("--gpus-per-node", type=int, default=None, help="default 8 (0 for cpu)")
    parser.add_argument("--cpus-per-task", type=int, default=d.cpus_per_task,
                        help="CPUs per node for Ray (--num-cpus)")
    parser.add_argument("--partition", default=None)
    parser.add_argument("--time", default=d.time)
    parser.add_argument("--interface", default=d.interface,
                        help="network interface for Ray, NCCL and gloo (default ib0)")
    parser.add_argument("--sif", default=None,
                        help="oras://…@sha256:… or docker://…@sha256:… or a .sif path")
    parser.add_argument("--cache-dir", default=d.cache_dir, help="shared SIF cache directory")
    parser.add_argument("--hf-home", default=d.hf_home, help="shared Hugging Face cache")
    parser.add_argument("--train-cmd", default=d.train_cmd, help="training command in the image")
    parser.add_argument("--env", action="append", metavar="KEY=VALUE",
                        help="site NCCL/RCCL setting exported by the script (repeatable)")
    parser.add_argument("--runtime", default=d.runtime, help="container runtime command")
    parser.add_argument("--selftest-phases", default=None, help="phases for the node self-test")
    parser.add_argument("--selftest-args", default="",
                        help="more self-test options (e.g. '--strict --bw-ref FILE')")
    parser.add_argument("--ray-wait-timeout", type=int, default=d.ray_wait_timeout)
    parser.add_argument("--output", "-o", default=None, help="write here (default: stdout)")


def job_from_args(args: argparse.Namespace) -> SlurmJob:
    """Build a :class:`SlurmJob` from parsed ``build-env slurm`` options."""
    family = getattr(args, "family", None)
    if family is None:
        raise SlurmError("no accelerator family: pass --family (or a --target the CLI resolves)")
    if not getattr(args, "sif", None):
        raise SlurmError("no image: pass --sif (oras://…@sha256:…, docker://…@sha256:… or a path)")
    return SlurmJob(
        target=getattr(args, "target", None) or family, family=family, sif=args.sif,
        nodes=args.nodes, gpus_per_node=args.gpus_per_node, cpus_per_task=args.cpus_per_task,
        partition=args.partition, time=args.time, interface=args.interface,
        cache_dir=args.cache_dir, hf_home=args.hf_home, train_cmd=args.train_cmd,
        env=parse_env(args.env), runtime=args.runtime, selftest_phases=args.selftest_phases,
        selftest_args=args.selftest_args,
        ray_wait_timeout=args.ray_wait_timeout,
    )


def run(args: argparse.Namespace) -> int:
    """Entry point of ``build-env slurm``: 0 written, 2 bad input."""
    try:
        job = job_from_args(args)
        if args.output:
            path = write_sbatch(job, args.output)
            print(f"wrote {path} (submit with: sbatch {shlex.quote(str(path))})")
        else:
            sys.stdout.write(render_sbatch(job))
    except SlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0
