"""Rendering the sbatch script: shellcheck on every family and several option sets, the
contract of SlurmJob/render_sbatch/write_sbatch/CLI, and the node side run for real with the
stand-in runtime (no Slurm needed)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
from dataclasses import replace
from pathlib import Path

import jinja2
import pytest

from builder import slurm
from builder.errors import SlurmError
from builder.slurm import RayPorts, SlurmJob, render_sbatch, shell_word, write_sbatch

DIGEST = "0123456789abcdef" * 4
ORAS = f"oras://registry.example.org/verl/cuda-x86_64@sha256:{DIGEST}"

OPTION_SETS: dict[str, dict[str, object]] = {
    "defaults": {},
    "site": dict(partition="gpu-a100", time="2-00:00:00", interface="eth2", nodes=16,
                 cpus_per_task=96, env={"NCCL_IB_HCA": "=mlx5_0:1,mlx5_3:1", "NCCL_DEBUG": "INFO",
                                        "WEIRD": "it's \"$HOME\" `x` $(y) \\n"}),
    "single-node": dict(nodes=1, gpus_per_node=4, selftest_phases="preflight,imports"),
    "custom-train": dict(train_cmd="python3 -m verl.trainer.main_ppo 'data.train_files=[\"a b\"]' "
                                   "trainer.nnodes=${SLURM_NNODES} trainer.project_name='it''s' "
                                   "actor_rollout_ref.model.path=$HF_HOME/m"),
    "docker-source": dict(sif=f"docker://images.example.net/x/verl@sha256:{DIGEST}", runtime="singularity",
                          cache_dir="/scratch/$USER/sif", hf_home="/scratch/${USER}/hf"),
    "path-source": dict(sif="/shared/images/verl.sif", exclusive=False, port_stride=100,
                        ray_ports=RayPorts(min_worker=20000, max_worker=20050)),
}


def job_for(kind: str, **overrides: object) -> SlurmJob:
    values: dict[str, object] = dict(target=f"{kind}-x86_64", family=kind, sif=ORAS)
    if kind == "cpu":
        values["gpus_per_node"] = 0
    values.update(overrides)
    return SlurmJob(**values)  # type: ignore[arg-type]


def shellcheck(path: Path) -> list[dict[str, object]]:
    proc = subprocess.run(["shellcheck", "-f", "json", "-s", "bash", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout or "[]")


@pytest.mark.skipif(shutil.which("shellcheck") is None,
                    reason="shellcheck not installed (apt-get install shellcheck)")
@pytest.mark.parametrize("options", sorted(OPTION_SETS))
@pytest.mark.parametrize("family", ["cuda", "rocm", "cpu"])
def test_generated_script_passes_shellcheck(family: str, options: str, tmp_path: Path) -> None:
    """No findings at all (style level included, no excludes)."""
    script = write_sbatch(job_for(family, **OPTION_SETS[options]), tmp_path / "job.sbatch")
    findings = shellcheck(script)
    assert findings == [], "\n".join(f"{f['line']}: SC{f['code']} {f['message']}" for f in findings)


def test_family_profiles() -> None:
    cuda, rocm, cpu = (render_sbatch(job_for(f)) for f in ("cuda", "rocm", "cpu"))
    assert 'RT=("$RUNTIME" exec --nv ' in cuda and "--rocm" not in cuda
    assert 'RT=("$RUNTIME" exec --rocm ' in rocm and "--nv " not in rocm
    assert 'RT=("$RUNTIME" exec -B' in cpu
    for text in (cuda, rocm):
        assert "#SBATCH --gpus-per-node=8" in text
        for line in ('export_default NCCL_SOCKET_IFNAME "$IFACE"', "export_default NCCL_IB_DISABLE 0",
                     "export_default NCCL_IB_GID_INDEX 3", 'export_default NCCL_IB_HCA "$hcas"'):
            assert line in text
    assert "--gpus-per-node" not in cpu and "NCCL_IB" not in cpu
    assert "RCCL_MSCCL_ENABLE 0" in rocm and "HSA_NO_SCRATCH_RECLAIM 1" in rocm
    assert "RCCL_MSCCL" not in cuda and "HSA_NO_SCRATCH" not in cuda
    assert "unset ROCR_VISIBLE_DEVICES" in rocm and "unset ROCR" not in cuda
    for text in (cuda, rocm, cpu):
        assert 'GLOO_SOCKET_IFNAME "$IFACE"' in text
        assert "-B /dev/infiniband" in text


def test_node_list_ray_ports_and_train_defaults() -> None:
    text = render_sbatch(job_for("cuda", cpus_per_task=48))
    assert 'mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")' in text
    assert 'nodes_array=("$nodes")' not in text
    for flag in ("--port", "--dashboard-port", "--ray-client-server-port", "--node-manager-port",
                 "--object-manager-port", "--min-worker-port", "--max-worker-port", "--block",
                 "--node-ip-address", "--num-cpus", "--num-gpus", "--temp-dir"):
        assert flag in text
    for setting in ("RAY_GCS_PORT=6379", "RAY_DASHBOARD_PORT=8265", "RAY_CLIENT_PORT=10001",
                    "RAY_MIN_WORKER_PORT=10002", "RAY_MAX_WORKER_PORT=19999",
                    'VERL_ENV_CPUS_PER_NODE="${SLURM_CPUS_PER_TASK:-48}"',
                    'VERL_ENV_GPUS_PER_NODE="${SLURM_GPUS_PER_NODE:-8}"', "#SBATCH --exclusive"):
        assert setting in text
    assert ('local cmd=("python3" "-m" "verl.trainer.main_ppo" "trainer.nnodes=${SLURM_NNODES}" '
            '"trainer.n_gpus_per_node=${VERL_ENV_GPUS_PER_NODE}")') in text


def test_site_overrides_come_after_defaults() -> None:
    text = render_sbatch(job_for("cuda", env={"NCCL_IB_GID_INDEX": "0"}))
    assert text.index("export_default NCCL_IB_GID_INDEX 3") < text.index('export NCCL_IB_GID_INDEX="0"')


@pytest.mark.parametrize("value", ["plain", "$HOME/x", "${HOME}y", "a b", "it's", 'q"q', "`id`",
                                   "$(id)", "\\", "$", "50%", "${HOME:-x}", "!x"])
def test_shell_word_round_trips_through_bash(value: str) -> None:
    """Only $NAME/${NAME} expand; everything else stays literal."""
    out = subprocess.run(["bash", "-c", f"printf %s {shell_word(value)}"], capture_output=True,
                         text=True, env={"HOME": "/h", "PATH": os.environ["PATH"]}, check=True).stdout
    expected = value.replace("${HOME}", "/h") if "${HOME}" in value else value.replace("$HOME", "/h")
    assert out == expected


@pytest.mark.parametrize("overrides, message", [
    (dict(family="tpu"), "family must be one of"),
    (dict(sif="oras://r.example/verl:latest"), "pinned by digest"),
    (dict(sif="docker://r.example/verl:v1"), "pinned by digest"),
    (dict(gpus_per_node=0), "needs gpus_per_node >= 1"),
    (dict(nodes=0), "nodes and cpus_per_task"),
    (dict(partition="gpu\n#SBATCH --x"), "partition"),
    (dict(interface="ib0; rm"), "interface"),
    (dict(time="soon"), "not a Slurm time"),
    (dict(env={"BAD-NAME": "1"}), "not a valid shell variable"),
    (dict(env={"X": "a\nb"}), "control characters"),
    (dict(train_cmd="python3 a.py | tee log"), "must be one command"),
    (dict(train_cmd="python3 'unterminated"), "cannot split"),
    (dict(train_cmd="  "), "empty"),
    (dict(ray_ports=RayPorts(dashboard=6379)), "used twice"),
    (dict(ray_ports=RayPorts(min_worker=29000, max_worker=29999)), "used twice"),
    (dict(ray_ports=RayPorts(gcs=80)), "outside 1024-65535"),
    (dict(port_stride=1, nodes=2), "used twice"),
    (dict(ray_wait_timeout=0), "timeouts"),
])
def test_invalid_jobs_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(SlurmError, match=message):
        render_sbatch(job_for("cuda", **overrides))


def test_job_is_frozen_and_defaults() -> None:
    job = job_for("rocm")
    assert job.gpus_per_node == 8 and job.job_name == "verl-rocm-x86_64"
    assert job_for("cpu", gpus_per_node=None).gpus_per_node == 0
    with pytest.raises(Exception):
        job.nodes = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        job.env["X"] = "1"  # type: ignore[index]
    assert slurm.sif_cache_name(ORAS) == f"oras-sha256-{DIGEST}.sif"
    assert slurm.sif_cache_name("/x/y.sif") is None


def test_template_is_strict() -> None:
    with pytest.raises(jinja2.UndefinedError):
        slurm._environment().get_template(slurm.TEMPLATE).render()


def test_write_sbatch_is_atomic_and_executable(tmp_path: Path) -> None:
    dest = tmp_path / "sub" / "job.sbatch"
    write_sbatch(job_for("cuda"), dest)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755
    first = dest.read_text()
    write_sbatch(job_for("rocm"), dest)
    assert dest.read_text() != first
    bad = replace(job_for("cuda"), nodes=2)
    object.__setattr__(bad, "family", "tpu")  # bypass __post_init__: render must still refuse
    with pytest.raises(SlurmError):
        write_sbatch(bad, dest)
    assert "--rocm" in dest.read_text()  # the previous script is untouched
    assert sorted(p.name for p in dest.parent.iterdir()) == ["job.sbatch"]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    slurm.add_arguments(parser)
    return parser.parse_args(argv)


def test_cli_writes_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "job.sbatch"
    args = _parse(["--family", "rocm", "--nodes", "4", "--gpus-per-node", "8", "--sif", ORAS,
                   "--partition", "mi300", "--interface", "ib1", "--env", "NCCL_IB_GID_INDEX=3",
                   "--env", "NCCL_IB_HCA=mlx5_0", "--output", str(out)])
    assert slurm.run(args) == 0
    text = out.read_text()
    assert "#SBATCH --nodes=4" in text and "#SBATCH --partition=mi300" in text
    assert 'IFACE="ib1"' in text and 'export NCCL_IB_HCA="mlx5_0"' in text
    assert "sbatch" in capsys.readouterr().out
    assert slurm.run(_parse(["--family", "cpu", "--gpus-per-node", "0", "--sif", "/x.sif"])) == 0
    assert capsys.readouterr().out.startswith("#!/usr/bin/env bash")


def test_cli_reports_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert slurm.run(_parse(["--family", "cuda", "--sif", "oras://r.example/v:latest"])) == 2
    assert "pinned by digest" in capsys.readouterr().err
    assert slurm.run(_parse(["--sif", ORAS])) == 2
    assert "--family" in capsys.readouterr().err
    assert slurm.run(_parse(["--family", "cuda"])) == 2
    assert "--sif" in capsys.readouterr().err
    assert slurm.run(_parse(["--family", "cpu", "--gpus-per-node", "0", "--sif", ORAS,
                             "--env", "NOVALUE"])) == 2


def test_script_outside_slurm_says_so(tmp_path: Path) -> None:
    script = write_sbatch(job_for("cpu"), tmp_path / "job.sbatch")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    assert proc.returncode == 10
    assert "submit this script with sbatch" in proc.stderr


@pytest.mark.parametrize("family, flag", [("rocm", "--rocm"), ("cuda", "--nv"), ("cpu", None)])
def test_node_side_exec_through_runtime(family: str, flag: str | None, tmp_path: Path,
                                        standin_runtime: Path) -> None:
    """`job.sh --node exec CMD` runs CMD through the runtime with the family flag and binds; on
    ROCm the visible-device variables come out consistent (HIP == CUDA, no ROCR)."""
    script = write_sbatch(job_for(family), tmp_path / "job.sh")
    sif = tmp_path / "image.sif"
    sif.write_text("sif")
    (tmp_path / ".cache" / "huggingface").mkdir(parents=True)  # the default HF_HOME
    env = {"PATH": f"{standin_runtime}:{os.environ['PATH']}", "SLURM_JOB_ID": "7",
           "VERL_ENV_JOB_DIR": str(tmp_path), "VERL_ENV_SIF": str(sif),
           "FAKE_RUNTIME_LOG": str(tmp_path / "rt.log"), "ROCR_VISIBLE_DEVICES": "4,5",
           "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(script), "--node", "exec", "env"], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    seen = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    call = (tmp_path / "rt.log").read_text().split()
    assert call[1] == "exec" and call[-2:] == [str(sif), "env"]
    assert (flag in call) if flag else ("--nv" not in call and "--rocm" not in call)
    assert ["-B", str(tmp_path)] == call[call.index("-B"):call.index("-B") + 2]
    if family == "rocm":
        assert "ROCR_VISIBLE_DEVICES" not in seen
        assert seen["HIP_VISIBLE_DEVICES"] == seen["CUDA_VISIBLE_DEVICES"] == "4,5"
    else:
        assert seen["ROCR_VISIBLE_DEVICES"] == "4,5" and "HIP_VISIBLE_DEVICES" not in seen
