"""The train check from a SIF, host side (builder/train/check.py ``run_check_sif`` and
``build-env slurm``'s choice of image): the copy of the model and data into the scratch the
runtime shares, the command's paths moved there and named back as given in the verdict, the
verdict semantics. The runtime is a stand-in here (pure logic);
tests/train/test_train_check_sif.py runs the real checker from the fixture's SIF with ch-run."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from builder.cli import main
from builder.commands import slurm as command
from builder.errors import InfraError, SlurmError
from builder.sif import checks as sif_checks
from builder.sif import format as sif_format
from builder.train import check

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "cpu.yaml"


def fake_sif(path: Path) -> Path:
    """A file ``is_sif`` takes for a SIF (its header's launch script and magic)."""
    path.write_bytes(sif_format.LAUNCH_SCRIPT.ljust(32, b"\0") + sif_format.MAGIC + b"\0" * 64)
    assert sif_format.is_sif(path)
    return path


def argv(inputs: dict[str, Path], *extra: str) -> list[str]:
    return ["python3", "-m", "verl.trainer.main_ppo",
            f"data.train_files={inputs['data'] / 'train.parquet'}",
            f"data.val_files=['{inputs['data'] / 'test.parquet'}']",
            f"actor_rollout_ref.model.path={inputs['model']}",
            f"critic.model.path={inputs['model']}/", *extra]


def test_relocate_moves_only_the_copied_paths() -> None:
    words = ["data.train_files=/d/train.parquet", "data.val_files=['/d/test.parquet',/e/x]",
             "actor_rollout_ref.model.path=/m", "critic.model.path=/m/", "a.b=/mx",
             "trainer.default_local_dir=/ckpt", "~trainer.logger", "hub=Qwen/Q"]
    moved = check.relocate(words, ["/d/train.parquet", "/d/test.parquet", "/m"], "/S")
    assert moved == ["data.train_files=/S/d/train.parquet",
                     "data.val_files=[/S/d/test.parquet,/e/x]",
                     "actor_rollout_ref.model.path=/S/m", "critic.model.path=/S/m/", "a.b=/mx",
                     "trainer.default_local_dir=/ckpt", "~trainer.logger", "hub=Qwen/Q"]


def test_relocate_keeps_a_quoted_path_one_hydra_value() -> None:
    """A path hydra needs quoted (a space, a comma, a quote) is moved and quoted again."""
    words = ["data.train_files='/d/my data,v2/train.parquet'",
             "data.val_files=['/d/it\\'s/test.parquet']"]
    moved = check.relocate(words, ["/d"], "/S")
    assert moved == ["data.train_files='/S/d/my data,v2/train.parquet'",
                     "data.val_files=['/S/d/it\\'s/test.parquet']"]
    assert check.data_files(["python3", "-m", "m", *moved]) == [
        "/S/d/my data,v2/train.parquet", "/S/d/it's/test.parquet"]


def test_run_check_sif_copies_moves_and_names_back(
        inputs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in runtime runs the checker's launch on the host with a stand-in checker
    that reports what it was given and what it could read, as the container would."""
    seen: dict[str, Any] = {}
    checker = ("import json, os, sys\n"
               "args = sys.argv[1:]\nout = args[args.index('--json') + 1]\n"
               "words = args[args.index('--') + 1:]\n"
               "paths = [w.split('=', 1)[1].strip(\"[]'\") for w in words]\n"
               "json.dump({'schema': 'verl-env/train-check/v1', 'status': 'rejected',\n"
               "  'args': args[:4], 'home': os.environ['HOME'],\n"
               "  'offline': os.environ.get('HF_HUB_OFFLINE'),\n"
               "  'stages': [{'name': 'validate', 'status': 'fail', 'message': 'bad ' + "
               "paths[0], 'readable': [os.path.exists(p) for p in paths]}]}, open(out, 'w'))\n"
               "sys.exit(1)\n")
    monkeypatch.setattr(check, "checker_bytes", checker.encode)

    def runner(sif: Path, inner: list[str], scratch: Path, timeout: float) -> tuple[str, Any]:
        seen.update(sif=sif, inner=inner, scratch=scratch)
        copied = scratch / "in" / str(inputs["data"] / "train.parquet").lstrip("/")
        seen["mode"] = stat.S_IMODE(copied.stat().st_mode)
        seen["weights"] = list((scratch / "in").rglob("*.safetensors"))
        return "ch-run", subprocess.run(inner, capture_output=True, text=True)

    sif = fake_sif(tmp_path / "img.sif")
    result = check.run_check_sif(sif, argv(inputs), nnodes=2, gpus_per_node=1, runner=runner)
    assert result.status == "rejected" and result.exit_code == 1
    assert result.image == f"{sif} (ch-run)"
    stage = result.failures()[0]
    # every path the checker was given is readable there; the verdict names them as given
    assert stage["readable"] == [True, True, True, True]
    assert stage["message"] == f"bad {inputs['data'] / 'train.parquet'}"
    assert result.report["args"] == ["--nnodes", "2", "--gpus-per-node", "1"]
    assert result.report["offline"] == "1"
    assert str(seen["scratch"]).startswith("/tmp/") and not Path(seen["scratch"]).exists()
    assert seen["mode"] == 0o444 and seen["weights"] == []


def test_run_check_sif_without_runtime_is_infra(inputs: dict[str, Path], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sif_checks, "pick_runtime", lambda name=None: None)
    with pytest.raises(InfraError, match="could not run: no container runtime to run the SIF"):
        check.run_check_sif(fake_sif(tmp_path / "x.sif"), argv(inputs), nnodes=1,
                            gpus_per_node=1, runner=sif_checks.argv_runner("ch-run"))


def test_run_check_sif_without_report_is_infra(inputs: dict[str, Path], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    done = subprocess.CompletedProcess([], 3, "", "no python in image\n")
    with pytest.raises(InfraError, match="wrote no report .exit 3.: no python in image"):
        check.run_check_sif(fake_sif(tmp_path / "x.sif"), argv(inputs), nnodes=1,
                            gpus_per_node=1, runner=lambda *a: ("apptainer", done))
    with pytest.raises(InfraError, match="ran past 300 s and was killed"):
        check.run_check_sif(fake_sif(tmp_path / "x.sif"), argv(inputs), nnodes=1,
                            gpus_per_node=1, runner=lambda *a: ("apptainer", None))


def test_local_sif_is_only_a_sif_file(tmp_path: Path) -> None:
    sif = fake_sif(tmp_path / "a.sif")
    (tmp_path / "b.sqsh").write_bytes(b"hsqs")
    assert command._local_sif(str(sif)) == sif
    for other in ("oras://r/x@sha256:00", "docker://r/x@sha256:00", "$HOME/a.sif",
                  str(tmp_path), str(tmp_path / "b.sqsh"), str(tmp_path / "none.sif")):
        assert command._local_sif(other) is None, other


def cli(sif: Path, inputs: dict[str, Path], *extra: str) -> list[str]:
    return ["slurm", "--matrix", str(FIXTURE), "--target", "cpu-x86_64", "--runtime", "ch-run",
            "--sif", str(sif), "--nodes", "2", "--ray-logical-gpus", "1",
            "--data", str(inputs["data"]), "--model", str(inputs["model"]), *extra]


def test_slurm_prefers_the_jobs_sif(inputs: dict[str, Path], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A local SIF is checked (the image the job runs) rather than the engine's image; a
    rejected command writes nothing; --check-image, named, wins."""
    seen: dict[str, Any] = {}

    def run_check_sif(sif: Path, argv: list[str], *, nnodes: int, gpus_per_node: int,
                      runner: Any) -> check.TrainCheck:
        seen.update(sif=sif, nnodes=nnodes, gpus=gpus_per_node, runner=callable(runner))
        stage = {"name": "validate", "status": "fail", "message": "[actor] Please set"}
        return check.TrainCheck(f"{sif} (ch-run)", "rejected", {}, 1.0, "", (stage,))

    def no_engine(*a: Any) -> Any:
        raise AssertionError("the engine image was used")

    monkeypatch.setattr(command.train_check, "run_check_sif", run_check_sif)
    monkeypatch.setattr(command._shared, "engine_image", no_engine)
    sif, out = fake_sif(tmp_path / "job.sif"), tmp_path / "job.sh"
    assert main(cli(sif, inputs, "--output", str(out))) == 1
    err = capsys.readouterr().err
    assert f"train check of {sif} (ch-run): rejected" in err and "no script written" in err
    assert not out.exists()
    assert seen == {"sif": sif, "nnodes": 2, "gpus": 1, "runner": True}
    seen.clear()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.setattr(command._shared, "engine_image", no_engine_here)
    assert main(cli(sif, inputs, "--output", str(out), "--check-image", "mine:1")) == 0
    assert "train check: not run here (mine:1: " in capsys.readouterr().err and not seen


def no_engine_here(*a: Any) -> Any:
    raise SlurmError(f"no engine at {os.environ['DOCKER_HOST']}")


def test_slurm_without_a_runtime_says_the_job_runs_it(
        inputs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sif_checks, "pick_runtime", lambda name=None: None)
    sif, out = fake_sif(tmp_path / "job.sif"), tmp_path / "job.sh"
    assert main(cli(sif, inputs, "--output", str(out))) == 0
    err = capsys.readouterr().err
    assert f"train check: not run here ({sif}: " in err
    assert "could not run: no container runtime to run the SIF" in err
    assert "the job runs it on the head node before Ray" in err and "train check of" not in err
    assert out.is_file() and str(sif) in out.read_text()
