"""Fixtures for the Slurm tests: a real two-node Slurm on this host (and a three-node one for the
requeue tests) and free port blocks.

The cluster is Debian's slurmctld + two ``slurmd -N nodeI`` on localhost with ``auth/none``
(research/feasibility.md §2), binding every task to the cores of its CPUs (``task/affinity``,
``TaskPluginParam=Cores``) as production clusters do. ``pyxis_cluster`` is a second one with NVIDIA's pyxis loaded through
``plugstack.conf`` and enroot on each slurmd's PATH, both built here from their source snapshots
(tests/slurm/enroot.py). A real ``TaskProlog`` exports the ``KEY=VALUE`` lines of
``<root>/node-env/<node>.env`` into every task on that node (how a site prolog or module setup
can leave one node's environment different); tests use it to break one node on purpose. Every
daemon is started here and stopped here by its PID, also
when a test fails.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.slurm.unit_runtime import standin_runtime  # noqa: F401  (fixture for the unit tests)
from tests.trust.conftest import keypair  # noqa: F401  (signs the job's cluster verdict)

SLURM_TOOLS = ("slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "srun")


@pytest.fixture(scope="session")
def fixture_sif(cpu_image: dict, docker_host: str) -> Iterator[tuple[Path, Path]]:
    """The verified fixture image as a native SIF (``build-env sif --no-run``) and what that SIF
    holds, unpacked for ch-run, its image ENV in ``/ch/environment`` as ``ch-convert`` writes
    it: ``(SIF, directory)``. Made once for the group: every ch-run job runs this tree, and the
    cluster verdict names this SIF (it used to be a ``docker export`` per test module).
    Uncompressed (``--compression none``), as the pyxis tests' squashfs: gzip of the 2 GiB
    fixture is about 70 CPU-seconds, which no test here is about (tests/sif and the main job
    extended convert with gzip)."""
    for tool in ("ch-run", "mksquashfs", "unsquashfs"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (scripts/os-packages.sh)")
    from builder.sif import format as sif_format
    from tests.conftest import run_build_env

    root = Path(tempfile.mkdtemp(prefix="verl-env-clsif-", dir="/var/tmp"))
    sif = root / "cpu-x86_64.sif"
    try:
        start = time.monotonic()
        proc = run_build_env("sif", "--image", cpu_image["image_id"], "--no-run",
                             "--compression", "none", "--output", str(sif),
                             env={"DOCKER_HOST": docker_host}, timeout=1800)
        assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
        built = time.monotonic() - start
        info = sif_format.read_info(sif)
        part = info.primary_partition()
        assert part is not None
        dest = root / "img"
        subprocess.run(["unsquashfs", "-no-progress", "-o", str(part.offset), "-d", str(dest),
                        str(sif)], check=True, stdout=subprocess.DEVNULL)
        config = next(d for d in info.descriptors if d.name == "oci-config.json")
        env = json.loads(sif_format.read_object(sif, config)).get("Env") or []
        (dest / "ch").mkdir(exist_ok=True)
        (dest / "ch" / "environment").write_text("".join(f"{line}\n" for line in env))
        print(f"TIMING build-env sif {built:.1f}s, unsquashfs "
              f"{time.monotonic() - start - built:.1f}s, {sif.stat().st_size / 2**20:.0f} MiB")
        yield sif, dest
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def image_dir(fixture_sif: tuple[Path, Path]) -> Path:
    """The verified fixture image as a directory ch-run runs: the session SIF's tree."""
    return fixture_sif[1]


def port_free(port: int) -> bool:
    """True when nothing holds ``port`` on any local address (TCP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port_block(size: int, low: int = 20000, high: int = 32000) -> int:
    """A base port such that base .. base+size-1 are all free now."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        base = rng.randrange(low, high - size)
        if all(port_free(p) for p in range(base, base + size)):
            return base
    raise RuntimeError(f"no block of {size} free ports")


@dataclass
class SlurmCluster:
    """A running fake cluster; ``env`` is what clients (sbatch, scontrol) need."""

    root: Path
    conf: Path
    env: dict[str, str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    enroot_store: Path | None = None  # pyxis clusters: each node's enroot containers

    def run(self, *cmd: str, env: dict[str, str] | None = None) -> str:
        """Run a Slurm client command against this cluster, return stdout."""
        proc = subprocess.run(list(cmd), env=env or self.env, capture_output=True, text=True,
                              timeout=30)
        if proc.returncode != 0:
            raise RuntimeError(f"{cmd}: {proc.stderr.strip()}")
        return proc.stdout

    def sbatch(self, script: Path, output: Path, env: dict[str, str]) -> str:
        """Submit ``script`` with ``env`` as the job's environment; return the job id."""
        out = self.run("sbatch", "--parsable", f"--output={output}", str(script), env=env)
        return out.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict of its KEY=VALUE fields."""
        text = self.run("scontrol", "show", "job", "-o", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait(self, job_id: str, timeout: float) -> dict[str, str]:
        """Poll until the job leaves PENDING/RUNNING; cancel it and fail on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") not in {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING"}:
                return info
            time.sleep(0.5)
        subprocess.run(["scancel", job_id], env=self.env, check=False)
        raise AssertionError(f"job {job_id} still {self.job(job_id).get('JobState')} "
                             f"after {timeout}s (cancelled)")


def _write_conf(root: Path, nodes: int, ctld_port: int, node_ports: list[int],
                plugstack: str = "", extra: tuple[str, ...] = ()) -> Path:
    lines = [
        "ClusterName=verlenvtest",
        "SlurmctldHost=localhost",
        f"SlurmctldPort={ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/none",
        "CredType=cred/none",
        "ProctrackType=proctrack/linuxproc",
        # every task bound to the CPUs of its step (what a one-task step without -c gets
        # bound to is what the CPU-binding test is about)
        "TaskPlugin=task/affinity",
        "TaskPluginParam=Cores",  # as many sites: a task is bound to the cores of its CPUs
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "ReturnToService=2",
        "MinJobAge=600",
        "KillWait=5",
        # the controller pings every slurmd each SlurmdTimeout/3 s and marks a silent one
        # NOT_RESPONDING, then DOWN at SlurmdTimeout: the job's node watch reads that (default
        # 300 s, so up to ~100 s before a dead host shows; short here to keep the tests short,
        # long enough that the job names a lost node before Slurm ends it for NODE_FAIL)
        "SlurmdTimeout=60",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool-%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd-%n.log",
        f"PlugStackConfig={root}/plugstack.conf",
        f"TaskProlog={root}/taskprolog.sh",
        *extra,
    ]
    for i, port in enumerate(node_ports, start=1):
        lines.append(f"NodeName=node{i} NodeHostname=localhost Port={port} CPUs=2 "
                     "RealMemory=4000 State=UNKNOWN")
    lines.append(f"PartitionName=debug Nodes=node[1-{nodes}] Default=YES MaxTime=INFINITE State=UP")
    (root / "plugstack.conf").write_text(plugstack)
    (root / "node-env").mkdir()
    prolog = root / "taskprolog.sh"
    prolog.write_text("#!/bin/sh\n"
                      f'f="{root}/node-env/${{SLURMD_NODENAME}}.env"\n'
                      'if [ -f "$f" ]; then\n'
                      '  while IFS= read -r line; do echo "export $line"; done <"$f"\n'
                      "fi\nexit 0\n")
    prolog.chmod(0o755)
    (root / "state").mkdir()
    conf = root / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in reversed(procs):
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def slurm_skip_reason() -> str | None:
    """Why the real-Slurm tests cannot run here, or None."""
    missing = [t for t in SLURM_TOOLS if shutil.which(t) is None]
    if missing:
        return f"Slurm tools missing: {', '.join(missing)} (apt-get install slurmctld slurmd slurm-client)"
    if os.geteuid() != 0:
        return "the fake Slurm cluster needs root (slurmd runs jobs as their users)"
    return None


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Two fake nodes (node1, node2; 2 CPUs each) on localhost, torn down by PID."""
    reason = slurm_skip_reason()
    if reason:
        pytest.skip(reason)
    yield from start_cluster(tmp_path_factory.mktemp("slurm"))


# A requeued job waits a credential lifetime before it may start again (Slurm 22.05: the
# AuthInfo cred_expire, 120 s by default, plus 1 s); 20 s keeps the requeue tests short and
# leaves a loaded host time to launch every step within a credential's lifetime. Nothing wakes the
# main scheduler when that wait ends: the job starts at the next backfill pass (every 30 s by
# default, measured 29.5-33.8 s from requeue to start), each second here.
REQUEUE_CONF = ("AuthInfo=cred_expire=20", "SchedulerParameters=bf_interval=1")


@pytest.fixture(scope="session")
def slurm_cluster4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Four fake nodes (node1..node4; 2 CPUs each) for the jobs that route around a bad node
    and requeue themselves (tests/slurm/test_requeue_real.py): a job of two or three nodes
    still has enough once one is excluded. Torn down by PID."""
    reason = slurm_skip_reason()
    if reason:
        pytest.skip(reason)
    yield from start_cluster(tmp_path_factory.mktemp("slurm4"), nodes=4, extra=REQUEUE_CONF)


@pytest.fixture(scope="session")
def pyxis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """The same two nodes with pyxis in plugstack.conf and enroot (built here from the
    snapshots in $VERL_ENV_VENDOR_DIR, default ../shared/vendor beside the checkout) on each
    slurmd's PATH; each node keeps its own enroot containers, as separate hosts would."""
    from tests.slurm import enroot

    reason = slurm_skip_reason() or enroot.skip_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("pyxis")
    tools = enroot.build(root / "build")
    paths = {f"node{i}": enroot.node_path(tools, root / "enroot", f"node{i}") for i in (1, 2)}
    tasks = enroot.task_bin(tools, root / "enroot")
    for cluster in start_cluster(root / "slurm", plugstack=tools.plugstack_line(root / "pyxis-run"),
                                 node_paths=paths):
        cluster.env["PATH"] = f"{tasks}:{cluster.env['PATH']}"  # what jobs and their tasks see
        cluster.enroot_store = root / "enroot"
        yield cluster


def start_cluster(root: Path, plugstack: str = "", node_paths: dict[str, str] | None = None,
                  nodes: int = 2, extra: tuple[str, ...] = ()) -> Iterator[SlurmCluster]:
    """Start slurmctld and ``nodes`` slurmd under ``root``; yield the cluster; stop them by
    PID. ``node_paths``: a PATH for each slurmd (what pyxis runs enroot with); ``extra``: more
    slurm.conf lines."""
    root.mkdir(parents=True, exist_ok=True)
    base = free_port_block(nodes + 1)
    conf = _write_conf(root, nodes, base, [base + 1 + i for i in range(nodes)], plugstack, extra)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = SlurmCluster(root, conf, env)
    log = open(root / "daemons.out", "wb")
    try:
        cluster.procs.append(subprocess.Popen(["slurmctld", "-D", "-f", str(conf)], env=env,
                                              stdout=log, stderr=subprocess.STDOUT))
        for i in range(1, nodes + 1):
            node_env = dict(env)
            if node_paths:
                node_env["PATH"] = node_paths[f"node{i}"]
            cluster.procs.append(subprocess.Popen(["slurmd", "-D", "-f", str(conf), "-N", f"node{i}"],
                                                  env=node_env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 30
        state = ""
        while time.monotonic() < deadline:
            dead = [p.args for p in cluster.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"Slurm daemon exited: {dead}; see {root}")
            try:
                state = cluster.run("sinfo", "-h", "-o", "%t %D").strip()
            except (RuntimeError, subprocess.TimeoutExpired):
                state = ""
            if state == f"idle {nodes}":
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"Slurm not idle after 30 s (sinfo: {state!r}); logs in {root}")
        yield cluster
    finally:
        try:
            jobs = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True,
                                  text=True, timeout=10).stdout.split()
            if jobs:
                subprocess.run(["scancel", *jobs], env=env, timeout=10, check=False)
                time.sleep(2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        _stop(cluster.procs)
        log.close()


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (to find what a test started, by its unique
    temp path, and stop exactly those)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(entry.name))
    return pids


# ---- a node dies (tests/slurm/test_node_faults.py) ----------------------------------------------

def _children() -> dict[int, list[int]]:
    """Parent PID -> child PIDs of every process now."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def stepds_of(cluster: SlurmCluster, node: str, job_id: str = "") -> list[int]:
    """PIDs of the slurmstepd processes of ``node`` (of job ``job_id`` only, when given): the
    owners of the step sockets under that node's spool directory (every fake node is
    localhost, so the spool tells them apart)."""
    spool = f"{cluster.root}/spool-{node}/{node}_{job_id + '.' if job_id else ''}"
    inodes = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 8 and parts[7].startswith(spool):
            inodes.add(f"socket:[{parts[6]}]")
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _slurmd(cluster: SlurmCluster, node: str) -> int:
    """Index in ``cluster.procs`` of ``node``'s slurmd."""
    for i, proc in enumerate(cluster.procs):
        args = list(proc.args)  # type: ignore[arg-type]
        if args[0] == "slurmd" and args[args.index("-N") + 1] == node:
            return i
    raise LookupError(f"no slurmd for {node}")


@dataclass
class DeadNode:
    """What :func:`kill_node` killed, and how to start its slurmd again."""

    node: str
    args: list[str]
    env: dict[str, str]
    pids: list[int]


def kill_node(cluster: SlurmCluster, node: str) -> DeadNode:
    """A host dies: ``node``'s slurmd, its slurmstepds and every process under them stop at
    once (SIGSTOP first, so nothing forks away while the tree is collected; then SIGKILL). The
    slurmctld is not told: it finds out as it would about a real host."""
    index = _slurmd(cluster, node)
    slurmd = cluster.procs[index]
    env = dict(line.split("=", 1) for line in Path(f"/proc/{slurmd.pid}/environ").read_bytes()
               .decode(errors="replace").split("\0") if "=" in line)
    stopped: set[int] = set()
    frontier = [slurmd.pid, *stepds_of(cluster, node)]
    while frontier:  # stop the tree top-down, collecting children of what is stopped
        for pid in frontier:
            try:
                os.kill(pid, signal.SIGSTOP)
                stopped.add(pid)
            except ProcessLookupError:
                pass
        tree = _children()
        frontier = [c for pid in stopped for c in tree.get(pid, []) if c not in stopped]
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    slurmd.wait(timeout=10)
    return DeadNode(node, list(slurmd.args), env, sorted(stopped))  # type: ignore[arg-type]


def revive_node(cluster: SlurmCluster, dead: DeadNode, timeout: float = 60) -> None:
    """Start the dead node's slurmd again (same arguments and environment; stopped by PID with
    the cluster) and wait until the controller sees it answer."""
    index = _slurmd(cluster, dead.node)
    if cluster.procs[index].poll() is None:
        return
    with open(cluster.root / f"daemons-{dead.node}-revived.out", "ab") as log:
        cluster.procs[index] = subprocess.Popen(dead.args, env=dead.env, stdout=log,
                                                stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        try:
            state = cluster.run("sinfo", "-h", "-n", dead.node, "-o", "%t").strip()
        except (RuntimeError, subprocess.TimeoutExpired):
            state = ""
        if state in {"idle", "mix", "alloc"}:
            return
        time.sleep(0.5)
    raise RuntimeError(f"{dead.node} not back after {timeout}s (sinfo: {state!r}); "
                       f"logs in {cluster.root}")
