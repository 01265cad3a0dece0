"""A node dies during the Slurm job: the job rendered by ``build-env slurm`` runs the CPU fixture
image through ``ch-run`` on the suite's two-node Slurm, and the node that is not the batch host
dies as a host does: its ``slurmd``, its ``slurmstepd`` processes and everything under them are
killed at once (tests/slurm/conftest.py ``kill_node``), once while Ray comes up and once during
the self-test. Slurm's controller is not told; ``srun`` on the batch host is left waiting for a
node that never answers (measured: it does not notice by itself), which is what the job's node
watch is for.

Expected: the job ends with the stage's exit code, its log names the lost node (its Slurm name,
host and address) and the stage, and nothing of the job runs on the other node afterwards (no
Ray or self-test process; squeue lists no step of the job there). The node's slurmd is started
again in a finalizer, so the session's cluster is whole for the tests after these.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from builder.cluster.render import write_sbatch
from tests.slurm.conftest import (
    DeadNode,
    SlurmCluster,
    kill_node,
    processes_mentioning,
    revive_node,
    stepds_of,
)
from tests.slurm.test_sbatch_real import (
    Bench,
    _bench,
    _leftover_ray,
)

pytestmark = [pytest.mark.slurm, pytest.mark.fault]

CHECK_INTERVAL = 5  # the job's node watch (default 30 s), short to keep the test short


@pytest.fixture(scope="module")
def bench(slurm_cluster: SlurmCluster, image_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    yield from _bench(slurm_cluster, image_dir, "ch-run", tmp_path_factory)


@pytest.fixture
def dead_nodes(slurm_cluster: SlurmCluster) -> Iterator[list[DeadNode]]:
    """The nodes a test killed; their slurmd is started again afterwards, pass or fail."""
    dead: list[DeadNode] = []
    try:
        yield dead
    finally:
        for node in dead:
            revive_node(slurm_cluster, node)


def _steps(cluster: SlurmCluster, job_id: str) -> list[tuple[str, str]]:
    """(step id, node list) of the job's steps that squeue still lists, batch/extern aside."""
    out = cluster.run("squeue", "-h", "-s", "-j", job_id, "-o", "%i %N")
    rows = [tuple(line.split(None, 1)) for line in out.splitlines() if line.strip()]
    return [(step, nodes) for step, nodes in rows  # type: ignore[misc]
            if not step.endswith((".batch", ".extern"))]


def _kill_during(bench: Bench, dead: list[DeadNode], name: str,
                 when: Callable[[str, str, str], bool], **overrides: object
                 ) -> tuple[str, str, str, float]:
    """Submit the job; once ``when(job_id, victim, output)`` holds, kill the node that is not
    the batch host; wait for the job's last line. Return (job id, victim, output, seconds from
    the kill to the job's last line)."""
    cluster = bench.cluster
    job = bench.job(node_check_interval=CHECK_INTERVAL, **overrides)
    script = write_sbatch(job, bench.root / f"{name}.sbatch")
    out = bench.root / f"{name}.out"
    job_id = cluster.sbatch(script, out, bench.env)
    deadline = time.monotonic() + 240
    victim = ""
    while time.monotonic() < deadline:
        info = cluster.job(job_id)
        state = info.get("JobState")
        assert state in {"PENDING", "CONFIGURING", "RUNNING"}, (state, _text(out))
        if state == "RUNNING" and not victim:
            victim = "node2" if info.get("BatchHost") == "node1" else "node1"
        if victim and when(job_id, victim, _text(out)):
            break
        time.sleep(0.2)
    else:
        cluster.run("scancel", job_id)
        raise AssertionError(f"the moment to kill never came: {_text(out)[-3000:]}")
    dead.append(kill_node(cluster, victim))
    killed = time.monotonic()
    while "result:" not in _text(out) and time.monotonic() - killed < 150:
        time.sleep(0.5)
    took = time.monotonic() - killed
    text = _text(out)
    print(f"--- {name}: job {job_id}, {victim} killed, last line {took:.1f}s later\n{text}")
    assert "result:" in text, "the job did not end after its node was lost"
    return job_id, victim, text, took


def _processes(marker: str, grace: float = 15) -> dict[int, str]:
    """PID -> command line of the processes mentioning ``marker`` still there after ``grace``."""
    deadline = time.monotonic() + grace
    while processes_mentioning(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    found = {}
    for pid in processes_mentioning(marker):
        try:
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            pass
    return found


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _nothing_left(bench: Bench, dead: list[DeadNode], job_id: str, victim: str) -> None:
    """Nothing of the job runs on the node that lived: no slurmstepd of the job there, no Ray or
    job process; squeue lists only steps that wait for the dead node. Once its slurmd is back,
    the job is finished and squeue lists none of its steps."""
    cluster = bench.cluster
    alive = "node1" if victim == "node2" else "node2"
    deadline = time.monotonic() + 30
    while stepds_of(cluster, alive, job_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert stepds_of(cluster, alive, job_id) == [], f"a step of the job still runs on {alive}"
    assert _leftover_ray(bench) == [], "Ray processes outlived the job"
    left = _processes(str(bench.root / f"job-{job_id}"))
    assert left == {}, f"processes of the job still running: {left}"
    # squeue still lists the steps the controller cannot hear the end of from the dead node
    lingering = _steps(cluster, job_id)
    print(f"steps squeue lists while {victim} is dead: {lingering}")
    for step, nodes in lingering:
        assert victim in cluster.run("scontrol", "show", "hostnames", nodes).split(), (step, nodes)
    for node in dead:
        revive_node(cluster, node)
    dead.clear()
    end = time.monotonic() + 60
    while cluster.job(job_id).get("JobState") == "COMPLETING" and time.monotonic() < end:
        time.sleep(0.5)
    assert _steps(cluster, job_id) == []
    assert cluster.run("sinfo", "-h", "-o", "%t %D").split() in (["idle", "2"],), \
        cluster.run("sinfo")


def test_node_dies_while_ray_starts(bench: Bench, dead_nodes: list[DeadNode]) -> None:
    """The worker node dies while its ``ray start`` is coming up: services fail (exit 12)
    naming the node, the Ray head on the batch host is stopped, no self-test starts."""
    def ray_worker_starting(job_id: str, victim: str, out: str) -> bool:
        return bool(processes_mentioning(f"{bench.ray_tmp}/ray-{job_id}-1"))

    job_id, victim, out, took = _kill_during(bench, dead_nodes, "lost-in-ray",
                                             ray_worker_starting, ray_wait_timeout=240)
    assert "Ray cluster up" not in out, "the kill came after Ray was up"
    assert re.search(rf"lost node {victim} \(host localhost, address localhost, Slurm state "
                     r"\S+\) before all nodes joined", out), out
    assert f"FAILED (services): node {victim} lost before all nodes joined" in out
    assert f"result: FAILED at stage services (exit 12), lost node(s) {victim}" in out
    assert "=== stage selftest ===" not in out
    assert took < 150, f"{took:.0f}s from the kill to the end (~20 s; SlurmdTimeout 300 s)"
    _nothing_left(bench, dead_nodes, job_id, victim)
    info = bench.cluster.job(job_id)
    assert info["ExitCode"] == "12:0", info


def test_node_dies_during_selftest(bench: Bench, dead_nodes: list[DeadNode]) -> None:
    """The worker node dies while the image's self-test runs on both nodes (rank 0 on the batch
    host then waits for a peer that is gone): selftest fails (exit 13) naming the node within a
    few node checks, not after the self-test's timeout; no training."""
    def selftest_running(job_id: str, victim: str, out: str) -> bool:
        return bool(processes_mentioning(f"job-{job_id}/selftest-{victim}.json"))

    job_id, victim, out, took = _kill_during(bench, dead_nodes, "lost-in-selftest",
                                             selftest_running, selftest_timeout=400)
    assert "Ray cluster up" in out
    assert re.search(rf"lost node {victim} \(host localhost, address localhost, Slurm state "
                     r"\S+\) during the self-test", out), out
    assert f"FAILED (selftest): node {victim} lost during the self-test" in out
    assert f"result: FAILED at stage selftest (exit 13), lost node(s) {victim}" in out
    assert "=== stage training ===" not in out and "cluster verdict:" not in out
    assert took < 150, f"{took:.0f}s from the kill to the end (~20 s; SlurmdTimeout 300 s)"
    _nothing_left(bench, dead_nodes, job_id, victim)
    info = bench.cluster.job(job_id)
    assert info["ExitCode"] == "13:0", info
