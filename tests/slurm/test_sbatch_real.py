"""The generated script, submitted with real sbatch to a real two-node Slurm on this host.

The container runtime is a stand-in (conftest.STANDIN_RUNTIME) that runs commands on the host;
Ray (2.60.0), torch and tensordict come from the cached host venv (tests/support/hostenv.py).
Every fake node is localhost, so the job uses the loopback interface and a per-node port stride.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from builder.slurm import RayPorts, SlurmJob, write_sbatch
from tests.slurm.conftest import SlurmCluster, free_port_block, processes_mentioning

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
REAL_SELFTEST = REPO / "builder" / "selftest"

TRAIN_PY = """
import sys, os, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
alive = [n for n in ray.nodes() if n["Alive"]]

@ray.remote(num_cpus=1)
def node_id():
    return ray.get_runtime_context().get_node_id()

ids = ray.get([node_id.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
    n["NodeID"], soft=False)).remote() for n in alive])
print("TRAIN-STANDIN alive=%d tasks_on_nodes=%d args=%s" % (len(alive), len(set(ids)),
      " ".join(sys.argv[1:])), flush=True)
"""


@dataclass
class Bench:
    """What one test needs to build, submit and judge a job."""

    cluster: SlurmCluster
    root: Path
    ray_tmp: Path
    env: dict[str, str]
    sif_ref: str

    def job(self, **overrides: object) -> SlurmJob:
        """A cpu-family job for the fake cluster, on fresh ports."""
        b = free_port_block(100)
        ports = RayPorts(gcs=b, dashboard=b + 1, client=b + 2, node_manager=b + 10,
                         object_manager=b + 11, runtime_env_agent=b + 12,
                         dashboard_agent_grpc=b + 13, metrics_export=b + 14,
                         dashboard_agent_listen=b + 15, min_worker=b + 20, max_worker=b + 49)
        values: dict[str, object] = dict(
            target="cpu-test", family="cpu", sif=self.sif_ref, nodes=2, cpus_per_task=1,
            partition="debug", time="10", interface="lo", cache_dir=str(self.root / "sifcache"),
            hf_home=str(self.root / "hf"), ray_ports=ports, port_stride=50,
            ray_tmp_root=str(self.ray_tmp), ray_wait_timeout=150, selftest_port=b + 3,
            selftest_timeout=120, job_dir=str(self.root / "job-${SLURM_JOB_ID}"),
            exclusive=False, selftest_phases="preflight,env",
            selftest_args=f"--manifest {self.root / 'manifest.json'} --timeout 90",
            train_cmd=f"python3 {self.root / 'train.py'} trainer.nnodes=${{SLURM_NNODES}} "
                      "trainer.n_gpus_per_node=${VERL_ENV_GPUS_PER_NODE}",
        )
        values.update(overrides)
        return SlurmJob(**values)  # type: ignore[arg-type]

    def submit(self, job: SlurmJob, name: str, timeout: float = 300) -> tuple[dict[str, str], str, float]:
        """Write, sbatch, wait; return (scontrol fields, job output, wall seconds)."""
        script = write_sbatch(job, self.root / f"{name}.sbatch")
        out = self.root / f"{name}.out"
        start = time.monotonic()
        job_id = self.cluster.sbatch(script, out, self.env)
        info = self.cluster.wait(job_id, timeout)
        wall = time.monotonic() - start
        text = out.read_text() if out.exists() else ""
        print(f"--- {name}: job {job_id} {info.get('JobState')} {info.get('ExitCode')} "
              f"in {wall:.1f}s\n{text}")
        return info, text, wall

    def pulls(self) -> list[str]:
        """The stand-in runtime's `pull` calls so far."""
        log = self.root / "runtime.log"
        return [l for l in log.read_text().splitlines() if " pull " in l] if log.exists() else []


def _selftest_package(root: Path, python: Path) -> tuple[Path, str]:
    """A PYTHONPATH entry holding `verl_env_selftest`, as an image has it: a symlink to the real
    builder/selftest, or (only where that package is absent) the stand-in module of these
    tests. Also writes the manifest an image would carry, pinning the host venv's versions."""
    code = ("import importlib.metadata as m, json; print(json.dumps("
            "{n: m.version(n).split('+')[0] for n in ['torch', 'tensordict', 'ray']}))")
    pins = json.loads(subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                                     check=True).stdout)
    manifest = {"schema": "verl-env/manifest/v1", "target": "cpu-test", "accelerator": "cpu",
                "arch": "x86_64", "python": "3.11", "cuda": None, "rocm": None, "pins": pins,
                "provided": {}, "imports": {n: n for n in pins}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    target = root / "pkgs" / "verl_env_selftest"
    target.parent.mkdir()
    if (REAL_SELFTEST / "cli.py").exists() and os.environ.get("VERL_ENV_SLURM_STANDIN") != "1":
        target.symlink_to(REAL_SELFTEST)
        return target.parent, "real (builder/selftest)"
    target.mkdir()
    (target / "__init__.py").write_text("")
    shutil.copy(Path(__file__).with_name("standin_selftest.py"), target / "__main__.py")
    return target.parent, "stand-in (tests/slurm/standin_selftest.py)"


@pytest.fixture(scope="module")
def bench(slurm_cluster: SlurmCluster, standin_runtime: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    from tests.support.hostenv import hostenv

    try:
        python = hostenv()
    except RuntimeError as exc:
        pytest.skip(f"no host venv with ray/torch: {exc}")
    root = tmp_path_factory.mktemp("slurm-e2e")
    ray_tmp = Path(tempfile.mkdtemp(prefix="vr", dir="/tmp"))  # Ray's socket paths must stay short
    (root / "train.py").write_text(TRAIN_PY)
    store = root / "store"
    store.mkdir()
    sif = b"SIF stand-in image for the Slurm tests\n"
    digest = hashlib.sha256(sif).hexdigest()
    (store / digest).write_bytes(sif)
    pkgs, kind = _selftest_package(root, python)
    print(f"node self-test package: {kind}")
    env = {
        **slurm_cluster.env,
        "PATH": os.pathsep.join([str(standin_runtime), str(python.parent), os.environ["PATH"]]),
        "PYTHONPATH": str(pkgs),
        "FAKE_SIF_STORE": str(store),
        "FAKE_RUNTIME_LOG": str(root / "runtime.log"),
        "FAKE_NODE_ENV_DIR": str(root / "node-env"),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    (root / "node-env").mkdir()
    try:
        yield Bench(slurm_cluster, root, ray_tmp, env, f"oras://127.0.0.1:5000/verl/cpu-test@sha256:{digest}")
    finally:
        _reap(str(ray_tmp))
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _reap(marker: str) -> list[int]:
    """Stop (by PID) any process this module started that is still around; return their PIDs."""
    pids = processes_mentioning(marker)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def _leftover_ray(bench: Bench, grace: float = 15) -> list[int]:
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not processes_mentioning(str(bench.ray_tmp)):
            return []
        time.sleep(0.5)
    return _reap(str(bench.ray_tmp))


def test_two_nodes_join_one_ray_cluster_and_train(bench: Bench) -> None:
    job = bench.job()
    info, out, wall = bench.submit(job, "ok")
    assert info["JobState"] == "COMPLETED", out
    assert info["ExitCode"] == "0:0"
    # network: both fake nodes resolved through scontrol and the chosen interface
    assert "node node1: lo 127.0.0.1" in out and "node node2: lo 127.0.0.1" in out
    # services: SIF pulled once into the shared cache, then Ray with every node alive
    assert len(bench.pulls()) == 1
    # Ray maps a loopback --node-ip-address to the host's routable address, so on the fake
    # cluster both nodes share one IP; their node-manager ports (base and base+stride) tell
    # the two apart.
    alive = re.search(r"ray: 2/2 nodes alive: ([\d.]+):(\d+), ([\d.]+):(\d+)", out)
    assert alive, out
    nm = job.ray_ports.node_manager
    assert {int(alive.group(2)), int(alive.group(4))} == {nm, nm + job.port_stride}
    assert "ray: cluster CPU=2.0" in out
    joined = re.search(r"Ray cluster up: 2 nodes alive (\d+) s", out)
    assert joined
    # self-test: ran on both nodes, in one srun step (a collective across the two)
    assert "self-test node1: pass" in out and "self-test node2: pass" in out
    job_dir = bench.root / f"job-{info['JobId']}"
    for node in ("node1", "node2"):
        assert (job_dir / f"selftest-{node}.rc").read_text().strip() == "0"
    reports = [json.loads(p.read_text()) for p in job_dir.glob("selftest-*.json")]
    assert reports and all(r["overall"] == "pass" and r["world_size"] == 2 for r in reports)
    assert re.search(r"self-test report selftest-node\d\.json: pass, world 2", out)
    runs = [l.split()[0] for l in (bench.root / "runtime.log").read_text().splitlines()
            if "verl_env_selftest" in l and f"job-{info['JobId']}/" in l]
    assert sorted(runs) == ["node1", "node2"]
    # training: on the head, against the 2-node cluster, shape filled from Slurm
    assert ("TRAIN-STANDIN alive=2 tasks_on_nodes=2 args=trainer.nnodes=2 "
            "trainer.n_gpus_per_node=0") in out
    stages = re.findall(r"=== stage (\w+) ===", out)
    assert stages == ["network", "services", "selftest", "training"]
    assert "result: ok" in out
    print(f"TIMING job wall {wall:.1f}s, Ray 2-node join {joined.group(1)}s")
    assert _leftover_ray(bench) == [], "Ray processes outlived the job"


def test_failing_node_stops_job_before_training(bench: Bench) -> None:
    """node2's environment is broken (HIP_VISIBLE_DEVICES != CUDA_VISIBLE_DEVICES, as a bad
    prolog could leave it): its self-test fails, the ranks agree on FAIL, training never starts."""
    switch = bench.root / "node-env" / "node2.env"
    switch.write_text("HIP_VISIBLE_DEVICES=0\nCUDA_VISIBLE_DEVICES=1\n")
    try:
        info, out, _ = bench.submit(bench.job(), "node2-fails")
    finally:
        switch.unlink()
    assert info["JobState"] == "FAILED", out
    assert info["ExitCode"] == "13:0"
    assert "self-test node2: FAIL" in out
    assert re.search(r"fail env\.hip_cuda_visible_devices\S*: HIP_VISIBLE_DEVICES differs", out), out
    assert re.search(r"self-test did not pass \(exit codes node1=\d node2=1, srun 1;", out), out
    assert "result: FAILED at stage selftest (exit 13)" in out
    assert "=== stage training ===" not in out and "TRAIN-STANDIN" not in out
    assert "SIF cached:" in out  # the second job reused the shared cache
    assert _leftover_ray(bench) == [], "Ray processes outlived the failed job"


def test_ray_worker_dying_fails_services_at_once(bench: Bench) -> None:
    """The container runtime cannot start on node2: the job stops in services as soon as that
    Ray step exits, not after the whole wait timeout."""
    env = dict(bench.env, FAKE_RUNTIME_BROKEN_NODE="node2")
    job = bench.job(ray_wait_timeout=240)
    script = write_sbatch(job, bench.root / "broken-node2.sbatch")
    out = bench.root / "broken-node2.out"
    start = time.monotonic()
    info = bench.cluster.wait(bench.cluster.sbatch(script, out, env), 120)
    wall = time.monotonic() - start
    text = out.read_text()
    print(text)
    assert info["ExitCode"] == "12:0", text
    assert "Ray on node2 exited before all nodes joined" in text
    assert "FATAL: could not mount" in text  # the tail of node2's log says why
    assert "result: FAILED at stage services (exit 12)" in text
    assert "=== stage selftest ===" not in text
    assert wall < 100, f"took {wall:.0f}s: the watcher did not stop the wait early"
    assert _leftover_ray(bench) == []


def test_concurrent_jobs_pull_once_and_taken_gcs_port_fails_services(bench: Bench) -> None:
    """Two 1-node jobs start together on an empty cache: one pulls, the other waits on the lock
    and reuses the file. Both then find the GCS port taken (pitfall 1) and stop in services."""
    cache = bench.root / "sifcache-concurrent"
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    gcs = held.getsockname()[1]
    env = dict(bench.env, FAKE_PULL_SECONDS="4")
    before = len(bench.pulls())
    try:
        jobs = []
        for name in ("pull-a", "pull-b"):
            job = bench.job(nodes=1, cache_dir=str(cache))
            job = replace(job, ray_ports=replace(job.ray_ports, gcs=gcs))
            script = write_sbatch(job, bench.root / f"{name}.sbatch")
            out = bench.root / f"{name}.out"
            jobs.append((bench.cluster.sbatch(script, out, env), out))
        results = [(bench.cluster.wait(j, 90), out.read_text()) for j, out in jobs]
    finally:
        held.close()
    for info, out in results:
        print(out)
        assert info["ExitCode"] == "12:0", out
        assert f"port {gcs} on 127.0.0.1 is already taken" in out
        assert "result: FAILED at stage services (exit 12)" in out
    assert len(bench.pulls()) - before == 1
    assert sum("pulled meanwhile by another job" in out for _, out in results) == 1
    assert [p.name for p in cache.iterdir() if p.suffix == ".sif"] == [
        bench.sif_ref.split("://")[0] + "-sha256-" + bench.sif_ref.rsplit(":", 1)[1] + ".sif"]
    assert not list(cache.glob(".pull.*"))
