"""Fixtures for the train check's tests: host venvs with the real verl 0.9.1
(tests/support/verl_hostenv.py), the tiny model and data (tests/support/tiny_verl.py) made once
per session, and a runner of the checker (the zip application of builder/train/incheck) with a given python."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from builder.train import CHECKER_NAME, checker_bytes, default_command

TINY = Path(__file__).resolve().parents[1] / "support" / "tiny_verl.py"


def _venv(kind: str) -> str:
    from tests.support.verl_hostenv import verl_hostenv

    try:
        return str(verl_hostenv(kind))
    except Exception as e:  # noqa: BLE001 - no torch wheel / no index here: skip visibly
        pytest.skip(f"{kind} verl venv unavailable: {e}")


@pytest.fixture(scope="session")
def core_py() -> str:
    """A python with verl 0.9.1 and its [verl-core] extra (what the CUDA images hold)."""
    return _venv("core")


@pytest.fixture(scope="session")
def plain_py() -> str:
    """A python with exactly the CPU fixture's lock (verl 0.9.1 without extras)."""
    return _venv("plain")


def make_tiny(python: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run([python, str(TINY), *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def tiny(core_py: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The tiny model directory and gsm8k-shaped parquet pair: {model, train, val, data}."""
    root = tmp_path_factory.mktemp("tiny-verl")
    out = make_tiny(core_py, "--model", str(root / "model"), "--data", str(root / "data"))
    return {"model": out["model"]["path"], "train": out["data"]["train"],
            "val": out["data"]["test"], "data": str(root / "data")}


@dataclass
class Checked:
    code: int
    report: dict[str, Any]
    stderr: str
    seconds: float

    def stage(self, name: str) -> dict[str, Any]:
        return next(s for s in self.report["stages"] if s["name"] == name)

    def failed(self) -> list[str]:
        return [s["name"] for s in self.report.get("stages", []) if s["status"] == "fail"]


RunChecker = Callable[..., Checked]


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    """A model directory (config, tokenizer, weights) and a train/test pair, contents stand-ins:
    for the tests of what the check copies into the image and how it runs, not of verl."""
    model, data = tmp_path / "model", tmp_path / "data"
    model.mkdir()
    data.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    (data / "train.parquet").write_bytes(b"PAR1")
    (data / "test.parquet").write_bytes(b"PAR1")
    return {"model": model, "data": data}


@pytest.fixture(scope="session")
def cpu_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A manifest saying 'cpu' (this host has no rollout engine, as the CPU fixture image)."""
    path = tmp_path_factory.mktemp("manifest") / "manifest.json"
    path.write_text(json.dumps({"schema": "verl-env/manifest/v1", "accelerator": "cpu"}))
    return path


@pytest.fixture
def run_checker(tmp_path: Path, cpu_manifest: Path) -> RunChecker:
    """``run(python, overrides, nnodes=, gpus_per_node=)``: the checker as the image runs it."""

    def run(python: str, overrides: list[str], *, nnodes: int = 1, gpus_per_node: int = 2,
            manifest: Path | None = cpu_manifest, engines: dict[str, str] | None = None
            ) -> Checked:
        app = tmp_path / CHECKER_NAME
        app.write_bytes(checker_bytes())
        cmd = [python, str(app), "--nnodes", str(nnodes), "--gpus-per-node",
               str(gpus_per_node)]
        for name, module in (engines or {}).items():
            cmd += ["--engine", f"{name}={module}"]
        if manifest is not None:
            cmd += ["--manifest", str(manifest)]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
        start = time.monotonic()
        proc = subprocess.run([*cmd, "--", *overrides], capture_output=True, text=True,
                              timeout=600, cwd=tmp_path, env=env)
        took = time.monotonic() - start
        try:
            report = json.loads(proc.stdout)
        except ValueError:
            pytest.fail(f"no JSON on stdout (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                        f"{proc.stderr[-3000:]}")
        return Checked(proc.returncode, report, proc.stderr, took)

    return run


def tiny_command(tiny: dict[str, str], **kwargs: Any) -> list[str]:
    """The default command's hydra overrides on the tiny inputs (1 node x 2 GPUs unless told)."""
    args: dict[str, Any] = {"rollout": "vllm", "nnodes": 1, "gpus_per_node": 2, **kwargs}
    return default_command("0.9.1", model=tiny["model"], train_files=tiny["train"],
                           val_files=tiny["val"], **args)[3:]
