"""The job survives the cluster (issue 39), on a real four-node Slurm (``slurm_cluster4``:
node1..node4 on this host, a requeued job's start delayed 21 s instead of Slurm's 121 s), running
the CPU fixture image through ``ch-run``; each job asks for two nodes (three for the bisection).

* A bad node: node2's TaskProlog breaks its environment (HIP_VISIBLE_DEVICES !=
  CUDA_VISIBLE_DEVICES, as a bad prolog could), so the image's self-test fails there. The job
  names node2 from its own checks, excludes it (``ExcNodeList``), requeues itself, and the second
  attempt runs on node1 and node3 through the self-test to the training stage.
* A node only the collective fails with: node2's TaskProlog points gloo at an interface that
  does not exist there (``GLOO_SOCKET_IFNAME``, as a wrong site setting could), so node2's own
  checks pass and the cross-node collective fails. The three-node job finds node2 by running the
  collective on node subsets (bisection), excludes it, requeues itself, and the second attempt
  runs on node1, node3 and node4 to the training stage.
* A preemption: Slurm's warning signal (``scancel --signal=USR1 --batch``, what
  ``--signal=B:USR1@S`` sends before the time limit) reaches the job while it trains; it waits for
  the trainer's next checkpoint, stops it and requeues itself; the second attempt starts from the
  first attempt's last checkpoint. The trainer here is a stand-in (``RESUME_PY``) that writes and
  reads verl's checkpoint layout (``global_step_N/`` and ``latest_checkpointed_iteration.txt`` in
  ``trainer.default_local_dir``, as ``RayPPOTrainer._save_checkpoint`` and
  ``_load_checkpoint`` with ``trainer.resume_mode=auto`` do): verl itself cannot train past the
  GPU boundary on CPU nodes.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.cluster.job import SlurmJob
from builder.cluster.render import write_sbatch
from builder.cluster.requeue import Resilience
from tests.slurm.conftest import SlurmCluster
from tests.slurm.test_sbatch_real import (
    Bench,
    _bench,
    _leftover_ray,
)

pytestmark = [pytest.mark.slurm, pytest.mark.fault]

# The stand-in trainer: resumes from verl's tracker file when there is one, then saves a
# checkpoint every second in verl's layout; a resumed run stops after two more steps.
RESUME_PY = """
import os, sys, time
# KEY=VALUE as hydra reads it: a value the job quoted for hydra's grammar (a path holding
# ${SLURM_JOB_ID}, expanded by the shell first) has its quotes taken off
args = {k: v[1:-1].replace("\\\\'", "'") if len(v) > 1 and v[0] == v[-1] == "'" else v
        for k, v in (a.split("=", 1) for a in sys.argv[1:])}
ckpt = args["trainer.default_local_dir"]
tracker = os.path.join(ckpt, "latest_checkpointed_iteration.txt")
start = 0
if os.path.exists(tracker):
    start = int(open(tracker).read().strip())
    state = open(os.path.join(ckpt, "global_step_%d" % start, "actor", "state.txt")).read()
    print("RESUMED from global_step_%d (%s)" % (start, state.strip()), flush=True)
last = start + 2 if start else 600
for step in range(start + 1, last + 1):
    time.sleep(1)
    folder = os.path.join(ckpt, "global_step_%d" % step, "actor")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "state.txt"), "w") as handle:
        handle.write("step %d\\n" % step)
    with open(tracker + ".tmp", "w") as handle:
        handle.write(str(step))
    os.replace(tracker + ".tmp", tracker)
    print("SAVED global_step_%d" % step, flush=True)
print("TRAINING DONE at global_step_%d" % last, flush=True)
"""


@pytest.fixture(scope="module")
def bench4(slurm_cluster4: SlurmCluster, image_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    yield from _bench(slurm_cluster4, image_dir, "ch-run", tmp_path_factory)


def _wait(bench: Bench, job_id: str, out: Path, timeout: float) -> dict[str, str]:
    """Wait for the job's end through its requeues (a requeued job keeps its id)."""
    deadline = time.monotonic() + timeout
    info: dict[str, str] = {}
    while time.monotonic() < deadline:
        info = bench.cluster.job(job_id)
        if info.get("JobState") in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}:
            return info
        time.sleep(1)
    bench.cluster.run("scancel", job_id)
    text = out.read_text(errors="replace") if out.exists() else ""
    raise AssertionError(f"job {job_id} still {info.get('JobState')} after {timeout}s "
                         f"(cancelled):\n{text[-4000:]}")


def _broken_node_run(bench: Bench, name: str, lines: str, job: SlurmJob,
                     timeout: float) -> tuple[str, dict[str, str], str, str]:
    """Submit ``job`` with node2's tasks given ``lines`` (its TaskProlog), wait for its end
    through the requeue, put node2 right again; (job id, its Slurm record, the output before
    the requeue, the output after it)."""
    switch = bench.break_node("node2", lines)
    script = write_sbatch(job, bench.root / f"{name}.sbatch")
    out = bench.root / f"{name}.out"
    start = time.monotonic()
    try:
        job_id = bench.cluster.sbatch(script, out, bench.env)
        info = _wait(bench, job_id, out, timeout)
    finally:
        switch.unlink()
    text = out.read_text(errors="replace")
    print(f"--- {name}: job {job_id} {info.get('JobState')} in "
          f"{time.monotonic() - start:.1f}s\n{text}")
    first, _, second = text.partition("result: requeued")
    assert second, "the job did not requeue itself"
    return job_id, info, first, second


def test_a_bad_node_is_excluded_and_the_job_requeued_onto_the_others(bench4: Bench) -> None:
    bench = bench4
    job = bench.job(resilience=Resilience(max_requeues=1, signal_seconds=0))
    job_id, info, first, second = _broken_node_run(
        bench, "bad-node", "HIP_VISIBLE_DEVICES=0\nCUDA_VISIBLE_DEVICES=1\n", job, 600)
    # attempt 1: node2's own checks failed; it is named, excluded, and the job requeued
    assert "self-test node2: FAIL" in first
    assert "node(s) node2 failed their own checks" in first, first
    assert "=== stage training ===" not in first
    assert second.startswith(" (attempt 2, excluded: node2): node(s) node2 failed the self-test")
    # attempt 2: two of node1, node3, node4 (Slurm's choice), self-test passed, training done
    assert "attempt 2 of job" in second and "excluded: node2" in second
    nodes = bench.cluster.run("scontrol", "show", "hostnames", info["NodeList"]).split()
    assert len(nodes) == 2 and "node2" not in nodes, info
    for node in nodes:
        assert f"node {node}: lo 127.0.0.1" in second and f"self-test {node}: pass" in second
    assert "node node2:" not in second
    assert "=== stage training ===" in second
    assert "TRAIN-STANDIN alive=2 tasks_on_nodes=2" in second
    assert "result: ok" in second
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", info
    assert info["Restarts"] == "1" and info["ExcNodeList"] == "node2", info
    job_dir = bench.root / f"job-{job_id}"
    assert (job_dir / "excluded-nodes.tsv").read_text().startswith("0\tnode2\t")
    assert (job_dir / "attempt-0" / "selftest-node2.rc").exists()  # the first attempt's, aside
    assert not (job_dir / "selftest-node2.rc").exists()
    assert _leftover_ray(bench) == []


def test_a_node_only_the_collective_fails_with_is_found_by_bisection_and_excluded(
        bench4: Bench) -> None:
    bench = bench4
    # per-phase timeouts of 20 s: a rank whose peer never joins waits out the collective's
    # deadline (preflight + env + collective), once in the self-test and once in the bisection
    job = bench.job(nodes=3, resilience=Resilience(max_requeues=1, signal_seconds=0,
                                                   bisect_seconds=300),
                    selftest_args="--timeout 20")
    job_id, info, first, second = _broken_node_run(bench, "bisect",
                                                   "GLOO_SOCKET_IFNAME=verlbad0\n", job, 900)
    # attempt 1: every node's own checks passed, the collective failed; the bisection names node2
    assert "self-test node2: FAIL" in first  # the ranks share one verdict
    assert "no node failed its own checks: the cross-node collective did" in first, first
    assert "bisection run 1: node1 node2 FAIL" in first
    assert "bisection run 2: node1 node3 pass" in first
    assert "collective bisection: node2 fails the collective with nodes that pass together " \
        "(2 runs" in first
    assert "=== stage training ===" not in first
    assert second.startswith(" (attempt 2, excluded: node2): node(s) node2 failed the cross-node "
                             "collective (found by bisection)"), second[:300]
    # attempt 2: node1, node3, node4 through the self-test to the training stage
    assert "node node2:" not in second
    for node in ("node1", "node3", "node4"):
        assert f"self-test {node}: pass" in second, second
    assert "TRAIN-STANDIN alive=3 tasks_on_nodes=3" in second
    assert "result: ok" in second
    assert info["JobState"] == "COMPLETED" and info["ExcNodeList"] == "node2", info
    job_dir = bench.root / f"job-{job_id}"
    assert (job_dir / "attempt-0" / "bisect" / "1-node2.rc").read_text().strip() != "0"
    assert (job_dir / "excluded-nodes.tsv").read_text().startswith("0\tnode2\t")
    assert _leftover_ray(bench) == []


def test_a_preempted_job_resumes_from_its_checkpoint(bench4: Bench) -> None:
    bench = bench4
    (bench.root / "scripts" / "resume.py").write_text(RESUME_PY)
    inputs = bench.inputs()
    job = bench.job(inputs=inputs,
                    resilience=Resilience(max_requeues=0, signal_seconds=60),
                    train_cmd=inputs.trainer_command().replace("-m verl.trainer.main_ppo",
                                                               "/mnt/resume.py"))
    script = write_sbatch(job, bench.root / "preempt.sbatch")
    assert "#SBATCH --signal=B:USR1@60" in script.read_text()
    out = bench.root / "preempt.out"
    start = time.monotonic()
    job_id = bench.cluster.sbatch(script, out, bench.env)
    tlog = bench.root / f"job-{job_id}" / "training.log"
    deadline = time.monotonic() + 400
    while "SAVED global_step_2" not in (tlog.read_text() if tlog.exists() else ""):
        assert time.monotonic() < deadline, out.read_text()[-3000:]
        assert bench.cluster.job(job_id).get("JobState") in {"PENDING", "CONFIGURING",
                                                             "RUNNING"}, out.read_text()
        time.sleep(0.5)
    bench.cluster.run("scancel", "--signal=USR1", "--batch", job_id)
    info = _wait(bench, job_id, out, 400)
    text = out.read_text(errors="replace")
    print(f"--- preempt: job {job_id} {info.get('JobState')} in {time.monotonic() - start:.1f}s"
          f"\n{text}")
    first, _, second = text.partition("result: requeued")
    assert second, "the job did not requeue itself"
    assert "Slurm's signal USR1" in first and "waiting up to" in first
    saved = re.search(r"verl resumes from global_step_(\d+)", second)
    assert saved, second[:400]
    step = int(saved.group(1))
    assert step >= 2
    earlier = (bench.root / f"job-{job_id}" / "attempt-0" / "training.log").read_text()
    # the trainer's last line can be lost with the kill that lands between its tracker write and
    # its print (2026-11-29 CI: tracker at 4, log ending at 3); the step before it was logged
    assert f"SAVED global_step_{step - 1}\n" in earlier and "RESUMED" not in earlier
    # the second attempt: the same job, resumed from that checkpoint, to the end
    assert f"RESUMED from global_step_{step} (step {step})" in second, second
    assert f"TRAINING DONE at global_step_{step + 2}" in second
    assert "result: ok" in second
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", info
    assert info.get("ExcNodeList") in ("(null)", ""), info  # a preemption blames no node
    assert _leftover_ray(bench) == []
