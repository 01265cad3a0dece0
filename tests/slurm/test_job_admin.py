"""The job as a cluster admin reads it (issue 30, item 4): each finding tried on the rendered
script, with bash running the script's own functions against recording stand-ins for the Slurm
client tools (``scontrol``, ``srun``), and through ``build-env slurm`` itself.

The real-Slurm half (how many steps a running job launches, counted from the cluster's own
records) is ``test_sbatch_real.py::test_node_watch_launches_no_steps``.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from builder.cli import main
from builder.errors import SlurmError
from builder.cluster.job import SlurmJob
from builder.cluster.render import render_sbatch
from tests.slurm.test_render import ORAS, job_for

CPU = ["slurm", "--family", "cpu", "--sif", "/x", "--runtime", "ch-run", "--train-cmd",
       "python3 t.py"]


def _section(script: str, start: str, end: str) -> str:
    return script[script.index(start):script.index(end)]


def _function(script: str, name: str) -> str:
    lines = script.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(f"{name}() {{"))
    return "\n".join(lines[first:lines.index("}", first) + 1])


def _tool(bindir: Path, name: str, body: str) -> None:
    path = bindir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


# ---- lost-node watching: the controller first, a step only to probe a node it reports ----------

SCONTROL = r"""echo "scontrol $*" >>"$CALLS"
cat "$NODE_STATES"
"""
SRUN = r"""echo "srun $*" >>"$CALLS"
while [ $# -gt 0 ]; do if [ "$1" = -w ]; then node=$2; fi; shift; done
if [ "${node:-}" = "${DEAD_NODE:-none}" ]; then
  echo "srun: error: Task launch failed on node $node: Communication connection failure" >&2
  exit 1
fi
exit 0
"""


def _watch(tmp_path: Path, states: str, dead: str = "none") -> tuple[int, str, list[str]]:
    """Run the script's find_lost_nodes once; return (rc, LOST, the Slurm calls made)."""
    text = render_sbatch(job_for("cuda"))
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    _tool(bindir, "scontrol", SCONTROL)
    _tool(bindir, "srun", SRUN)
    (tmp_path / "states").write_text(states)
    calls = tmp_path / "calls"
    calls.write_text("")
    code = ("declare -A CPUS_OF=([node1]=8 [node2]=8)\nMIN_CPUS=8\nCPU_BIND=cores\n"
            "NODES=(node1 node2)\nlog() { echo \"$*\" >&2; }\n"
            + _function(text, "node_cpus") + "\n" + _function(text, "step") + "\n"
            + _function(text, "every_node") + "\n" + _function(text, "controller_lost") + "\n"
            + _function(text, "find_lost_nodes")
            + "\nrc=0\nfind_lost_nodes || rc=$?\necho \"rc=$rc lost=${LOST[*]}\"")
    proc = subprocess.run(["bash", "-c", code], capture_output=True, text=True, env={
        "PATH": f"{bindir}:{os.environ['PATH']}", "CALLS": str(calls),
        "NODE_STATES": str(tmp_path / "states"), "DEAD_NODE": dead,
        "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2"})
    match = re.search(r"rc=(\d+) lost=(.*)", proc.stdout)
    assert match, proc.stdout + proc.stderr
    return int(match.group(1)), match.group(2).strip(), calls.read_text().splitlines()


HEALTHY = ("NodeName=node1 Arch=x86_64 CPUTot=8 State=ALLOCATED ThreadsPerCore=1\n"
           "NodeName=node2 Arch=x86_64 CPUTot=8 State=MIXED ThreadsPerCore=1\n")


def test_node_watch_asks_the_controller_and_launches_no_step(tmp_path: Path) -> None:
    """Every node healthy by the controller: no step at all (main launched one per node each
    30 s: ~2,900 a day, past MaxStepCount 40,000 in 14 days)."""
    rc, lost, calls = _watch(tmp_path, HEALTHY)
    assert (rc, lost) == (0, "")
    assert [c for c in calls if c.startswith("srun")] == [], calls
    assert calls == ["scontrol show node -o node[1-2]"]


def test_node_watch_probes_only_a_node_the_controller_reports(tmp_path: Path) -> None:
    states = HEALTHY.replace("State=MIXED", "State=MIXED*")  # node2 not responding
    rc, lost, calls = _watch(tmp_path, states, dead="node2")
    assert (rc, lost) == (1, "node2")
    sruns = [c for c in calls if c.startswith("srun")]
    assert len(sruns) == 1 and "-w node2" in sruns[0], calls
    # a ping the controller lost, and the node answers the probe: not lost
    rc, lost, calls = _watch(tmp_path, states, dead="none")
    assert (rc, lost) == (0, "")
    # DOWN is the controller's own verdict: no probe needed
    rc, lost, calls = _watch(tmp_path, HEALTHY.replace("State=MIXED", "State=DOWN*"))
    assert (rc, lost) == (1, "node2") and not [c for c in calls if c.startswith("srun")]


# ---- shared nodes -------------------------------------------------------------------------------

def _ports(text: str, job_id: int) -> dict[str, int]:
    settings = _section(text, "# ---- settings (rendered)", "log() {")
    code = (settings + "\nfor v in $(compgen -v | grep -E '^(RAY_.*_PORT|SELFTEST_PORT)$'); "
            "do echo \"$v=${!v}\"; done")
    out = subprocess.run(["bash", "-c", code], capture_output=True, text=True, check=True, env={
        "PATH": os.environ["PATH"], "SLURM_JOB_ID": str(job_id), "HOME": "/h"}).stdout
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", out)}


def _claimed(ports: dict[str, int]) -> set[int]:
    out = {p for k, p in ports.items() if k not in ("RAY_MIN_WORKER_PORT", "RAY_MAX_WORKER_PORT")}
    return out | set(range(ports["RAY_MIN_WORKER_PORT"], ports["RAY_MAX_WORKER_PORT"] + 1))


def test_jobs_sharing_a_node_get_ports_of_their_own() -> None:
    """--no-exclusive: two jobs on one node (consecutive job ids) open disjoint port sets, all
    below the kernel's ephemeral range. Whole nodes keep the fixed, documented ports."""
    shared = render_sbatch(job_for("cuda", exclusive=False, cpus_per_task=16))
    a, b = _ports(shared, 4711), _ports(shared, 4712)
    assert a["RAY_GCS_PORT"] != b["RAY_GCS_PORT"]
    assert not _claimed(a) & _claimed(b), "two jobs on one node share ports"
    assert max(_claimed(a) | _claimed(b)) <= 32767 and min(_claimed(a)) >= 1024
    whole = render_sbatch(job_for("cuda"))
    assert _ports(whole, 4711) == _ports(whole, 4712)
    assert _ports(whole, 4711)["RAY_GCS_PORT"] == 6379
    assert _ports(whole, 4711)["SELFTEST_PORT"] == 29500


def test_shared_node_without_cpus_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    assert main([*CPU, "--no-exclusive", "--output", str(tmp_path / "j.sh")]) == 0
    err = capsys.readouterr().err
    assert "warning: --no-exclusive without --cpus-per-task" in err and "--num-cpus 1" in err
    assert main([*CPU, "--no-exclusive", "--cpus-per-task", "8", "--output",
                 str(tmp_path / "k.sh")]) == 0
    assert "warning" not in capsys.readouterr().err
    # and the job says it too when its allocation holds one CPU per node
    text = render_sbatch(job_for("cpu", runtime="ch-run", sif="/x", exclusive=False,
                                 train_cmd="true"))
    assert re.search(r'-lt 2 \]; then\n\s+log "warning: the allocation holds '
                     r'\$VERL_ENV_CPUS_PER_NODE CPU per node, so Ray gets --num-cpus', text)


# ---- secrets and the pass-list ------------------------------------------------------------------

def test_env_by_name_never_writes_the_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "s3cret-value-0451")
    out = tmp_path / "job.sh"
    assert main([*CPU, "--env", "WANDB_API_KEY", "--env", "NCCL_DEBUG=INFO", "--output",
                 str(out)]) == 0, capsys.readouterr().err
    text = out.read_text()
    assert "s3cret-value-0451" not in text
    assert re.search(r"^PASS_NAMES=\(.* WANDB_API_KEY\)$", text, re.M)
    assert "BY_NAME=(WANDB_API_KEY)" in text and 'export NCCL_DEBUG="INFO"' in text
    check = _function(text, "check_by_name")
    code = ("BY_NAME=(WANDB_API_KEY)\nfail() { echo \"FAIL $*\"; exit 1; }\n" + check
            + "\ncheck_by_name && echo ok")
    ok = subprocess.run(["bash", "-c", code], capture_output=True, text=True,
                        env={"PATH": os.environ["PATH"], "WANDB_API_KEY": "x"})
    assert ok.stdout.strip() == "ok"
    missing = subprocess.run(["bash", "-c", code], capture_output=True, text=True,
                             env={"PATH": os.environ["PATH"]})
    assert missing.returncode == 1 and "FAIL --env WANDB_API_KEY: not set" in missing.stdout
    monkeypatch.delenv("WANDB_API_KEY")
    assert main([*CPU, "--env", "WANDB_API_KEY"]) == 0
    assert "warning: --env WANDB_API_KEY: not set in this environment" in capsys.readouterr().err


def test_ray_variables_reach_the_container() -> None:
    """Every RAY_* variable of the job is on the pass-list (docs/slurm.md), so the ROCm
    profile's RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES reaches the container."""
    text = render_sbatch(job_for("rocm"))
    assert 'export_default RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES "1"' in text
    code = (_section(text, "PASS_NAMES=(", "log() {") + _function(text, "passed_names")
            + "\npassed_names")
    out = subprocess.run(["bash", "-c", code], capture_output=True, text=True, check=True, env={
        "PATH": os.environ["PATH"], "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1",
        "RAY_DEDUP_LOGS": "0", "RAY_ADDRESS": "10.0.0.1:6379", "SECRET_OTHER": "x"}).stdout
    names = out.split()
    assert {"RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES", "RAY_DEDUP_LOGS",
            "RAY_ADDRESS"} <= set(names)
    assert "SECRET_OTHER" not in names


# ---- paths, options, numbers --------------------------------------------------------------------

def test_tilde_is_expanded_on_the_nodes_in_every_path_option(tmp_path: Path) -> None:
    out = tmp_path / "job.sh"
    assert main([*CPU, "--hf-home", "~/hf", "--cache-dir", "~/sifs", "--data", "~/d",
                 "--bind", "~/x:/x", "--checkpoint-dir", "~/ck", "--output", str(out)]) == 0
    text = out.read_text()
    assert '"~' not in text
    settings = _section(text, "# ---- settings (rendered)", "log() {")
    got = subprocess.run(["bash", "-c", settings + '\necho "$HF_HOME|$SIF_CACHE_DIR|'
                          '${BIND_SRC[*]}|$CHECKPOINT_DIR"'], capture_output=True, text=True,
                         check=True, env={"PATH": os.environ["PATH"], "HOME": "/home/u",
                                          "SLURM_JOB_ID": "1"}).stdout.strip()
    assert got == "/home/u/hf|/home/u/sifs|/home/u/d /home/u/ck /home/u/x|/home/u/ck"
    with pytest.raises(SlurmError, match="only ~ and ~/"):
        job_for("cuda", hf_home="~other/hf")


def test_trust_key_is_resolved_and_must_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["slurm", "--family", "cuda", "--sif", ORAS, "--train-cmd", "python3 t.py",
            "--trust-key", "keys/site.pub"]
    assert main(args) == 2
    assert f"--trust-key keys/site.pub: {tmp_path}/keys/site.pub is not a file" in \
        capsys.readouterr().err
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "site.pub").write_text("key\n")
    assert main(args) == 0
    assert f'--key "{tmp_path}/keys/site.pub"' in capsys.readouterr().out


def test_family_contradicting_the_target_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["slurm", "--target", "cuda-x86_64", "--family", "rocm", "--sif", ORAS,
                 "--train-cmd", "python3 t.py"]) == 2
    assert "--family rocm contradicts --target cuda-x86_64, a cuda target" in \
        capsys.readouterr().err


def test_selftest_phases_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CPU, "--selftest-phases", "preflight,colective"]) == 2
    assert "unknown phase(s) 'colective'" in capsys.readouterr().err
    assert main([*CPU, "--selftest-phases", "preflight,env,ray"]) == 0


@pytest.mark.parametrize("option, value, message", [
    ("--nodes", "100000", "nodes must be a whole number from 1 to 4096"),
    ("--nodes", "-1", "nodes must be a whole number from 1"),
    ("--cpus-per-task", "1000000", "cpus_per_task must be a whole number from 1 to 8192"),
    ("--ray-wait-timeout", "99999999", "ray_wait_timeout must be a whole number from 1 to"),
    ("--node-check-interval", "86400", "node_check_interval must be a whole number from 1 to"),
    ("--ray-start-attempts", "0", "ray_start_attempts must be a whole number from 1 to 10"),
    ("--ray-start-attempts", "11", "ray_start_attempts must be a whole number from 1 to 10"),
])
def test_numbers_are_bounded(option: str, value: str, message: str,
                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CPU, option, value]) == 2
    assert message in capsys.readouterr().err
    with pytest.raises(SlurmError, match="gpus_per_node must be a whole number from 0 to 64"):
        SlurmJob(target="t", family="cuda", sif=ORAS, train_cmd="x", gpus_per_node=512)


def test_sbatch_nodes_line_only_when_given(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(CPU) == 0
    assert "#SBATCH --nodes" not in capsys.readouterr().out
    assert main([*CPU, "--nodes", "3"]) == 0
    assert "#SBATCH --nodes=3\n" in capsys.readouterr().out
