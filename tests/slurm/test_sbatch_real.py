"""The generated script, submitted with real sbatch to a real two-node Slurm on this host, running
the CPU fixture image through the real ``ch-run`` (Debian charliecloud-runtime) and through real
pyxis + enroot (``srun --container-image``; built from their source snapshots, tests/slurm/enroot.py).

The image is the fixture target built and verified by the pipeline (``cpu_image``), for ch-run
the tree of its SIF unpacked into a directory on the shared filesystem, with its image ENV written
to ``/ch/environment`` as ``ch-convert`` does (``image_dir``, once per group:
tests/slurm/conftest.py); for pyxis it is the enroot squashfs ``build-env sqsh`` writes.
Everything the job runs on the nodes comes from that image: the per-node self-test
(``python3 -m verl_env_selftest``), Ray (head and worker), and the training stand-in below. Every
fake node is localhost, so the job uses the loopback interface and a per-node port stride. The
cluster binds every task to the cores of its CPUs (task/affinity, TaskPluginParam=Cores), so a
step that does not ask for its node's CPUs is seen here running on one.
"""

from __future__ import annotations

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

from builder.cluster.inputs import Inputs, TrainChoice, default_train_cmd
from builder.cluster.job import SlurmJob
from builder.cluster.ports import RayPorts
from builder.cluster.requeue import Resilience
from builder.cluster.render import write_sbatch
from builder.matrix.spec import load_matrix
from builder.sif import checks as sif_checks
from builder.train import check as train_check
from builder.train import checker_bytes
from tests.conftest import FIXTURE, run_build_env
from tests.slurm.conftest import SlurmCluster, free_port_block, processes_mentioning

pytestmark = pytest.mark.slurm

# The training stand-in, run by the job inside the image: it reads the bound data and model,
# uses the 2-node Ray cluster, sees the site's variable over the image's ENV, and writes a
# checkpoint through the read-write bind.
TRAIN_PY = """
import os, sys, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
# KEY=VALUE as hydra reads it: a value the job quoted for hydra's grammar (a path holding
# ${SLURM_JOB_ID}, expanded by the shell first) has its quotes taken off
args = {k: v[1:-1].replace("\\\\'", "'") if len(v) > 1 and v[0] == v[-1] == "'" else v
        for k, v in (a.split("=", 1) for a in sys.argv[1:])}
for key in ("data.train_files", "data.val_files"):
    assert open(args[key]).read().startswith("PAR1"), key
assert os.path.isfile(os.path.join(args["actor_rollout_ref.model.path"], "config.json"))
ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
alive = [n for n in ray.nodes() if n["Alive"]]

@ray.remote(num_cpus=1)
def node_id():
    return ray.get_runtime_context().get_node_id(), len(os.sched_getaffinity(0))

seen = ray.get([node_id.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
    n["NodeID"], soft=False)).remote() for n in alive])
ids = [node for node, _ in seen]
print("TRAIN-CPUS driver=%d ray_workers=%s ray_total=%s" % (
      len(os.sched_getaffinity(0)), ",".join(str(c) for _, c in seen),
      ray.cluster_resources().get("CPU")), flush=True)
print("TRAIN-RAY-FROM %s" % ray.__file__, flush=True)
ckpt = args["trainer.default_local_dir"]
with open(os.path.join(ckpt, "global_step_1.txt"), "w") as handle:
    handle.write("step 1\\n")
print("TRAIN-STANDIN alive=%d tasks_on_nodes=%d nnodes=%s gpus=%s frontend=%s ch=%s" % (
      len(alive), len(set(ids)), args["trainer.nnodes"], args["trainer.n_gpus_per_node"],
      os.environ.get("DEBIAN_FRONTEND"), "CH_RUNNING" in os.environ), flush=True)
"""


@pytest.fixture(scope="module")
def image_sqsh(cpu_image: dict, docker_host: str) -> Iterator[Path]:
    """The verified fixture image as an enroot squashfs, written by ``build-env sqsh``."""
    root = Path(tempfile.mkdtemp(prefix="verl-env-sqsh-", dir="/var/tmp"))
    out = root / "cpu-x86_64.sqsh"
    try:
        start = time.monotonic()
        # uncompressed: gzip of the 2 GB fixture takes minutes on two loaded CPUs
        proc = run_build_env("sqsh", "--image", cpu_image["image_id"], "--output", str(out),
                             "--compression", "none", "--json",
                             env={"DOCKER_HOST": docker_host}, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        print(f"TIMING build-env sqsh of the fixture image: {time.monotonic() - start:.1f}s, "
              f"{out.stat().st_size / 2**20:.0f} MiB")
        yield out
    finally:
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Bench:
    """What one test needs to build, submit and judge a job."""

    cluster: SlurmCluster
    root: Path
    ray_tmp: Path
    env: dict[str, str]
    image: Path
    runtime: str = "ch-run"

    def inputs(self, **overrides: object) -> Inputs:
        values: dict[str, object] = dict(
            data=str(self.root / "data"), model=str(self.root / "model"),
            checkpoint_dir=str(self.root / "ckpt-${SLURM_JOB_ID}"),
            binds=[f"{self.root / 'scripts'}:/mnt:ro"])
        values.update(overrides)
        if self.runtime == "pyxis":  # slurmstepd runs the TaskProlog inside the container
            values["binds"] = [*values["binds"], f"{self.cluster.root}:{self.cluster.root}:ro"]  # type: ignore[misc]
        return Inputs.from_options(**values)  # type: ignore[arg-type]

    def job(self, **overrides: object) -> SlurmJob:
        """A cpu-family ch-run job for the fake cluster, on fresh ports."""
        b = free_port_block(100)
        ports = RayPorts(gcs=b, dashboard=b + 1, client=b + 2, node_manager=b + 10,
                         object_manager=b + 11, runtime_env_agent=b + 12,
                         dashboard_agent_grpc=b + 13, metrics_export=b + 14,
                         dashboard_agent_listen=b + 15, min_worker=b + 20, max_worker=b + 49)
        inputs = self.inputs()
        values: dict[str, object] = dict(
            target="cpu-x86_64", family="cpu", sif=str(self.image), runtime=self.runtime, nodes=2,
            partition="debug", time="10", interface="lo", cache_dir=str(self.root / "sifcache"),
            hf_home=str(self.root / "hf"), ray_ports=ports, port_stride=50,
            port_slots=1,  # the test hands the job a free port block of its own
            ray_tmp_root=str(self.ray_tmp), ray_wait_timeout=240, selftest_port=b + 3,
            selftest_timeout=400, job_dir=str(self.root / "job-${SLURM_JOB_ID}"),
            exclusive=False, selftest_args="--timeout 300", inputs=inputs,
            env={"DEBIAN_FRONTEND": "site-wins", "NCCL_DEBUG": "INFO"},
            # verl's trainer arguments, with the stand-in in place of verl.trainer.main_ppo
            train_cmd=inputs.trainer_command().replace("-m verl.trainer.main_ppo",
                                                       "/mnt/train.py"),
            # no warning signal within the 10-minute limit (a slow job here would be stopped
            # and requeued halfway); test_requeue_real.py sets its own
            resilience=Resilience(signal_seconds=0),
        )
        values.update(overrides)
        return SlurmJob(**values)  # type: ignore[arg-type]

    def submit(self, job: SlurmJob, name: str, timeout: float = 900,
               env: dict[str, str] | None = None) -> tuple[dict[str, str], str, float]:
        """Write, sbatch, wait; return (scontrol fields, job output, wall seconds)."""
        script = write_sbatch(job, self.root / f"{name}.sbatch")
        out = self.root / f"{name}.out"
        start = time.monotonic()
        job_id = self.cluster.sbatch(script, out, env or self.env)
        info = self.cluster.wait(job_id, timeout)
        wall = time.monotonic() - start
        text = out.read_text() if out.exists() else ""
        print(f"--- {name}: job {job_id} {info.get('JobState')} {info.get('ExitCode')} "
              f"in {wall:.1f}s\n{text}")
        return info, text, wall

    def break_node(self, node: str, lines: str) -> Path:
        """Make the cluster's TaskProlog export ``lines`` into every task on ``node``."""
        switch = self.cluster.root / "node-env" / f"{node}.env"
        switch.write_text(lines)
        return switch


def _bench(cluster: SlurmCluster, image: Path, runtime: str,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    root = tmp_path_factory.mktemp(f"slurm-e2e-{runtime}")
    ray_tmp = Path(tempfile.mkdtemp(prefix="vr", dir="/tmp"))  # Ray's socket paths must stay short
    for sub in ("scripts", "data", "model"):
        (root / sub).mkdir()
    (root / "scripts" / "train.py").write_text(TRAIN_PY)
    for name in ("train.parquet", "test.parquet"):
        (root / "data" / name).write_bytes(b"PAR1 stand-in parquet\n")
    (root / "model" / "config.json").write_text("{}\n")
    # the batch environment: no host Python, Ray or self-test on PATH; all of it is the image's
    env = {**cluster.env, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("PYTHONPATH", None)
    try:
        yield Bench(cluster, root, ray_tmp, env, image, runtime)
    finally:
        _reap(str(ray_tmp))
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def bench(slurm_cluster: SlurmCluster, image_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    """ch-run on the two-node cluster."""
    yield from _bench(slurm_cluster, image_dir, "ch-run", tmp_path_factory)


@pytest.fixture(scope="module")
def pyxis_bench(pyxis_cluster: SlurmCluster, image_sqsh: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    """pyxis + enroot on the two-node cluster that loads pyxis."""
    yield from _bench(pyxis_cluster, image_sqsh, "pyxis", tmp_path_factory)


@pytest.fixture(params=["ch-run", "pyxis"])
def any_bench(request: pytest.FixtureRequest) -> Bench:
    """The test through each runtime."""
    return request.getfixturevalue("bench" if request.param == "ch-run" else "pyxis_bench")


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


# Where the tool's own runs from a SIF mount its squashfs: a SIF's self-test (builder/sif/checks.py)
# and the train check from a SIF (builder/train/check.py). The SIF tests of the other CI groups,
# running beside this one on the same machine, mount there (CI 2026-12-02: a train check's was up
# while this job ended); a job never does.
SIF_CHECK_MOUNTS = tuple(f"/tmp/{p}" for p in (sif_checks.RUN_SCRATCH, train_check.SIF_SCRATCH))


def _image_mounts(image: Path) -> list[str]:
    """Mounts of the job's image left behind: any naming it, and any squashfuse mount (enroot's)
    but those of the tool's runs from a SIF in other test groups (CI 2026-11-30 and 2026-12-02:
    one was up while this job ended)."""
    out = []
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        point = fields[1] if len(fields) > 1 else ""
        if str(image) in line or ("squashfuse" in line and
                                  not point.startswith(SIF_CHECK_MOUNTS)):
            out.append(line)
    return out


def test_two_nodes_selftest_ray_and_train_from_the_image(any_bench: Bench) -> None:
    """The whole job through each runtime, on whole nodes (--exclusive, the generator's default):
    every step gets both CPUs of its node. The cluster binds each task to the cores of its
    step's CPUs, so a step without -c runs on one CPU while Ray is told two (the script before
    issue 21 shows ``TRAIN-CPUS driver=1 ray_workers=1,1 ray_total=4.0`` here)."""
    bench = any_bench
    job = bench.job(exclusive=True)
    info, out, wall = bench.submit(job, "ok")
    assert info["JobState"] == "COMPLETED", out
    assert info["ExitCode"] == "0:0"
    stages = re.findall(r"=== stage (\w+) ===", out)
    assert stages == ["setup", "network", "services", "selftest", "training"]
    # setup: the Slurm version checked, CPUs from the allocation, no GPUs
    assert re.search(r"Slurm \d+\.\d+\S* \(>= 22\.05\)", out), out
    assert "allocation per node: 2 CPUs, 0 GPUs" in out
    assert "#SBATCH --exclusive" in (bench.root / "ok.sbatch").read_text()
    # network: both fake nodes resolved through scontrol and the chosen interface
    assert "node node1: lo 127.0.0.1" in out and "node node2: lo 127.0.0.1" in out
    # services: Ray from the image on both nodes; the node-manager ports tell the two apart
    alive = re.search(r"ray: 2/2 nodes alive: ([\d.]+):(\d+), ([\d.]+):(\d+)", out)
    assert alive, out
    nm = job.ray_ports.node_manager
    assert {int(alive.group(2)), int(alive.group(4))} == {nm, nm + job.port_stride}
    assert "ray: cluster CPU=4.0 GPU=0" in out
    # every CPU of the allocation reaches Ray's workers and the training step
    assert "TRAIN-CPUS driver=2 ray_workers=2,2 ray_total=4.0" in out, out
    joined = re.search(r"Ray cluster up: 2 nodes alive (\d+) s", out)
    assert joined
    job_dir = bench.root / f"job-{info['JobId']}"
    for node in ("node1", "node2"):
        log = (job_dir / f"ray-{node}.log").read_text()
        assert "/opt/venv/bin/ray" in log or "Ray runtime started" in log, log[-2000:]
        assert re.search(rf"{node} step ray \w+: 2 CPUs allocated, 2 usable", log), log[-2000:]
    # self-test: the image's own, on both nodes, one srun step (a collective across the two)
    assert "self-test node1: pass" in out and "self-test node2: pass" in out
    for node in ("node1", "node2"):
        assert (job_dir / f"selftest-{node}.rc").read_text().strip() == "0"
    reports = [json.loads(p.read_text()) for p in job_dir.glob("selftest-*.json")]
    assert reports and all(r["overall"] == "pass" and r["world_size"] == 2 for r in reports)
    ids = {c["id"].split("@")[0] for r in reports for c in r["checks"] if c["status"] == "pass"}
    assert "collective.gloo_allreduce" in ids, sorted(ids)
    # training: on the head, in the image, against the 2-node cluster; data and model read
    # through their binds, the site's DEBIAN_FRONTEND over the image's ENV, checkpoint written
    assert ("TRAIN-STANDIN alive=2 tasks_on_nodes=2 nnodes=2 gpus=0 frontend=site-wins "
            f"ch={bench.runtime == 'ch-run'}") in out
    ckpt = bench.root / f"ckpt-{info['JobId']}" / "global_step_1.txt"
    assert ckpt.read_text() == "step 1\n"
    assert "result: ok" in out
    print(f"TIMING job wall {wall:.1f}s, Ray 2-node join {joined.group(1)}s")
    assert _leftover_ray(bench) == [], "Ray processes outlived the job"
    assert _image_mounts(bench.image) == []
    if bench.runtime == "pyxis":  # one named container per node, reused, removed by the job
        name = f"pyxis_verl-env-{info['JobId']}"
        for node in ("node1", "node2"):
            log = (bench.cluster.root / f"slurmd-{node}.log").read_text()
            assert log.count(f"creating container filesystem: {name}\n") == 1, log[-3000:]
        assert _containers(bench) == []


def _containers(bench: Bench) -> list[str]:
    from tests.slurm import enroot

    store = bench.cluster.enroot_store
    return enroot.containers(store) if store else []


def test_image_packages_win_over_user_site_and_module_paths(any_bench: Bench) -> None:
    """A user's ~/.local and a module-loaded PYTHONPATH both hold a ``ray`` that refuses to
    import: the job still runs the image's own Ray (clean environment, PYTHONNOUSERSITE=1), and
    the user's HF_HOME is kept (no --hf-home)."""
    bench = any_bench
    home, pypath = bench.root / "shadow-home", bench.root / "shadow-pythonpath"
    sites = [pypath] + [home / ".local" / "lib" / f"python3.{m}" / "site-packages"
                        for m in range(8, 15)]
    for site in sites:
        (site / "ray").mkdir(parents=True, exist_ok=True)
        (site / "ray" / "__init__.py").write_text(
            'raise ImportError("SHADOW ray from " + __file__)\n')
    user_hf = bench.root / "users-own-hf"
    job = replace(bench.job(nodes=1, inputs=bench.inputs(
        binds=[f"{bench.root / 'scripts'}:/mnt:ro", f"{home}:{home}"])), hf_home=None)
    env = dict(bench.env, HOME=str(home), PYTHONPATH=str(pypath), HF_HOME=str(user_hf))
    info, out, _ = bench.submit(job, "shadow", env=env)
    assert info["JobState"] == "COMPLETED", out
    assert "SHADOW" not in out
    ray_from = re.search(r"TRAIN-RAY-FROM (\S+)", out)
    assert ray_from and not ray_from.group(1).startswith((str(home), str(pypath))), out
    assert f"HF cache: {user_hf}" in out
    assert _leftover_ray(bench) == []


def test_missing_data_fails_setup_naming_it(bench: Bench) -> None:
    job = bench.job(inputs=bench.inputs(data=str(bench.root / "no-such-data")))
    info, out, _ = bench.submit(job, "no-data", timeout=60)
    assert info["ExitCode"] == "10:0", out
    assert f"train files {bench.root}/no-such-data/train.parquet" in out
    assert f"validation files {bench.root}/no-such-data/test.parquet" in out
    assert "result: FAILED at stage setup (exit 10)" in out
    assert "=== stage network ===" not in out


def test_bind_missing_on_one_node_fails_setup(bench: Bench) -> None:
    """A bind under $HOME exists on node1 but not on node2 (its prolog points HOME elsewhere):
    setup fails on that node, naming the option and the path."""
    (bench.root / "home1").mkdir(exist_ok=True)
    switch = bench.break_node("node2", f"HOME={bench.root}/home2-missing\n")
    try:
        job = bench.job(inputs=bench.inputs(binds=["${HOME}:/mnt"]))
        env = dict(bench.env, HOME=str(bench.root / "home1"))
        info, out, _ = bench.submit(job, "bind-node2", timeout=60, env=env)
    finally:
        switch.unlink()
    assert info["ExitCode"] == "10:0", out
    assert f"node2: --bind ${{HOME}}:/mnt {bench.root}/home2-missing does not exist" in out
    assert "node1: --bind" not in out
    assert "result: FAILED at stage setup (exit 10)" in out


def test_failing_node_stops_job_before_training(any_bench: Bench) -> None:
    """node2's environment is broken (HIP_VISIBLE_DEVICES != CUDA_VISIBLE_DEVICES, as a bad
    prolog could leave it): the image's self-test fails there, the ranks agree on FAIL, and
    training never starts."""
    bench = any_bench
    switch = bench.break_node("node2", "HIP_VISIBLE_DEVICES=0\nCUDA_VISIBLE_DEVICES=1\n")
    try:
        info, out, _ = bench.submit(bench.job(), "node2-fails")
    finally:
        switch.unlink()
    assert info["JobState"] == "FAILED", out
    assert info["ExitCode"] == "13:0"
    assert "self-test node2: FAIL" in out
    assert re.search(r"fail env\.\S*visible\S*", out, re.I), out
    assert re.search(r"self-test did not pass on (node1 )?node2 \(exit codes node1=\d node2=1, "
                     r"srun \d+;", out), out
    assert "cluster verdict: not written: no SIF names this image" in out  # a directory, no SIF
    assert "result: FAILED at stage selftest (exit 13)" in out
    assert "=== stage training ===" not in out and "TRAIN-STANDIN" not in out
    assert _leftover_ray(bench) == [], "Ray processes outlived the failed job"
    assert _image_mounts(bench.image) == []


def test_ray_worker_dying_fails_services_at_once(bench: Bench) -> None:
    """Ray cannot start on node2 (its prolog points Ray's auth token at a file that is not
    there; a broken PYTHONHOME no longer does it: the clean environment keeps it out of the
    container): the job stops in services as soon as that Ray step exits, not after the whole
    wait timeout."""
    switch = bench.break_node("node2", "RAY_AUTH_TOKEN_PATH=/nonexistent-verl-env-test/token\n")
    try:
        start = time.monotonic()
        info, text, _ = bench.submit(bench.job(ray_wait_timeout=240), "broken-node2", timeout=150)
        wall = time.monotonic() - start
    finally:
        switch.unlink()
    assert info["ExitCode"] == "12:0", text
    assert "Ray on node2 exited before all nodes joined" in text
    assert "last lines of" in text and "/nonexistent-verl-env-test/token" in text  # why, from node2's log
    assert "result: FAILED at stage services (exit 12)" in text
    assert "=== stage selftest ===" not in text
    assert wall < 145, f"took {wall:.0f}s: the watcher did not cut the 240 s wait short"
    assert _leftover_ray(bench) == []


def test_taken_gcs_port_fails_services(bench: Bench) -> None:
    """Something already listens on the GCS port (pitfall 1): services stop before Ray starts."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    gcs = held.getsockname()[1]
    try:
        job = bench.job(nodes=1)
        job = replace(job, ray_ports=replace(job.ray_ports, gcs=gcs))
        info, out, _ = bench.submit(job, "gcs-taken", timeout=90)
    finally:
        held.close()
    assert info["ExitCode"] == "12:0", out
    assert f"port {gcs} on 127.0.0.1 is already taken" in out
    assert "result: FAILED at stage services (exit 12)" in out


def _step_ids(cluster: SlurmCluster, job_id: str) -> set[int]:
    """The job's step ids as the nodes' slurmd logged their launch (``launch task
    StepId=JOB.N``): Slurm's own record of every step it started on a node. (``sacct`` reads
    the same from slurmdbd, which this test cluster does not run: accounting_storage/none.)"""
    ids: set[int] = set()
    for log in cluster.root.glob("slurmd-*.log"):
        ids |= {int(n) for n in re.findall(rf"launch task StepId={job_id}\.(\d+) ",
                                           log.read_text(errors="replace"))}
    return ids


def test_node_watch_launches_no_steps(bench: Bench) -> None:
    """A 20 s training step watched every 2 s: the controller is asked (scontrol), no step is
    launched for it. The job's steps are the stages' own (paths, addresses, shared files, Ray
    head and worker, the Ray wait, the self-test and its report, training): the same count
    however long training runs. Main's watch launched a step on every node each interval (10
    more here, past the bound below; ~2,900 a day at 30 s, past MaxStepCount 40,000 in 14
    days)."""
    job = bench.job(node_check_interval=2, train_cmd="python3 -c 'import time; time.sleep(20)'")
    info, out, wall = bench.submit(job, "steps")
    assert info["ExitCode"] == "0:0", out
    ids = _step_ids(bench.cluster, info["JobId"])
    print(f"TIMING steps job wall {wall:.1f}s; step ids launched: {sorted(ids)}")
    assert ids, "no step launch found in the slurmd logs"
    assert len(ids) <= 11, sorted(ids)
    assert _leftover_ray(bench) == []


# ---- the real trainer (issue 30, item 3) ---------------------------------------------------------

TINY_VERL = Path(__file__).resolve().parents[1] / "support" / "tiny_verl.py"


@pytest.fixture(scope="module")
def tiny(bench: Bench) -> Path:
    """A tiny model (random weights, a tokenizer trained here) and a gsm8k-shaped parquet pair,
    made by tests/support/tiny_verl.py with the image's own Python (ch-run; nothing from a hub)."""
    out = bench.root / "tiny"
    script = bench.root / "scripts" / "tiny_verl.py"
    shutil.copy(TINY_VERL, script)
    start = time.monotonic()
    proc = subprocess.run(
        ["ch-run", "--unset-env=*", f"--set-env={bench.image}/ch/environment",
         "--set-env=HOME=/tmp", str(bench.image), "--", "python3", str(script),
         "--model", str(out / "model"), "--data", str(out / "data")],
        capture_output=True, text=True, timeout=600,
        env={"PATH": os.environ["PATH"], "USER": os.environ.get("USER") or "root"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(f"TIMING tiny model and data in the image: {time.monotonic() - start:.1f}s "
          f"{proc.stdout.strip()}")
    return out


def _real_trainer_job(bench: Bench, tiny: Path, overrides: tuple[str, ...] = ()) -> SlurmJob:
    """The job as `build-env slurm --target cpu-x86_64 --nodes 2` writes it for the fixture:
    train's default main_ppo command, the checker, and (CPU nodes) one logical GPU per node."""
    target = load_matrix(FIXTURE).target("cpu-x86_64")
    inputs = Inputs.from_options(data=str(tiny / "data"), model=str(tiny / "model"),
                                 checkpoint_dir=str(bench.root / "ckpt-${SLURM_JOB_ID}"))
    cmd, _ = default_train_cmd(target, "cpu", inputs, TrainChoice(nodes=2, gpus_per_node=1,
                                                                   overrides=overrides))
    return bench.job(inputs=inputs, train_cmd=cmd, ray_logical_gpus=1,
                     train_checker=checker_bytes())


def _seconds(out: str, first: str, last: str) -> float:
    """Seconds between the job log lines holding ``first`` and ``last``."""
    def at(text: str) -> float:
        line = next(li for li in out.splitlines() if text in li)
        return time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
    return at(last) - at(first)


def test_rejected_training_command_fails_at_the_train_check_before_ray(
        bench: Bench, tiny: Path) -> None:
    """The issue's own failure (no micro batch size), now caught by verl's validate_config in
    the image on the head node after the image is at hand and before any Ray starts: exit 15
    in seconds, quoting verl."""
    job = _real_trainer_job(bench, tiny, ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
                                          "=null",))
    info, out, wall = bench.submit(job, "rejected", timeout=400)
    assert info["ExitCode"] == "15:0", out
    assert "verl rejects the training command" in out
    assert "ppo_micro_batch_size" in out, out
    assert "result: FAILED at stage traincheck (exit 15)" in out
    assert "ray head on" not in out and "=== stage selftest ===" not in out
    took = _seconds(out, "train check on", "result: FAILED")
    print(f"TIMING rejected job wall {wall:.1f}s, train check to the job's end {took:.0f}s")
    assert _leftover_ray(bench) == []


def test_real_trainer_to_the_gpu_boundary_on_both_nodes(bench: Bench, tiny: Path) -> None:
    """verl.trainer.main_ppo itself, in the image, with train's default command on the tiny
    model: the train check passes, Ray counts trainer.nnodes x n_gpus_per_node (logical) GPUs
    over both nodes, and the trainer stops where a real GPU is needed: the job's own result
    (16), not a hang and not "training failed"."""
    info, out, wall = bench.submit(_real_trainer_job(bench, tiny), "trainer", timeout=900)
    tlog = (bench.root / f"job-{info['JobId']}" / "training.log").read_text(errors="replace")
    print("--- verl's own lines where it stopped:\n" + "\n".join(
        line for line in tlog.splitlines() if "ray::" in line or "NCCL" in line or "CUDA" in line))
    assert info["ExitCode"] == "16:0", out
    assert "train check: pass (configuration level" in out
    assert re.search(r"ray: 2/2 nodes alive", out), out
    assert ("Ray counts 2 GPUs = trainer.nnodes x trainer.n_gpus_per_node (2 x 1)") in out
    # where verl stopped, from verl's own log: both of its workers (one logical GPU on each
    # node), at init_model, with torch's message on a CPU build (its process group's NCCL)
    assert ("training stopped where a GPU is needed, in verl's workers at init_model "
            "(WorkerDict.actor_rollout_ref_init_model; 2 workers), on every node") in out, out
    workers = set(re.findall(r"\(WorkerDict pid=(\d+)", tlog))
    assert len(workers) == 2, workers
    assert re.search(r"ray::WorkerDict\.actor_rollout_ref_init_model\(\)\S* \(pid=(" +
                     "|".join(workers) + ")", tlog), tlog[-3000:]
    assert "Distributed package doesn't have NCCL built in" in tlog
    assert "result: stopped at the GPU boundary (exit 16)" in out
    print(f"TIMING real trainer job wall {wall:.1f}s")
    assert _leftover_ray(bench) == []
