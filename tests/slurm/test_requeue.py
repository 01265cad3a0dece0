"""Requeue, resume and the GPU boundary (issue 39, items 1, 2 and 6) on the rendered script:
bash runs the script's own functions against recording stand-ins for ``scontrol``; the options
go through ``build-env slurm`` itself. The real-Slurm half (three nodes, one bad; a preemption
resumed) is ``test_requeue_real.py``.

The GPU-boundary excerpts are what Ray prints for an exception raised in one of verl's workers
(``ray.exceptions.RayTaskError(...): ray::CLASS.METHOD() (pid=…, ip=…, actor_id=…, repr=…)``,
nested in main_ppo's ``TaskRunner.run``), with torch's own message on a CPU build; the real
run's log is asserted in ``test_sbatch_real.py::test_real_trainer_to_the_gpu_boundary_on_both_nodes``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from builder.cli import main
from builder.cluster import requeue
from builder.cluster.render import render_sbatch
from builder.cluster.requeue import Resilience
from builder.cluster.verdict import ClusterVerdict, excluded_nodes
from builder.commands import _requeue
from builder.errors import SlurmError
from tests.slurm.test_job_admin import _function, _tool
from tests.slurm.test_render import job_for

CPU = ["slurm", "--family", "cpu", "--sif", "/x", "--runtime", "ch-run", "--train-cmd",
       "python3 t.py"]


# ---- the options ------------------------------------------------------------------------------

def test_defaults_ask_slurm_for_requeue_append_and_the_signal(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(CPU) == 0
    text = capsys.readouterr().out
    for line in ("#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --signal=B:USR1@300"):
        assert line in text.splitlines(), line
    assert "MAX_REQUEUES=1" in text and "REQUEUE_SIGNAL_SECONDS=300" in text
    assert "STOP_GRACE=240" in text


def test_each_can_be_turned_off(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CPU, "--requeue-signal-seconds", "0"]) == 0
    text = capsys.readouterr().out
    assert "--signal=" not in text and "#SBATCH --requeue" in text  # the bad-node requeue stays
    assert main([*CPU, "--max-requeues", "0", "--requeue-signal-seconds", "0"]) == 0
    text = capsys.readouterr().out
    assert "#SBATCH --requeue" not in text and "--open-mode" not in text
    assert "MAX_REQUEUES=0" in text and "REQUEUE_SIGNAL_SECONDS=0" in text


@pytest.mark.parametrize("option,value", [("--max-requeues", "-2"), ("--max-requeues", "101"),
                                          ("--requeue-signal-seconds", "-1"),
                                          ("--requeue-signal-seconds", "70000")])
def test_out_of_range_values_name_the_option(option: str, value: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CPU, option, value]) == 2
    err = capsys.readouterr().err
    assert f"{option} must be a whole number" in err and value in err


def test_a_word_is_refused_naming_the_option() -> None:
    parser = argparse.ArgumentParser(exit_on_error=False)
    _requeue.add_arguments(parser)
    with pytest.raises(argparse.ArgumentError, match="--max-requeues takes a whole number"):
        parser.parse_args(["--max-requeues", "two"])
    with pytest.raises(SlurmError, match="--max-requeues"):
        requeue.validate(Resilience(max_requeues=True))  # type: ignore[arg-type]


def test_stop_grace_leaves_time_to_stop_and_requeue() -> None:
    assert Resilience(signal_seconds=300).stop_grace() == 240
    assert Resilience(signal_seconds=60).stop_grace() == 30
    assert Resilience(signal_seconds=10).stop_grace() == 5
    assert Resilience(signal_seconds=0).stop_grace() == 0


# ---- a bad node excluded, the job requeued --------------------------------------------------------

SCONTROL = r"""echo "scontrol $*" >>"$CALLS"
case $1 in
  show)
    if [ "$2" = hostnames ]; then tr ',' '\n' <<<"$3"; exit 0; fi
    echo "JobId=$SLURM_JOB_ID JobName=j ExcNodeList=${EXC:-(null)} NodeList=node[1-3]" ;;
esac
"""


def _requeue_code(text: str, body: str) -> str:
    parts = [_function(text, name) for name in ("attempt", "excluded_before", "partition_nodes",
                                                "route_around", "requeue_self",
                                                "selftest_faulty")]
    return ("set -euo pipefail\nlog() { echo \"$*\" >&2; }\nEXCLUDE=()\nREQUEUE_WHY=\"\"\n"
            "ROUTED=\"\"\n" + "\n".join(parts) + "\n" + body)


def _run(tmp_path: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    _tool(bindir, "scontrol", SCONTROL)
    _tool(bindir, "sinfo", 'echo "sinfo $*" >>"$CALLS"\nprintf "%s\\n" $POOL\n')
    (tmp_path / "calls").write_text("")
    return subprocess.run(["bash", "-c", code], capture_output=True, text=True, env={
        "PATH": f"{bindir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls"),
        "SLURM_JOB_ID": "77", "VERL_ENV_JOB_DIR": str(tmp_path), "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_PARTITION": "gpu", "POOL": "node1 node2 node3 node4 node2", **env})


def test_a_bad_node_is_excluded_with_the_earlier_ones_then_the_job_requeued(
        tmp_path: Path) -> None:
    text = render_sbatch(job_for("cpu", runtime="ch-run", sif="/x", train_cmd="python3 t.py"))
    code = _requeue_code(text, "MAX_REQUEUES=2\nroute_around 'failed the self-test' node2\n"
                               "requeue_self\n")
    proc = _run(tmp_path, code, SLURM_RESTART_COUNT="1", EXC="node3")
    assert proc.returncode == 0, proc.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    # requeued first (Slurm takes ExcNodeList only while the job is pending), then excluded
    assert calls[-2:] == ["scontrol requeue 77",
                          "scontrol update JobId=77 ExcNodeList=node3,node2"], calls
    assert "result: requeued (attempt 3, excluded: node3,node2): node(s) node2 failed the " \
        "self-test" in proc.stderr
    assert (tmp_path / "excluded-nodes.tsv").read_text() == \
        "1\tnode2\tnode(s) node2 failed the self-test\n"
    assert excluded_nodes(tmp_path) == ({"node": "node2", "attempt": 1,
                                         "reason": "node(s) node2 failed the self-test"},)


def test_no_requeue_the_partition_cannot_satisfy(tmp_path: Path) -> None:
    """Two nodes excluded (one before) from a partition of four, for a job of two: one left;
    the requeued job would pend forever, so it is not requeued."""
    text = render_sbatch(job_for("cpu", runtime="ch-run", sif="/x", train_cmd="python3 t.py"))
    code = _requeue_code(text, "MAX_REQUEUES=3\nroute_around lost node2 node4\n"
                               "echo \"why=$REQUEUE_WHY\"\n")
    proc = _run(tmp_path, code, SLURM_RESTART_COUNT="1", EXC="node3")
    assert "not requeued: without node2 node4 the partition gpu has 1 node(s) for a job of 2" \
        in proc.stderr, proc.stderr
    assert "why=\n" in proc.stdout
    assert "sinfo -h -N -o %N -p gpu" in (tmp_path / "calls").read_text()


@pytest.mark.parametrize("max_requeues,restarts,said", [
    (0, "", "not requeued: --max-requeues 0 (submit again without them: "
            "sbatch --exclude=node2,node3)"),
    (1, "1", "not requeued: the job was requeued 1 time(s) already (--max-requeues 1"),
])
def test_the_requeues_are_bounded(tmp_path: Path, max_requeues: int, restarts: str,
                                  said: str) -> None:
    text = render_sbatch(job_for("cpu", runtime="ch-run", sif="/x", train_cmd="python3 t.py"))
    code = _requeue_code(text, f"MAX_REQUEUES={max_requeues}\n"
                               "route_around lost node2 node3\necho \"why=$REQUEUE_WHY\"\n")
    env = {"SLURM_RESTART_COUNT": restarts} if restarts else {}
    proc = _run(tmp_path, code, **env)
    assert proc.returncode == 0, proc.stderr
    assert said in proc.stderr
    assert "why=\n" in proc.stdout  # nothing to requeue for


def test_the_node_whose_own_checks_failed_is_named(tmp_path: Path) -> None:
    """The ranks share one verdict (every rank exits 1); each node's own checks, kept in the job
    directory through the self-test's --keep-logs, name the bad one. A node that left no exit
    code is bad too."""
    text = render_sbatch(job_for("cpu", runtime="ch-run", sif="/x", train_cmd="python3 t.py"))
    for node, status in (("node1", "pass"), ("node2", "fail"), ("node3", "pass")):
        (tmp_path / f"selftest-{node}.rc").write_text("1\n")
        logs = tmp_path / f"selftest-logs-{node}" / "verl-env-selftest-abc"
        logs.mkdir(parents=True)
        (logs / "local.json").write_text(json.dumps([
            {"id": "env.visible_devices", "status": status}, {"id": "import.torch",
                                                              "status": "pass"}]))
    (tmp_path / "selftest-node4.rc").write_text("")
    code = _requeue_code(text, "NODES=(node1 node2 node3 node4)\nselftest_faulty\n")
    proc = _run(tmp_path, code)
    assert proc.stdout.split() == ["node2", "node4"], proc.stderr


def test_the_next_attempt_moves_the_earlier_results_aside(tmp_path: Path) -> None:
    text = render_sbatch(job_for("cpu", runtime="ch-run", sif="/x", train_cmd="python3 t.py"))
    for name in ("selftest-node3.rc", "selftest-node1.json", "cluster-verdict.json",
                 "training.log", "job.sh"):
        (tmp_path / name).write_text("x")
    (tmp_path / "bisect").mkdir()
    (tmp_path / "bisect" / "1-node2.rc").write_text("1\n")
    code = _requeue_code(text, _function(text, "archive_attempt") + "\narchive_attempt\n")
    proc = _run(tmp_path, code, SLURM_RESTART_COUNT="1", EXC="node3")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "attempt-0").iterdir()) == [
        "bisect", "cluster-verdict.json", "selftest-node1.json", "selftest-node3.rc",
        "training.log"]
    assert (tmp_path / "attempt-0" / "bisect" / "1-node2.rc").exists()
    assert (tmp_path / "job.sh").exists()
    assert "attempt 2 of job 77 (requeued 1 time(s))" in proc.stderr and "excluded: node3" \
        in proc.stderr


def test_the_verdict_keeps_the_excluded_nodes() -> None:
    excluded = ({"node": "node3", "attempt": 0, "reason": "node(s) node3 failed the self-test"},)
    v = ClusterVerdict("site", {"digest": "sha256:" + "0" * 64, "family": "cpu"}, "7", "now",
                       (), None, {}, "ch-run", excluded)
    again = ClusterVerdict.from_dict(json.loads(json.dumps(v.to_dict())))
    assert again.excluded == excluded and "excluded node3" in again.describe()


# ---- the collective's culprit found by bisection -------------------------------------------------

# srun stand-in: the collective on --nodelist fails on every node when BAD names one of them
# (a rank that cannot reach its peers fails them all); each node's exit code where the job's
# node side leaves it (PREFIX-NODE.rc), after SLOW seconds
BISECT_SRUN = r"""echo "srun $*" >>"$CALLS"
for a in "$@"; do case $a in --nodelist=*) nodes=${a#--nodelist=} ;; esac; done
prefix=${@: -2:1}
sleep "${SLOW:-0}"
rc=0
for n in ${nodes//,/ }; do for b in $BAD; do if [ "$n" = "$b" ]; then rc=1; fi; done; done
for n in ${nodes//,/ }; do echo "$rc" >"$prefix-$n.rc"; done
exit "$rc"
"""


def _bisect(tmp_path: Path, nodes: int, bad: str, seconds: int = 600,
            slow: str = "0") -> tuple[list[str], str, list[str]]:
    """Run the script's bisect_collective on NODES node1..N; (its stdout words, its log, the
    node lists it ran the collective on)."""
    text = render_sbatch(job_for("cpu", runtime="ch-run", sif="/x", train_cmd="python3 t.py"))
    parts = [_function(text, name) for name in ("node_addr", "collective_on",
                                                "bisect_collective", "bisect_time")]
    names = " ".join(f"node{i}" for i in range(1, nodes + 1))
    addrs = " ".join(f"10.0.0.{i}" for i in range(1, nodes + 1))
    code = ("set -uo pipefail\nlog() { echo \"$*\" >&2; }\n"
            f"NODES=({names})\nADDRS=({addrs})\nSELFTEST_PORT=29500\nMIN_CPUS=1\n"
            f"CPU_BIND=cores\nPX=()\nSELF=/job.sh\nBISECT_SECONDS={seconds}\n"
            + "\n".join(parts) + "\nbisect_collective\n")
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    _tool(bindir, "srun", BISECT_SRUN)
    (tmp_path / "calls").write_text("")
    proc = subprocess.run(["bash", "-c", code], capture_output=True, text=True, env={
        "PATH": f"{bindir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls"),
        "VERL_ENV_JOB_DIR": str(tmp_path), "BAD": bad, "SLOW": slow})
    assert proc.returncode == 0, proc.stderr
    runs = [re.search(r"--nodelist=(\S+)", c).group(1)  # type: ignore[union-attr]
            for c in (tmp_path / "calls").read_text().splitlines()]
    return proc.stdout.split(), proc.stderr, runs


@pytest.mark.parametrize("nodes,bad,most", [(3, "node3", 2), (3, "node2", 2), (3, "node1", 3),
                                            (6, "node5", 4), (16, "node11", 6),
                                            (16, "node1", 3), (64, "node40", 8)])
def test_the_node_the_collective_fails_with_is_found(tmp_path: Path, nodes: int, bad: str,
                                                     most: int) -> None:
    """An anchor that passed with a partner, then half the suspects at a time: about log2(N)
    runs, each on the anchor and a half, the last one on a pair."""
    found, said, runs = _bisect(tmp_path, nodes, bad)
    assert found == [bad], said
    assert len(runs) <= most, runs
    assert f"collective bisection: {bad} fails the collective with nodes that pass together" \
        in said
    assert len(runs) >= 2 and all(len(r.split(",")) >= 2 for r in runs)
    # each run is the self-test's collective on those nodes only, with its own results
    calls = (tmp_path / "calls").read_text().splitlines()
    assert all("/job.sh --node selftest " in c and c.endswith(" preflight,env,collective")
               for c in calls), calls
    assert (tmp_path / "bisect" / f"1-{runs[0].split(',')[0]}.rc").exists()


def test_no_culprit_is_named_when_it_cannot_be_told(tmp_path: Path) -> None:
    found, said, runs = _bisect(tmp_path, 4, "node1 node2")  # two bad nodes
    assert found == [] and "no pair of node1, node2, node3 passed" in said, said
    found, said, runs = _bisect(tmp_path, 2, "node2")  # a pair cannot name one of its two
    assert found == [] and runs == [] and "a pair that fails cannot tell" in said
    found, said, runs = _bisect(tmp_path, 5, "")  # the failure does not come back
    assert found == [] and "every subset passed" in said, said
    found, said, runs = _bisect(tmp_path, 5, "node4", seconds=0)
    assert found == [] and runs == [] and "off (--bisect-seconds 0)" in said


def test_the_bisection_is_bounded_in_time(tmp_path: Path) -> None:
    """Sixteen nodes take six runs; at 1.5 s a run, three seconds hold two or three."""
    found, said, runs = _bisect(tmp_path, 16, "node11", seconds=3, slow="1.5")
    assert found == [] and "(--bisect-seconds 3): nothing excluded" in said, said
    assert f"out of time after {len(runs)} runs" in said and 1 <= len(runs) <= 3, runs


def test_the_job_bisects_only_when_no_node_failed_its_own_checks(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CPU, "--bisect-seconds", "120"]) == 0
    text = capsys.readouterr().out
    assert "BISECT_SECONDS=120" in text
    stage = _function(text, "stage_selftest")
    own, collective = stage.index("failed their own checks"), stage.index("bisect_collective")
    assert own < collective
    assert 'route_around "failed the cross-node collective (found by bisection)"' in stage
    assert main([*CPU, "--bisect-seconds", "-1"]) == 2
    assert "--bisect-seconds must be a whole number of seconds from 0" in \
        capsys.readouterr().err


# ---- Slurm's signal: verl's checkpoint, then a requeue ----------------------------------------------

def _preempt(tmp_path: Path, writes: bool) -> subprocess.CompletedProcess[str]:
    """A training step (a loop that writes verl's tracker file after 2 s when ``writes``) gets
    Slurm's USR1 while watch_step watches it."""
    text = render_sbatch(job_for("cpu", runtime="ch-run", sif="/x", train_cmd="python3 t.py"))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    trainer = (f"(sleep 2; echo 4 >{ckpt}/latest_checkpointed_iteration.txt; sleep 60) &"
               if writes else "(sleep 60) &")
    code = ("set -euo pipefail\nlog() { echo \"$*\" >&2; }\nSTAGE=training\nRAY_PIDS=()\n"
            f"CHECKPOINT_DIR={ckpt}\nNODE_CHECK_INTERVAL=30\nSTOP_GRACE=8\n"
            "REQUEUE_SIGNAL_SECONDS=10\nPREEMPT=\"\"\nEXCLUDE=(x)\nREQUEUE_WHY=\"\"\n"
            "fail() { echo \"FAIL: $*\"; echo \"why=$REQUEUE_WHY excl=${EXCLUDE[*]}\"; exit 1; }\n"
            + "\n".join(_function(text, n) for n in ("on_usr1", "ckpt_mark", "preempt_stop",
                                                     "watch_step", "stop_step", "signal_tree"))
            + "\ntrap on_usr1 USR1\n" + trainer + "\npid=$!\n"
            "(sleep 1; kill -USR1 $$) &\nwatch_step \"$pid\" \"during training\"\n")
    return subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"]})


def test_the_signal_waits_for_verls_checkpoint_then_requeues(tmp_path: Path) -> None:
    proc = _preempt(tmp_path, writes=True)
    assert "Slurm's signal USR1" in proc.stderr, proc.stderr
    assert "waiting up to" in proc.stderr
    assert re.search(r"FAIL: stopped for Slurm's signal \(time limit or preemption\) at stage "
                     r"training; verl resumes from global_step_4", proc.stdout), proc.stdout
    assert "excl=\n" in proc.stdout  # no node is blamed for a preemption


def test_no_checkpoint_no_requeue(tmp_path: Path) -> None:
    proc = _preempt(tmp_path, writes=False)
    assert "not requeued: verl wrote no checkpoint" in proc.stdout, proc.stdout + proc.stderr
    assert "why= " in proc.stdout


# ---- the GPU boundary (item 6) ---------------------------------------------------------------------

# verl 0.9.1's own log where it stopped in the real two-node run (test_sbatch_real.py's
# test_real_trainer_to_the_gpu_boundary_on_both_nodes): from the first WorkerDict line to the end
# (the data paths replaced by /shared), Ray's colours included.
REAL = (Path(__file__).parent / "data" / "verl-gpu-boundary.log").read_text()
WORKER_CALL = "ray::WorkerDict.actor_rollout_ref_init_model()"


def _boundary(tmp_path: Path, log: str, nnodes: int = 2, gpus: int = 1) -> tuple[int, str]:
    text = render_sbatch(job_for("cpu", runtime="ch-run", sif="/x", ray_logical_gpus=1,
                                 train_cmd="python3 -m verl.trainer.main_ppo a=1"))
    (tmp_path / "training.log").write_text(log)
    defs = "\n".join(line for line in text.splitlines()
                     if line.startswith(("GPU_BOUNDARY=", "GPU_FIRST_CALLS=")))
    code = (defs + f"\nNODES=(node1 node2)\nTRAIN_NNODES={nnodes}\nTRAIN_GPUS_PER_NODE={gpus}\n"
            + _function(text, "gpu_boundary") + f"\ngpu_boundary {tmp_path / 'training.log'}\n")
    proc = subprocess.run(["bash", "-c", code], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"]})
    return proc.returncode, proc.stdout.strip()


def test_the_boundary_is_verls_workers_stopping_at_init_model(tmp_path: Path) -> None:
    assert WORKER_CALL in REAL and "Distributed package doesn't have NCCL built in" in REAL
    assert _boundary(tmp_path, REAL) == (
        0, "init_model (WorkerDict.actor_rollout_ref_init_model; 2 workers)")
    # the workers' creation task is where verl first needs the GPU too (Ray's words for an
    # actor whose __init__ raised; reconstructed, not from a run)
    died = ("ray.exceptions.ActorDiedError: The actor died because of an error raised in its "
            "creation task, ray::WorkerDict.__init__() (pid={pid}, ip=10.0.0.2, actor_id=1)\n")
    log = died.format(pid=11) + died.format(pid=12) + "RuntimeError: Distributed package " \
        "doesn't have NCCL built in\n"
    assert _boundary(tmp_path, log) == (0, "WorkerDict.__init__ (2 workers)")


def test_every_worker_must_be_in_the_log(tmp_path: Path) -> None:
    """4 nodes x 1 GPU need 4 workers: the log shows 2 (pids 3159, 3160), so verl's workers
    were not shown on every node."""
    assert _boundary(tmp_path, REAL, nnodes=4)[0] == 1
    assert _boundary(tmp_path, REAL, nnodes=1, gpus=2)[0] == 0


@pytest.mark.parametrize("change", ["driver", "later-call", "other-error"])
def test_a_failure_that_only_mentions_cuda_is_a_training_failure(tmp_path: Path,
                                                                 change: str) -> None:
    """The real log, changed: torch's CUDA message raised by main_ppo's own TaskRunner (no
    worker: the data or the reward, say) among the workers' real lines, which mention CUDA
    (``PlatformCUDA is registered but not available``); the workers failing at a later call;
    the workers failing at init_model for a reason that is no GPU's. Each is exit 14."""
    head = "".join(line + "\n" for line in REAL.splitlines() if "(WorkerDict pid=" in line)
    assert "PlatformCUDA" in head
    logs = {
        "driver": head + "ray.exceptions.RayTaskError(AssertionError): ray::TaskRunnerV1.run() "
                         "(pid=856, ip=192.0.2.2)\nAssertionError: Torch not compiled with CUDA "
                         "enabled\n",
        "later-call": REAL.replace("actor_rollout_ref_init_model", "actor_rollout_ref_"
                                   "generate_sequences"),
        "other-error": REAL.replace("Distributed package doesn't have NCCL built in",
                                    "No such file or directory: 'config.json'"),
    }
    assert _boundary(tmp_path, logs[change])[0] == 1
