"""``build-env train-check`` for real: the installed tool, a real Docker Engine, the CPU fixture
image built and gated by the pipeline, verl 0.9.1 inside it, the tiny model and data."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import FIXTURE, run_build_env

pytestmark = [pytest.mark.docker, pytest.mark.network]


def check(*args: str) -> tuple[int, str, str, float]:
    start = time.monotonic()
    proc = run_build_env("train-check", *args, timeout=900)
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start


def test_default_command_in_the_fixture_image(cpu_image: dict, tiny: dict) -> None:
    code, out, err, took = check("--target", "cpu-x86_64", "--matrix", str(FIXTURE),
                                 "--model", tiny["model"], "--data", tiny["data"],
                                 "--nodes", "1", "--gpus-per-node", "2", "--json")
    report = json.loads(out)
    print(f"train check in the CPU fixture image: {took:.1f} s (checker {report['seconds']} s)")
    stages = {s["name"]: s for s in report["stages"]}
    assert report["schema"] == "verl-env/train-check/v1" and report["level"] == "config"
    assert report["verl"] == "0.9.1"
    assert "All configuration checks passed" in stages["validate"]["verl_says"]
    for name in ("compose", "model", "train_data", "val_data", "reward", "cluster"):
        assert stages[name]["status"] == "pass", stages[name]
    # the fixture pins what main_ppo imports at start (transferqueue, cachetools); it has no
    # rollout engine (a cpu image), which the trainer stage says
    assert stages["trainer"]["status"] == "pass", stages["trainer"]
    assert "not installed (a cpu image" in stages["trainer"].get("rollout", ""), stages["trainer"]
    assert code == 0 and report["status"] == "pass", err[-3000:]
    assert stages["gpu"]["status"] == "stop"


def test_rejected_override_quotes_verl(cpu_image: dict, tiny: dict) -> None:
    code, out, err, _ = check("--image", cpu_image["image_id"], "--model", tiny["model"],
                              "--data", tiny["data"], "--nodes", "1", "--gpus-per-node", "2",
                              "--override",
                              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null")
    assert code == 1, err[-3000:]
    assert "train check of " in out and ": rejected (level config" in out
    assert "fail   validate" in out
    assert "verl: [actor] Please set at least one of 'actor.ppo_micro_batch_size'" in out
    assert "fix:  --override actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2" in out


def test_missing_image_is_one_line(docker_host: str, tiny: dict, tmp_path: Path) -> None:
    code, out, err, _ = check("--image", "verl-env-test/no-such:image", "--model",
                              tiny["model"], "--data", tiny["data"])
    assert code == 2 and "no such image" in err and "Traceback" not in err
