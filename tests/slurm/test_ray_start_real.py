"""Ray's own startup timeout on a node: the job rendered by ``build-env slurm`` starts Ray again.

"The current node timed out during startup" is what ``ray start`` raises when the node's raylet
has not registered with the GCS within Ray's fixed 30 s (``ray._private.node.Node``; no setting
reaches that wait). On a busy node (CI 2026-12-02: a 2-vCPU host, six test groups and an emulated
build beside it) the raylet is simply slow, and the next start works. Here the raylet of the
head's first start cannot come up for real: the test holds the node-manager port the job gives
it, so the raylet dies, and Ray's own Python waits its 30 s and raises that message. The port is
let go as soon as the message is in the head's log, so that the next start can work.

Expected: with attempts to spare, the job stops Ray on every node, keeps the attempt's logs as
``ray-*.try1.log``, starts Ray again and passes; with one attempt, it fails at stage services
(exit 12) naming the node, Ray's limit and ``--ray-start-attempts``, and leaves no Ray behind.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.cluster.render import write_sbatch
from tests.slurm.conftest import SlurmCluster
from tests.slurm.test_sbatch_real import Bench, _bench, _leftover_ray

pytestmark = [pytest.mark.slurm, pytest.mark.fault]

TIMED_OUT = "The current node timed out during startup"


@pytest.fixture(scope="module")
def bench(slurm_cluster: SlurmCluster, image_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    yield from _bench(slurm_cluster, image_dir, "ch-run", tmp_path_factory)


def _hold(port: int) -> socket.socket:
    """A listener on every address of ``port``: the raylet cannot bind it."""
    sock = socket.socket()
    sock.bind(("0.0.0.0", port))
    sock.listen(1)
    return sock


def _run_with_head_port_held(bench: Bench, name: str, attempts: int,
                             release: bool) -> tuple[dict[str, str], str, Path]:
    """Submit a job whose head raylet's port is held; let it go once Ray's timeout is logged
    (``release``) or at the end. Return (the job's Slurm record, its output, its directory)."""
    job = bench.job(ray_start_attempts=attempts)
    assert job.ray_ports is not None
    held: socket.socket | None = _hold(job.ray_ports.node_manager)  # node1 is index 0: no shift
    script = write_sbatch(job, bench.root / f"{name}.sbatch")
    out = bench.root / f"{name}.out"
    try:
        job_id = bench.cluster.sbatch(script, out, bench.env)
        job_dir = bench.root / f"job-{job_id}"
        deadline = time.monotonic() + 600
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            head_log = job_dir / "ray-node1.log"
            if release and held is not None and head_log.exists() \
                    and TIMED_OUT in head_log.read_text(errors="replace"):
                held.close()
                held = None
            info = bench.cluster.job(job_id)
            if info.get("JobState") in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}:
                break
            time.sleep(0.2)
        else:
            bench.cluster.run("scancel", job_id)
            raise AssertionError(f"job {job_id} did not end: {out.read_text()[-3000:]}")
    finally:
        if held is not None:
            held.close()
    text = out.read_text(errors="replace")
    print(f"--- {name}: job {job_id} {info.get('JobState')} {info.get('ExitCode')}\n{text}")
    return info, text, job_dir


def test_ray_started_again_after_its_startup_timeout(bench: Bench) -> None:
    info, out, job_dir = _run_with_head_port_held(bench, "ray-again", attempts=3, release=True)
    assert info["ExitCode"] == "0:0", out
    assert "warning: Ray on node1 timed out during startup" in out
    assert "started again, attempt 2 of 3" in out
    assert "Ray cluster up: 2 nodes alive" in out and "on attempt 2 of 3" in out
    assert out.count("ray head on node1") == 2, "Ray was not started exactly twice"
    assert "result: ok" in out
    # the first attempt's logs are kept beside the second's, which shows no timeout
    assert TIMED_OUT in (job_dir / "ray-node1.try1.log").read_text(errors="replace")
    assert TIMED_OUT not in (job_dir / "ray-node1.log").read_text(errors="replace")
    assert (job_dir / "ray-node2.try1.log").exists()
    assert _leftover_ray(bench) == [], "Ray processes outlived the job"


def test_last_ray_start_timing_out_fails_the_stage(bench: Bench) -> None:
    info, out, _ = _run_with_head_port_held(bench, "ray-once", attempts=1, release=False)
    assert info["ExitCode"] == "12:0", out
    assert "FAILED (services): Ray on node1 timed out during startup" in out
    assert "attempt 1 of 1" in out and "--ray-start-attempts" in out
    assert "started again" not in out
    assert "result: FAILED at stage services (exit 12)" in out
    assert _leftover_ray(bench) == [], "Ray processes outlived the job"
