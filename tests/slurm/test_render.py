"""Rendering the sbatch script: shellcheck on every family, runtime and several option sets, the
contract of SlurmJob/render_sbatch/write_sbatch/CLI, the script's own shell functions run by real
bash (InfiniBand port selection, allocation counts), and the node side's runtime command line
recorded by a stand-in runtime (no Slurm needed; tests/slurm/unit_runtime.py)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import jinja2
import pytest

from builder.cluster import job as slurm
from builder.cluster import render
from builder.cluster import runtime as cluster_runtime
from builder.cli import main
from builder.commands import slurm as command
from builder.errors import SlurmError
from builder.cluster.inputs import Inputs
from builder.cluster.job import SlurmJob
from builder.cluster.ports import RayPorts
from builder.cluster.render import render_sbatch, write_sbatch
from builder.cluster.shell import shell_word

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
                                   "actor_rollout_ref.model.path=$HF_HOME/m",
                         train_checker=b"print('the train checker')\n"),
    "docker-source": dict(sif=f"docker://images.example.net/x/verl@sha256:{DIGEST}", runtime="singularity",
                          cache_dir="/scratch/$USER/sif", hf_home="/scratch/${USER}/hf"),
    "path-source": dict(sif="/shared/images/verl.sif", exclusive=False, port_stride=100, nodes=2,
                        ray_ports=RayPorts(min_worker=20000, max_worker=20050)),
    "hub-model-binds": dict(roce=True, inputs=Inputs.from_options(
        train_files="/shared/d/train.parquet", val_files="/scratch/$USER/val.parquet",
        model="Qwen/Qwen2.5-0.5B-Instruct", checkpoint_dir="${SCRATCH}/ckpt",
        binds=["/etc/site.conf:/opt/site.conf:ro", "/scratch:ro", "$HOME/x y"])),
    "trusted-remote": dict(trust_key="/site/keys/verl-env.pub"),
    "trusted-local": dict(sif="/shared/images/verl.sif", trust_key="/site/keys/verl-env.pub",
                          trust_pgp="/site/keys/verl-env-sif.pub.asc"),
    "cluster-verdict": dict(cluster="site-a", verdict_sif="/shared/images/${USER}/verl.sif"),
}
INPUTS = Inputs.from_options(data="/shared/data/gsm8k", model="/shared/models/qwen",
                             checkpoint_dir="/shared/ckpt")


def job_for(kind: str, **overrides: object) -> SlurmJob:
    values: dict[str, object] = dict(target=f"{kind}-x86_64", family=kind, sif=ORAS,
                                     inputs=INPUTS)
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
    values = dict(OPTION_SETS[options])
    if family == "cpu":
        values.pop("gpus_per_node", None)  # a cpu job asks for no GPUs
    script = write_sbatch(job_for(family, **values), tmp_path / "job.sbatch")
    findings = shellcheck(script)
    assert findings == [], "\n".join(f"{f['line']}: SC{f['code']} {f['message']}" for f in findings)


PYXIS_SOURCES = {"trusted-remote": f"docker://registry.example.org:5000/verl/cuda@sha256:{DIGEST}",
                 "docker-source": f"docker://images.example.net/x/verl@sha256:{DIGEST}"}


def pyxis_values(options: str) -> dict[str, object]:
    """An option set as a pyxis job: an enroot squashfs (or a registry image by digest)."""
    values = dict(OPTION_SETS[options], runtime="pyxis",
                  sif=PYXIS_SOURCES.get(options, "/shared/images/verl.sqsh"))
    for refused in ("trust_key", "trust_pgp"):  # pyxis: no SIF attestations to check
        values.pop(refused, None)
    if options == "hub-model-binds":  # pyxis mounts are a ','/':'-separated list
        values["inputs"] = Inputs.from_options(
            train_files="/shared/d/train.parquet", val_files="/scratch/$USER/val.parquet",
            model="Qwen/Qwen2.5-0.5B-Instruct", checkpoint_dir="${SCRATCH}/ckpt",
            binds=["/etc/site.conf:/opt/site.conf:ro", "$HOME/x y"])
    return values


@pytest.mark.skipif(shutil.which("shellcheck") is None,
                    reason="shellcheck not installed (apt-get install shellcheck)")
@pytest.mark.parametrize("options", sorted(OPTION_SETS))
@pytest.mark.parametrize("family", ["cuda", "rocm", "cpu"])
def test_pyxis_script_passes_shellcheck(family: str, options: str, tmp_path: Path) -> None:
    values = pyxis_values(options)
    if family == "cpu":
        values.pop("gpus_per_node", None)
    script = write_sbatch(job_for(family, **values), tmp_path / "job.sbatch")
    findings = shellcheck(script)
    assert findings == [], "\n".join(f"{f['line']}: SC{f['code']} {f['message']}" for f in findings)


@pytest.mark.skipif(shutil.which("shellcheck") is None,
                    reason="shellcheck not installed (apt-get install shellcheck)")
@pytest.mark.parametrize("options", sorted(OPTION_SETS))
def test_chrun_script_passes_shellcheck(options: str, tmp_path: Path) -> None:
    values = dict(OPTION_SETS[options], runtime="ch-run", sif="/shared/images/verl-cpu")
    for refused in ("gpus_per_node", "trust_key", "trust_pgp"):  # no SIF, no attestations
        values.pop(refused, None)
    script = write_sbatch(job_for("cpu", **values), tmp_path / "job.sbatch")
    findings = shellcheck(script)
    assert findings == [], "\n".join(f"{f['line']}: SC{f['code']} {f['message']}" for f in findings)


def test_family_profiles() -> None:
    cuda, rocm, cpu = (render_sbatch(job_for(f)) for f in ("cuda", "rocm", "cpu"))
    assert 'RT=("$RUNTIME" exec --cleanenv --nv -B' in cuda and "--rocm" not in cuda
    assert 'RT=("$RUNTIME" exec --cleanenv --rocm -B' in rocm and "--nv " not in rocm
    assert 'RT=("$RUNTIME" exec --cleanenv -B' in cpu
    assert 'DEVICES=("/dev/infiniband" "/dev/nvidia-caps-imex-channels")' in cuda
    assert 'DEVICES=("/dev/infiniband")' in rocm and 'DEVICES=("/dev/infiniband")' in cpu
    for text in (cuda, rocm):
        for line in ('export_default NCCL_SOCKET_IFNAME "$IFACE"', "export_default NCCL_IB_DISABLE",
                     'export_default NCCL_IB_HCA "$hcas"'):
            assert line in text
        assert "NCCL_IB_GID_INDEX" not in text  # only when the site sets one
        assert "Ethernet) continue" in text  # RoCE ports only with --roce
    assert "NCCL_IB" not in cpu
    assert "RCCL_MSCCL_ENABLE" in rocm and "HSA_NO_SCRATCH_RECLAIM" in rocm
    assert "RCCL_MSCCL" not in cuda and "HSA_NO_SCRATCH" not in cuda
    assert "unset ROCR_VISIBLE_DEVICES" in rocm and "unset ROCR" not in cuda
    assert "/sys/class/kfd" in rocm and "/dev/nvidia" in cuda
    for text in (cuda, rocm, cpu):
        assert 'GLOO_SOCKET_IFNAME "$IFACE"' in text
        assert "APPTAINERENV_" in text
        assert "NCCL_CUMEM_ENABLE" not in text  # never forced: NCCL decides
        assert "export PYTHONNOUSERSITE=1" in text
        assert "#SBATCH --gpus-per-node=" not in text and "#SBATCH --cpus-per-task=" not in text
        assert "#SBATCH --time=" not in text
        assert not re.search(r"SLURM_\w+:-\d", text)  # no invented fallback numbers
    assert "SINGULARITYENV_" in render_sbatch(job_for("cuda", runtime="singularity"))
    assert slurm.FAMILY_PROFILES["cuda"].apptainer_flags == ("--nv",)


def test_trust_check_runs_before_any_node_starts() -> None:
    remote = render_sbatch(job_for("cuda", trust_key="/site/k.pub"))
    services = remote[remote.index("stage_services() {"):]
    check = services.index('build-env trust verify "$trusted"')
    assert check < services.index("start_ray") and check < services.index("check-shared")
    assert "trusted=$SIF_SOURCE" in remote and "trust_args+=(--pgp" not in remote
    local = render_sbatch(job_for("cuda", sif="/shared/v.sif", trust_key="/site/k.pub",
                                  trust_pgp="/site/k.asc"))
    assert "trust_args+=(--pgp \"/site/k.asc\")" in local
    assert "build-env trust verify" not in render_sbatch(job_for("cuda"))


def test_sbatch_lines_only_for_what_was_asked() -> None:
    text = render_sbatch(job_for("cuda", gpus_per_node=4, cpus_per_task=32, time="1:00:00"))
    for line in ("#SBATCH --gpus-per-node=4", "#SBATCH --cpus-per-task=32",
                 "#SBATCH --time=1:00:00"):
        assert line in text
    assert "#SBATCH --exclusive" not in render_sbatch(job_for("cuda", exclusive=False))


def test_chrun_profile_and_refusal() -> None:
    text = render_sbatch(job_for("cpu", runtime="ch-run", sif="/shared/img",
                                 env={"NCCL_DEBUG": "INFO"}))
    assert '"--set-env=$VERL_ENV_SIF/ch/environment"' in text
    assert text.index("/ch/environment\"") < text.index('RT+=("--set-env=$name=${!name}")')
    assert "BIND_MODE" not in text and "APPTAINERENV_" not in text and 'RUNTIME="ch-run"' in text
    assert 'RT=("$RUNTIME" --env-no-expand "--unset-env=*")' in text  # the host's env cleared
    assert text.index('"--unset-env=*"') < text.index("/ch/environment\"")
    for family in ("cuda", "rocm"):
        with pytest.raises(SlurmError, match=f"ch-run is refused for the {family} family: ch-run "
                                             "does not inject the host's"):
            job_for(family, runtime="ch-run", sif="/shared/img")
    with pytest.raises(SlurmError, match="ch-run runs a local image directory"):
        job_for("cpu", runtime="ch-run")


def test_node_list_ray_ports_and_train_defaults() -> None:
    text = render_sbatch(job_for("cuda"))
    assert 'mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")' in text
    for flag in ("--port", "--dashboard-port", "--ray-client-server-port", "--node-manager-port",
                 "--object-manager-port", "--min-worker-port", "--max-worker-port", "--block",
                 "--node-ip-address", "--num-cpus", "--num-gpus", "--temp-dir"):
        assert flag in text
    for setting in ("RAY_GCS_PORT=$((6379 + PORT_SHIFT))",
                    "RAY_DASHBOARD_PORT=$((8265 + PORT_SHIFT))",
                    "RAY_CLIENT_PORT=$((10001 + PORT_SHIFT))",
                    "RAY_MIN_WORKER_PORT=$((10002 + PORT_SHIFT))",
                    "RAY_MAX_WORKER_PORT=$((19999 + PORT_SHIFT))", "PORT_SLOTS=1 ",
                    "VERL_ENV_CPUS_PER_NODE=$(alloc_cpus)",
                    "VERL_ENV_GPUS_PER_NODE=$(alloc_gpus)", "#SBATCH --exclusive"):
        assert setting in text
    assert ('local cmd=("python3" "-m" "verl.trainer.main_ppo" '
            '"data.train_files=/shared/data/gsm8k/train.parquet" '
            '"data.val_files=/shared/data/gsm8k/test.parquet" '
            '"actor_rollout_ref.model.path=/shared/models/qwen" '
            '"trainer.default_local_dir=/shared/ckpt" "trainer.resume_mode=auto" '
            '"trainer.nnodes=${SLURM_NNODES}" '
            '"trainer.n_gpus_per_node=${VERL_ENV_GPUS_PER_NODE}")') in text
    assert 'BIND_SRC=("/shared/data/gsm8k" "/shared/models/qwen" "/shared/ckpt")' in text
    assert "BIND_MODE=(ro ro rw)" in text
    assert ('CHECK_PATH=("/shared/data/gsm8k/train.parquet" "/shared/data/gsm8k/test.parquet" '
            '"/shared/models/qwen")') in text


def test_inputs_binds_and_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    hub = Inputs.from_options(data="rel/data", model="Org/Model", binds=["/a:/b:ro", "/c:rw"])
    assert hub.train_files == f"{tmp_path}/rel/data/train.parquet"  # relative: against the cwd
    assert [(b.src, b.dst, b.ro) for b in hub.all_binds()] == [
        (f"{tmp_path}/rel/data", f"{tmp_path}/rel/data", True),
        ("${SLURM_SUBMIT_DIR}/verl-env-${SLURM_JOB_ID}/checkpoints",
         "${SLURM_SUBMIT_DIR}/verl-env-${SLURM_JOB_ID}/checkpoints", False),
        ("/a", "/b", True), ("/c", "/c", False)]
    assert "actor_rollout_ref.model.path=Org/Model" in hub.trainer_command()
    assert all(path != "Org/Model" for _, path in hub.checks())  # a hub id is fetched, not bound
    local = Inputs.from_options(train_files="/d/t.parquet", val_files="/e/v.parquet",
                                model="~/models/m")
    assert local.model == "${HOME}/models/m" and ("model", "${HOME}/models/m") in local.checks()
    for bad in ("", "/a:/b:rx", "/a:b", "/a:/b:ro:x"):
        with pytest.raises(SlurmError, match="--bind"):
            Inputs.from_options(binds=[bad])
    with pytest.raises(SlurmError, match="not both"):
        Inputs.from_options(data="/d", train_files="/t")
    with pytest.raises(SlurmError, match=r"needs --data \(or --train-files\) and --data \(or "
                                         r"--val-files\) and --model; or pass your own --train-cmd"):
        job_for("cuda", inputs=Inputs())
    with pytest.raises(SlurmError, match="needs --model;"):
        job_for("cuda", inputs=Inputs.from_options(data="/d"))
    assert job_for("cuda", inputs=Inputs(), train_cmd="python3 x.py")  # own command: no refusal


def _function(script: str, name: str) -> str:
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{name}() {{"))
    end = lines.index("}", start)
    return "\n".join(lines[start:end + 1])


def _bash(code: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["bash", "-c", code], capture_output=True, text=True, check=True,
                          env={"PATH": os.environ["PATH"], **(env or {})}).stdout.strip()


@pytest.mark.parametrize("env, cpus, gpus", [
    ({"SLURM_CPUS_ON_NODE": "24", "SLURM_CPUS_PER_TASK": "8", "SLURM_GPUS_ON_NODE": "4"},
     "24", "4"),
    ({"SLURM_CPUS_PER_TASK": "8", "SLURM_GPUS_PER_NODE": "a100:2"}, "8", "2"),
    ({}, str(len(os.sched_getaffinity(0))), str(len(list(Path("/dev").glob("nvidia[0-9]*"))))),
])
def test_allocation_counts(env: dict[str, str], cpus: str, gpus: str) -> None:
    """No Slurm counts: nproc, and the /dev/nvidiaN devices the node shows."""
    text = render_sbatch(job_for("cuda"))
    code = _function(text, "alloc_cpus") + "\n" + _function(text, "alloc_gpus")
    assert _bash(code + "\nalloc_cpus; alloc_gpus", env).split() == [cpus, gpus]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare to mount a sysfs stand-in in a private namespace")
@pytest.mark.parametrize("roce, expected", [(False, "mlx5_0:1,mlx5_2:1"),
                                            (True, "mlx5_0:1,mlx5_1:1,mlx5_2:1")])
def test_nccl_ib_hca_from_infiniband_ports(roce: bool, expected: str, tmp_path: Path) -> None:
    """ib_hcas() of the rendered script, run by bash over a /sys/class tree bind-mounted in a
    private mount namespace: ACTIVE InfiniBand ports only; RoCE (Ethernet) ones with --roce."""
    ports = {"mlx5_0/ports/1": ("4: ACTIVE", "InfiniBand"),
             "mlx5_1/ports/1": ("4: ACTIVE", "Ethernet"),
             "mlx5_2/ports/1": ("4: ACTIVE", "InfiniBand"),
             "mlx5_2/ports/2": ("1: DOWN", "InfiniBand"),
             "mlx5_3/ports/1": ("1: DOWN", "Ethernet")}
    sysfs = tmp_path / "class"
    for port, (state, layer) in ports.items():
        (sysfs / "infiniband" / port).mkdir(parents=True)
        (sysfs / "infiniband" / port / "state").write_text(state + "\n")
        (sysfs / "infiniband" / port / "link_layer").write_text(layer + "\n")
    fn = _function(render_sbatch(job_for("cuda", roce=roce)), "ib_hcas")
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c",
                          f"mount --bind {sysfs} /sys/class && {fn}\nib_hcas"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == expected


def test_site_overrides_come_after_defaults() -> None:
    text = render_sbatch(job_for("cuda", env={"NCCL_IB_DISABLE": "1", "NCCL_IB_GID_INDEX": "3"}))
    assert text.index('export_default NCCL_IB_DISABLE "0"') < text.index(
        'export NCCL_IB_DISABLE="1"')
    assert 'export NCCL_IB_GID_INDEX="3"' in text
    assert "NCCL_IB_GID_INDEX" in text.split("PASS_NAMES=")[1].splitlines()[0]


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
    (dict(nodes=0), "nodes must be a whole number from 1 to 4096"),
    (dict(cpus_per_task=0), "cpus_per_task must be a whole number from 1"),
    (dict(runtime="docker"), "runtime must be one of"),
    (dict(runtime="ch-run", sif="/x"), "ch-run is refused for the cuda family"),
    (dict(inputs=Inputs()), "needs --data"),
    (dict(partition="gpu\n#SBATCH --x"), "partition"),
    (dict(interface="ib0; rm"), "interface"),
    (dict(time="soon"), "not a Slurm time"),
    (dict(env={"BAD-NAME": "1"}), "is not an environment variable name"),
    (dict(env={"X": "a\nb"}), "env X: 'a\\\\nb' is not plain single-line text"),
    (dict(train_cmd="python3 a.py | tee log"), "must be one command"),
    (dict(train_cmd="python3 'unterminated"), "cannot split"),
    (dict(train_cmd="  "), "empty"),
    (dict(ray_ports=RayPorts(dashboard=6379)), "used twice"),
    (dict(ray_ports=RayPorts(min_worker=29000, max_worker=29999)), "used twice"),
    (dict(ray_ports=RayPorts(gcs=80)), "outside 1024-65535"),
    (dict(port_stride=1, nodes=2), "used twice"),
    (dict(ray_wait_timeout=0), "ray_wait_timeout must be a whole number from 1"),
    (dict(node_check_interval=0), "node_check_interval must be a whole number from 1 to 3600"),
    (dict(trust_pgp="/k.asc"), "goes with --trust-key"),
])
def test_invalid_jobs_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(SlurmError, match=message):
        render_sbatch(job_for("cuda", **overrides))


def test_job_is_frozen_and_defaults() -> None:
    job = job_for("rocm")
    assert job.gpus_per_node is None and job.cpus_per_task is None and job.time is None
    assert job.job_name == "verl-rocm-x86_64"
    with pytest.raises(SlurmError, match="cpu job asks for no GPUs"):
        job_for("cpu", gpus_per_node=2)
    with pytest.raises(Exception):
        job.nodes = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        job.env["X"] = "1"  # type: ignore[index]
    assert cluster_runtime.sif_cache_name(ORAS) == f"oras-sha256-{DIGEST}.sif"
    assert cluster_runtime.sif_cache_name("/x/y.sif") is None


def test_template_is_strict() -> None:
    with pytest.raises(jinja2.UndefinedError):
        render._environment().get_template(render.TEMPLATE).render()


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
    command.add_arguments(parser)  # the command's options, as build-env parses them
    return parser.parse_args(argv)


def test_cli_writes_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "job.sbatch"
    args = ["--target", "rocm-mi300", "--nodes", "4", "--gpus-per-node", "8", "--sif", ORAS,
            "--partition", "mi300", "--interface", "ib1", "--env", "NCCL_IB_GID_INDEX=3",
            "--env", "NCCL_IB_HCA=mlx5_0", "--data", "/shared/gsm8k", "--model",
            "/shared/models/qwen", "--checkpoint-dir", "/shared/ckpt", "--bind",
            "/scratch", "--output", str(out)]
    assert main(["slurm", *args]) == 0
    text = out.read_text()
    assert "#SBATCH --nodes=4" in text and "#SBATCH --partition=mi300" in text
    assert "#SBATCH --gpus-per-node=8" in text and "#SBATCH --cpus-per-task" not in text
    assert 'IFACE="ib1"' in text and 'export NCCL_IB_HCA="mlx5_0"' in text
    assert '"trainer.default_local_dir=/shared/ckpt"' in text and '"/scratch"' in text
    assert "sbatch" in capsys.readouterr().out
    assert main(["slurm", "--family", "cpu", "--sif", "/x", "--runtime", "ch-run",
                 "--train-cmd", "python3 t.py"]) == 0
    assert capsys.readouterr().out.startswith("#!/usr/bin/env bash")


def test_cli_reports_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["slurm", "--family", "cuda", "--sif", "oras://r.example/v:latest",
                 "--train-cmd", "x"]) == 2
    assert "pinned by digest" in capsys.readouterr().err
    assert main(["slurm", "--sif", ORAS]) == 2
    assert "--family" in capsys.readouterr().err
    assert main(["slurm", "--family", "cuda"]) == 2
    assert "--sif" in capsys.readouterr().err
    assert main(["slurm", "--family", "cpu", "--gpus-per-node", "0", "--sif", ORAS,
                 "--env", "BAD-NAME", "--train-cmd", "x"]) == 2
    assert "--env expects NAME or NAME=VALUE, got 'BAD-NAME'" in capsys.readouterr().err
    assert main(["slurm", "--target", "cuda-x86_64", "--sif", ORAS, "--model", "Org/M"]) == 2
    err = capsys.readouterr().err
    assert ("needs --data (or --train-files) and --data (or --val-files) and --nodes and "
            "--gpus-per-node; or pass your own --train-cmd") in err
    assert main(["slurm", "--family", "cuda", "--sif", ORAS, "--data", "/d", "--model",
                 "/m"]) == 2
    assert "made for the verl version a matrix target pins: pass --target" in \
        capsys.readouterr().err
    assert main(["slurm", "--family", "cuda", "--sif", "/x", "--runtime", "ch-run",
                 "--train-cmd", "x"]) == 2
    assert "refused for the cuda family" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parse(["--runtime", "docker"])


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
    bound = tmp_path / "bound"
    bound.mkdir()
    inputs = Inputs.from_options(binds=[f"{bound}:/data:ro"], checkpoint_dir=str(tmp_path))
    script = write_sbatch(job_for(family, inputs=inputs, train_cmd="true",
                                  env={"NCCL_DEBUG": "INFO"}), tmp_path / "job.sh")
    sif = tmp_path / "image.sif"
    sif.write_text("sif")
    (tmp_path / ".cache" / "huggingface").mkdir(parents=True)  # the default HF_HOME
    env = {"PATH": f"{standin_runtime}:{os.environ['PATH']}", "SLURM_JOB_ID": "7",
           "VERL_ENV_JOB_DIR": str(tmp_path), "VERL_ENV_SIF": str(sif),
           "FAKE_RUNTIME_LOG": str(tmp_path / "rt.log"), "ROCR_VISIBLE_DEVICES": "4,5",
           "HOME": str(tmp_path), "NCCL_DEBUG": "INFO", "RAY_ADDRESS": "1.2.3.4:6379",
           "UNRELATED": "x"}
    proc = subprocess.run(["bash", str(script), "--node", "exec", "env"], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    seen = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    call = (tmp_path / "rt.log").read_text().split()
    # the command runs from the job directory (a read-only image has no writable one)
    assert call[1] == "exec" and call[call.index(str(sif)) + 1] == "/bin/sh"
    assert call[-2:] == [str(tmp_path), "env"]
    assert (flag in call) if flag else ("--nv" not in call and "--rocm" not in call)
    assert ["-B", str(tmp_path)] == call[call.index("-B"):call.index("-B") + 2]
    assert f"{bound}:/data:ro" in call and f"{tmp_path}:{tmp_path}:rw" in call
    # site and job variables go in as APPTAINERENV_*, which apptainer applies after the image ENV
    assert seen["APPTAINERENV_NCCL_DEBUG"] == "INFO"
    assert seen["APPTAINERENV_RAY_ADDRESS"] == "1.2.3.4:6379"
    assert "APPTAINERENV_UNRELATED" not in seen
    if family == "rocm":
        assert "ROCR_VISIBLE_DEVICES" not in seen
        assert seen["HIP_VISIBLE_DEVICES"] == seen["CUDA_VISIBLE_DEVICES"] == "4,5"
    else:
        assert seen["ROCR_VISIBLE_DEVICES"] == "4,5" and "HIP_VISIBLE_DEVICES" not in seen


# --------------------------------------------------------------------------- issue 21: pyxis,
# CPU binding, the clean environment, site options, the Slurm version, NVL72 devices

SQSH = "/shared/images/verl.sqsh"


def _srun_calls(text: str) -> list[str]:
    """Every srun command line of the script (continuation lines joined)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines()
            if re.search(r"(^|[\s(;])srun ", _code(line))]


def _code(line: str) -> str:
    """A script line without its comment and its double-quoted strings."""
    return re.sub(r'"[^"]*"', '""', line).split("#")[0]


@pytest.mark.parametrize("runtime, sif", [("apptainer", ORAS), ("pyxis", SQSH)])
def test_every_step_asks_for_its_cpus_and_binds_them(runtime: str, sif: str) -> None:
    text = render_sbatch(job_for("cuda", runtime=runtime, sif=sif, cpu_bind="threads"))
    calls = _srun_calls(text)
    steps = [c for c in calls if not re.search(r"--version|--help|^for tool in", c)]
    for call in steps:
        assert "--cpus-per-task=" in call and '--cpu-bind="$CPU_BIND"' in call, call
    assert 'CPU_BIND="threads"' in text
    # every other srun goes through step() / every_node() / cstep()
    assert len(re.findall(r"(^|[\s(;])srun ", "\n".join(
        _code(line) for line in text.splitlines()), re.M)) == len(calls)
    # step(), every_node(), the Ray wait, the self-test, the collective bisection's runs, the
    # node watch's probe
    assert len(steps) == 6, steps


def test_cpu_map_expands_slurm_counts() -> None:
    """CPUS_OF from SLURM_JOB_CPUS_PER_NODE in node-list order; MIN_CPUS the smallest."""
    text = render_sbatch(job_for("cpu"))
    code = ("set -eu\ndeclare -A CPUS_OF=()\nMIN_CPUS=1\nVERL_ENV_CPUS_PER_NODE=8\n"
            "scontrol() { printf '%s\\n' n1 n2 n3 n4; }\n" + _function(text, "cpu_map") +
            '\ncpu_map; echo "${CPUS_OF[n1]} ${CPUS_OF[n2]} ${CPUS_OF[n3]} ${CPUS_OF[n4]} $MIN_CPUS"')
    out = _bash(code, {"SLURM_JOB_CPUS_PER_NODE": "72(x2),36,8", "SLURM_JOB_NODELIST": "x"})
    assert out == "72 72 36 8 8"


def _verdict_bash(tmp_path: Path, job: SlurmJob, tool: str | None) -> tuple[int, str]:
    """cluster_verdict() of the rendered script with a stand-in build-env (``tool``: its body;
    None: none on PATH); prints CLUSTER_VERDICT. Returns (exit code, output)."""
    text = render_sbatch(job)
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "build-env").unlink(missing_ok=True)
    if tool is not None:
        (bindir / "build-env").write_text("#!/bin/bash\necho \"ARGS $*\"\n" + tool)
        (bindir / "build-env").chmod(0o755)
    jobdir = tmp_path / "job"
    jobdir.mkdir(exist_ok=True)
    code = ("set -eu\nlog() { echo \"LOG $*\"; }\nfail() { echo \"FAIL $*\"; exit 1; }\n"
            + "\n".join(line for line in text.splitlines()
                        if line.startswith(("CLUSTER_NAME=", "VERDICT_SIF=", "RUNTIME=")))
            + "\nNODES=(node1 node2)\n" + _function(text, "cluster_verdict")
            + '\ncluster_verdict; echo "VERDICT=$CLUSTER_VERDICT"')
    proc = subprocess.run(["bash", "-c", code], capture_output=True, text=True,
                          env={"PATH": f"{bindir}:/usr/bin:/bin", "VERL_ENV_JOB_DIR": str(jobdir),
                               "SLURM_JOB_ID": "77", "SLURM_CLUSTER_NAME": "slurm-says",
                               "VERL_ENV_SIF": job.sif, "CLUSTER_VERDICT": "none"})
    return proc.returncode, proc.stdout + proc.stderr


def test_cluster_verdict_runs_build_env_cluster_on_the_batch_host(tmp_path: Path) -> None:
    """The job's verdict step: build-env cluster with the job's nodes, id, runtime, the cluster
    name (Slurm's unless --cluster) and the SIF (the one run unless --verdict-sif); its exit 1
    with a verdict written is a failed verdict, an exit without one stops the job; no build-env
    or no SIF: the job goes on and says how to assemble it later."""
    write = 'echo "{}" > "$VERL_ENV_JOB_DIR/cluster-verdict.json"\n'
    rc, out = _verdict_bash(tmp_path, job_for("cuda", sif="/img/run.sif"), write + "exit 0")
    assert rc == 0 and "VERDICT=pass" in out, out
    assert ("ARGS cluster {0}/job --sif /img/run.sif --cluster slurm-says --nodes node1,node2 "
            "--job 77 --runtime apptainer").format(tmp_path) in out
    rc, out = _verdict_bash(tmp_path, job_for("cpu", runtime="ch-run", sif="/img/dir",
                                              cluster="site-a", verdict_sif="/img/x.sif"),
                            write + "exit 1")
    assert rc == 0 and "VERDICT=fail" in out and "cluster verdict: FAIL on site-a" in out, out
    assert "--sif /img/x.sif --cluster site-a" in out and "--runtime ch-run" in out
    rc, out = _verdict_bash(tmp_path, job_for("cuda", sif="/img/run.sif"), "exit 1")
    assert rc == 1 and "FAIL build-env cluster could not assemble the cluster verdict (exit 1" \
        in out, out
    rc, out = _verdict_bash(tmp_path, job_for("cuda", sif="/img/run.sif"), None)
    assert rc == 0 and "VERDICT=none" in out and "build-env is not on the PATH" in out, out
    assert f"later: build-env cluster {tmp_path}/job --sif /img/run.sif" in out
    rc, out = _verdict_bash(tmp_path, job_for("cpu", runtime="ch-run", sif="/img/dir"),
                            write + "exit 0")
    assert rc == 0 and "VERDICT=none" in out and "no SIF names this image" in out, out


def test_cluster_verdict_options_are_checked() -> None:
    with pytest.raises(SlurmError, match="--verdict-sif names the SIF"):
        job_for("cpu", runtime="ch-run", sif="/img/dir", verdict_sif="/img/dir.sqsh")
    with pytest.raises(SlurmError, match="cluster 'a b' has characters"):
        job_for("cuda", cluster="a b")
    args = _parse(["--family", "cpu", "--runtime", "ch-run", "--sif", "/img/dir", "--train-cmd",
                   "true", "--cluster", "site-a", "--verdict-sif", "/img/x.sif"])
    job = command.job_from_args(args)
    assert job.cluster == "site-a" and job.verdict_sif == "/img/x.sif"


def test_site_options_become_sbatch_lines() -> None:
    text = render_sbatch(job_for("cuda", account="proj42", qos="high", constraint="gb200&nvl72",
                                 reservation="maint-1", mem="0", time="1-00:00:00"))
    for line in ("#SBATCH --account=proj42", "#SBATCH --qos=high",
                 "#SBATCH --constraint=gb200&nvl72", "#SBATCH --reservation=maint-1",
                 "#SBATCH --mem=0", "#SBATCH --time=1-00:00:00"):
        assert line in text
    plain = render_sbatch(job_for("cuda"))
    for option in ("account", "qos", "constraint", "reservation", "mem"):
        assert f"#SBATCH --{option}" not in plain
    for bad, message in ((dict(mem="lots"), "not a Slurm memory size"),
                         (dict(account="a b"), "account"),
                         (dict(constraint="a\nb"), "not plain single-line text"),
                         (dict(constraint="a b"), "feature expression"),
                         (dict(cpu_bind="cores; rm"), "--cpu-bind")):
        with pytest.raises(SlurmError, match=message):
            job_for("cuda", **bad)
    args = _parse(["--family", "cuda", "--sif", ORAS, "--account", "p", "--qos", "q",
                   "--constraint", "c", "--reservation", "r", "--mem", "100G",
                   "--cpu-bind", "none", "--train-cmd", "true"])
    job = command.job_from_args(args)
    assert (job.account, job.qos, job.constraint, job.reservation, job.mem, job.cpu_bind) == (
        "p", "q", "c", "r", "100G", "none")


@pytest.mark.parametrize("version, ok", [("slurm 22.05.8", True), ("slurm 20.11.9", False),
                                         ("slurm 24.11.0-1", True), ("slurm 20.02.7", False),
                                         ("slurm 21.08.8", False), ("slurm 23.02.1", True),
                                         ("slurm-wlm 19.05.5", False), ("", False)])
def test_slurm_version_checked_at_setup(version: str, ok: bool, tmp_path: Path) -> None:
    text = render_sbatch(job_for("cpu"))
    (tmp_path / "srun").write_text(f"#!/bin/sh\necho '{version}'\n")
    (tmp_path / "srun").chmod(0o755)
    code = ('MIN_SLURM="22.05"\nlog() { echo "$*"; }\nfail() { echo "FAIL $*"; exit 1; }\n'
            + _function(text, "check_slurm") + "\ncheck_slurm")
    proc = subprocess.run(["bash", "-c", code], capture_output=True, text=True,
                          env={"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert (proc.returncode == 0) == ok, proc.stdout + proc.stderr
    if not ok:
        assert "FAIL" in proc.stdout and ("older than 22.05" in proc.stdout
                                          or "cannot tell the Slurm version" in proc.stdout)
    assert "Needs Slurm >= 22.05" in text


def test_hf_home_kept_unless_given() -> None:
    kept = render_sbatch(job_for("cuda"))
    line = next(x for x in kept.splitlines() if x.startswith("export HF_HOME="))
    assert _bash(f"{line}\necho $HF_HOME", {"HF_HOME": "/scratch/u/hf", "HOME": "/h"}) == \
        "/scratch/u/hf"
    assert _bash(f"{line}\necho $HF_HOME", {"HOME": "/h"}) == "/h/.cache/huggingface"
    given = render_sbatch(job_for("cuda", hf_home="/shared/hf"))
    line = next(x for x in given.splitlines() if x.startswith("export HF_HOME="))
    assert _bash(f"{line}\necho $HF_HOME", {"HF_HOME": "/scratch/u/hf"}) == "/shared/hf"
    assert command.job_from_args(_parse(["--family", "cpu", "--sif", ORAS, "--train-cmd",
                                       "true"])).hf_home is None


def test_pyxis_profile_and_refusals() -> None:
    text = render_sbatch(job_for("cuda", runtime="pyxis", sif=SQSH))
    assert f'PYXIS_IMAGE="{SQSH}"' in text and 'PYXIS_NAME="verl-env-$SLURM_JOB_ID"' in text
    for option in ('"--container-image=$PYXIS_IMAGE"', '"--container-name=$PYXIS_NAME"',
                   '"--container-mounts=', "--container-writable", "--no-container-mount-home",
                   '"--container-env=$names"'):
        assert option in text
    assert "export ENROOT_LOGIN_SHELL=false" in text
    assert "RT=(env -i)" in text and "</etc/environment" in text
    assert "apptainer" not in text.split("# ---- settings")[1].split("log()")[0]
    assert 'DEVICES=("/dev/nvidia-caps-imex-channels")' in text  # GPUs, IB: enroot's hooks
    rocm = render_sbatch(job_for("rocm", runtime="pyxis", sif=SQSH))
    assert 'DEVICES=("/dev/kfd" "/dev/dri")' in rocm  # enroot has no AMD hook
    remote = render_sbatch(job_for("cuda", runtime="pyxis",
                                   sif=f"docker://registry.example.org:5000/verl/cuda@sha256:{DIGEST}"))
    assert f'PYXIS_IMAGE="registry.example.org:5000#verl/cuda@sha256:{DIGEST}"' in remote
    assert cluster_runtime.pyxis_image(f"docker://nvidia/verl@sha256:{DIGEST}") == f"nvidia/verl@sha256:{DIGEST}"
    for bad, message in ((dict(sif=ORAS), "imports OCI images, not SIF"),
                         (dict(sif="/shared/v.sif"), "not the SIF"),
                         (dict(sif=SQSH, trust_key="/k.pub"), "trust verify on the image"),
                         (dict(sif=SQSH, inputs=Inputs.from_options(
                             data="/d", model="/m", binds=["/a,b:/c"])), "cannot hold")):
        with pytest.raises(SlurmError, match=message):
            job_for("cuda", runtime="pyxis", **bad)
    with pytest.raises(SlurmError, match="enroot squashfs: run it with --runtime pyxis"):
        job_for("cuda", sif=SQSH)


def _overlay_dev(tmp_path: Path) -> str:
    """Shell that lays a writable overlay over /dev (private mount namespace) with a fake
    NVL72 IMEX channel tree."""
    for d in ("u", "w"):
        (tmp_path / f"ov-{d}").mkdir()
    return (f"mount -t overlay overlay -o lowerdir=/dev,upperdir={tmp_path}/ov-u,"
            f"workdir={tmp_path}/ov-w /dev && mkdir /dev/nvidia-caps-imex-channels && "
            "touch /dev/nvidia-caps-imex-channels/channel0 && ")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare to lay a fake /dev in a private namespace")
def test_imex_channels_reach_the_container(tmp_path: Path, standin_runtime: Path) -> None:
    """A node with /dev/nvidia-caps-imex-channels: apptainer binds it, pyxis mounts it, and the
    self-test step records it; a node without it binds nothing."""
    inputs = Inputs.from_options(checkpoint_dir=str(tmp_path))
    script = write_sbatch(job_for("cuda", inputs=inputs, train_cmd="true"), tmp_path / "job.sh")
    sif = tmp_path / "image.sif"
    sif.write_text("sif")
    env = {"PATH": f"{standin_runtime}:{os.environ['PATH']}", "SLURM_JOB_ID": "7",
           "VERL_ENV_JOB_DIR": str(tmp_path), "VERL_ENV_SIF": str(sif), "HOME": str(tmp_path),
           "FAKE_RUNTIME_LOG": str(tmp_path / "rt.log"), "HF_HOME": str(tmp_path),
           "SLURMD_NODENAME": "n1", "VERL_ENV_GPUS_PER_NODE": "4"}
    run = ["unshare", "-m", "--propagation", "private", "bash", "-c"]
    proc = subprocess.run(run + [_overlay_dev(tmp_path) + f"bash {script} --node selftest"],
                          capture_output=True, text=True, env=env)
    call = (tmp_path / "rt.log").read_text().split()
    assert ["-B", "/dev/nvidia-caps-imex-channels"] == call[call.index(
        "/dev/nvidia-caps-imex-channels") - 1:call.index("/dev/nvidia-caps-imex-channels") + 1]
    assert (tmp_path / "devices-n1.txt").read_text().strip() == "/dev/nvidia-caps-imex-channels"
    assert "devices in the container: /dev/nvidia-caps-imex-channels" in proc.stderr
    (tmp_path / "rt.log").unlink()
    subprocess.run(["bash", str(script), "--node", "selftest"], capture_output=True, env=env)
    assert "nvidia-caps-imex" not in (tmp_path / "rt.log").read_text()
    pyxis = render_sbatch(job_for("cuda", runtime="pyxis", sif=SQSH, inputs=inputs,
                                  train_cmd="true"))
    code = (_function(pyxis, "present_devices") + "\n" + _function(pyxis, "passed_names") + "\n"
            + _function(pyxis, "container_opts") +
            '\nDEVICES=("/dev/nvidia-caps-imex-channels"); BIND_SRC=(); PASS_PREFIXES=(NCCL_)'
            '\nPASS_NAMES=(HOME); PYXIS_IMAGE=x; PYXIS_NAME=y; VERL_ENV_JOB_DIR=/j; HF_HOME=/h'
            '\ncontainer_opts; printf "%s\\n" "${PX[@]}"')
    out = subprocess.run(run + [_overlay_dev(tmp_path / "2") + code] if (tmp_path / "2").mkdir()
                         is None else [], capture_output=True, text=True, check=True).stdout
    assert ("--container-mounts=/j:/j,/h:/h,/dev/nvidia-caps-imex-channels:"
            "/dev/nvidia-caps-imex-channels") in out.splitlines()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare to lay an image's /etc/environment")
def test_pyxis_step_starts_from_the_image_env_and_the_pass_list(tmp_path: Path) -> None:
    """Inside the node's container the command gets the image's ENV (/etc/environment as
    enroot writes it) and the pass-list, nothing else of the job's environment."""
    script = write_sbatch(job_for("cpu", runtime="pyxis", sif=SQSH, train_cmd="true",
                                  env={"SITE_X": "1"}), tmp_path / "job.sh")
    image_env = tmp_path / "environment"
    image_env.write_text("PATH=/opt/venv/bin:/usr/bin:/bin\nPYTHONPATH=/opt/verl-env\n"
                         "NCCL_DEBUG=WARN\n")
    env = {"PATH": os.environ["PATH"], "HOME": "/home/u", "PYTHONPATH": "/modules/shadow",
           "LD_LIBRARY_PATH": "/modules/lib", "UNRELATED": "x", "NCCL_DEBUG": "INFO",
           "SITE_X": "1", "SLURM_JOB_ID": "7", "PYTHONNOUSERSITE": "1"}
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c",
                          f"mount --bind {image_env} /etc/environment && "
                          f"bash {script} --node exec env"],
                         capture_output=True, text=True, env=env, check=True).stdout
    seen = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert seen["PATH"] == "/opt/venv/bin:/usr/bin:/bin"
    assert seen["PYTHONPATH"] == "/opt/verl-env"  # the image's, not the module's
    assert seen["NCCL_DEBUG"] == "INFO"  # the site's wins
    assert seen["SITE_X"] == "1" and seen["HOME"] == "/home/u" and seen["SLURM_JOB_ID"] == "7"
    assert seen["PYTHONNOUSERSITE"] == "1"
    assert "UNRELATED" not in seen and "LD_LIBRARY_PATH" not in seen


def test_jobtools_report_lists_failing_checks(tmp_path: Path) -> None:
    from builder.selftest.launch import jobtools

    (tmp_path / "selftest-n1.json").write_text(json.dumps({
        "overall": "fail", "world_size": 2, "checks": [
            {"id": "env.visible", "status": "fail", "reason": "HIP != CUDA"},
            {"id": "imports.verl", "status": "pass"},
            {"id": "gpu.count", "status": "skip", "required": True, "reason": "no GPU"}]}))
    proc = subprocess.run([sys.executable, "-m", "builder.selftest.launch.jobtools", "report",
                           str(tmp_path / "selftest-n1.json"), str(tmp_path / "missing.json")],
                          capture_output=True, text=True, cwd=Path(slurm.__file__).parents[2])
    assert proc.returncode == 0
    assert proc.stdout.splitlines() == ["self-test report selftest-n1.json: fail, world 2, 3 checks",
                                        "  fail env.visible: HIP != CUDA",
                                        "  skip gpu.count: no GPU"]
    assert jobtools.main(["nonsense"]) == 2


GOLDEN = Path(__file__).resolve().parents[1] / "golden"
GOLDEN_JOBS = {
    "cuda-apptainer": dict(family="cuda", gpus_per_node=8, account="proj42", mem="0"),
    "rocm-pyxis": dict(family="rocm", runtime="pyxis", gpus_per_node=8, sif=SQSH,
                       constraint="mi300x", cpu_bind="none"),
    "cpu-chrun": dict(family="cpu", runtime="ch-run", sif="/shared/images/verl-cpu"),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_JOBS))
def test_golden_job_script(name: str) -> None:
    """The whole rendered script, one per runtime; regenerate deliberately
    (UPDATE_GOLDEN=1) and read the diff."""
    values = dict(GOLDEN_JOBS[name])
    family = str(values.pop("family"))
    text = render_sbatch(job_for(family, **values))
    golden = GOLDEN / f"job-{name}.sbatch"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text(), (
        f"rendered job script differs from {golden}; if intended: UPDATE_GOLDEN=1 pytest")


def test_installed_cli_writes_every_runtime(tmp_path: Path) -> None:
    """`build-env slurm` from the installed wheel (its templates are package data), one script
    per runtime, each passing bash -n."""
    from tests.conftest import run_build_env

    for runtime, image in (("apptainer", ORAS), ("singularity", ORAS), ("pyxis", SQSH),
                           ("ch-run", "/shared/images/verl-cpu")):
        out = tmp_path / f"{runtime}.sbatch"
        proc = run_build_env("slurm", "--family", "cpu", "--runtime", runtime, "--image", image,
                             "--train-cmd", "python3 train.py", "--account", "p", "--output",
                             str(out), "--node-check-interval", "7", timeout=120)
        assert proc.returncode == 0, proc.stderr
        text = out.read_text()
        assert f'RUNTIME="{runtime}"' in text and "#SBATCH --account=p" in text
        assert "\nNODE_CHECK_INTERVAL=7 " in text
        assert subprocess.run(["bash", "-n", str(out)]).returncode == 0


@pytest.mark.parametrize("gives_up, expected", [(True, "retry 1"), (False, "fail")])
def test_a_wait_that_fails_as_a_ray_gives_up_is_a_retry(tmp_path: Path, gives_up: bool,
                                                        expected: str) -> None:
    """CI 2026-12-07: the ray-wait step failed (ray.init lost the GCS under it) a moment before
    the head's Ray step ended on Ray's own startup timeout, and the job failed instead of starting
    Ray again. ray_gave_up waits for such a step: a Ray step that ends with Ray's timeout message
    in its log within the wait is a retry (RAY_EXITED names it); one that ends without it, or
    runs on, is not."""
    text = render_sbatch(job_for("cpu"))
    body = _function(text, "ray_cluster")
    assert "ray_gave_up 15; then return 1; fi" in body
    assert body.index("ray_gave_up") < body.index("fail \"not all")
    line = "The current node timed out during startup" if gives_up else "raylet exited: 1"
    code = ("\n".join(ln for ln in text.splitlines() if ln.startswith("RAY_STARTUP_TIMEOUT="))
            + "\n" + _function(text, "ray_timed_out") + "\n" + _function(text, "ray_gave_up")
            + f"\nVERL_ENV_JOB_DIR={tmp_path}\nNODES=(node1 node2)\nsleep 60 &\n"
            + f"(sleep 2; echo '{line}' >{tmp_path}/ray-node2.log) &\n"
            + "RAY_PIDS=($! $!)\nRAY_PIDS[0]=$(jobs -p | head -1)\n"
            + "if ray_gave_up 5; then echo \"retry $RAY_EXITED\"; else echo fail; fi\n"
            + "kill %1")
    assert _bash(code) == expected
