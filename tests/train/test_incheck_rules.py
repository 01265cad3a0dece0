"""The checker's pure parts (builder/train/incheck imports only the standard library at its
top): its command line, and the rules that turn verl's messages into the override that fixes
them. The messages are verl 0.9.1's own (verl/utils/config.py, verl/workers/config/actor.py).
And the one file the image runs: the zip application of the package, run alone."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from io import BytesIO
from pathlib import Path
from types import SimpleNamespace

import pytest

from builder.train import CHECKER_NAME, checker_bytes
from builder.train.incheck import args as cli
from builder.train.incheck import rules

CFG = SimpleNamespace(
    trainer=SimpleNamespace(nnodes=2, n_gpus_per_node=8),
    actor_rollout_ref=SimpleNamespace(actor=SimpleNamespace(ppo_mini_batch_size=32),
                                      rollout=SimpleNamespace(n=4)),
    data=SimpleNamespace(train_batch_size=60))


@pytest.mark.parametrize("message,fix", [
    ("[actor] Please set at least one of 'actor.ppo_micro_batch_size' or "
     "'actor.ppo_micro_batch_size_per_gpu' if use_dynamic_bsz is not enabled.",
     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"),
    ("[actor_rollout_ref.rollout] Please set at least one of "
     "'actor_rollout_ref.rollout.log_prob_micro_batch_size' or "
     "'actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu'.",
     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2"),
    ("[actor] You have set both 'actor.ppo_micro_batch_size' AND "
     "'actor.ppo_micro_batch_size_per_gpu'.", "actor_rollout_ref.actor.ppo_micro_batch_size=null"),
    ("real_train_batch_size (240) must be divisible by minimal possible batch size (16)",
     "data.train_batch_size=64"),
    ("Missing mandatory value: actor_rollout_ref.rollout.name",
     "actor_rollout_ref.rollout.name=VALUE"),
])
def test_verls_messages_name_their_fix(message: str, fix: str) -> None:
    assert rules.fix_for(message, CFG) == fix


def test_no_rule_no_fix() -> None:
    assert rules.fix_for("something verl never said", CFG) is None


def test_root_message_unwraps_hydra() -> None:
    try:
        try:
            raise AssertionError("[actor] Please set at least one of ...")
        except AssertionError as inner:
            raise RuntimeError("Error in call to target 'FSDPActorConfig'") from inner
    except RuntimeError as outer:
        assert rules.root_message(outer) == "[actor] Please set at least one of ..."


def test_command_line() -> None:
    a = cli.parse(["--nnodes", "2", "--gpus-per-node", "8", "--", "a=1", "--b"])
    assert (a.nnodes, a.gpus_per_node, a.overrides) == (2, 8, ["a=1", "--b"])
    for bad in (["--nnodes", "2"], ["--nnodes", "x", "--gpus-per-node", "1"],
                ["--nnodes", "1", "--gpus-per-node", "1", "--what", "x"]):
        with pytest.raises(SystemExit) as err:
            cli.parse(bad)
        assert err.value.code == 2


def test_the_zip_application_is_the_package_and_the_same_bytes_each_time() -> None:
    data = checker_bytes()
    names = zipfile.ZipFile(BytesIO(data)).namelist()
    source = sorted(p.name for p in (Path(cli.__file__).parent).glob("*.py"))
    assert names == ["__main__.py", *(f"verl_env_incheck/{n}" for n in source)]
    checker_bytes.cache_clear()
    assert checker_bytes() == data


def test_the_zip_application_runs_alone(tmp_path: Path) -> None:
    """A Python with no site directory and nothing of build-env on its path (-I -S): the usage
    on a bad command line (exit 2), the package's text for --help, and "could not run" (exit 3,
    JSON) without verl."""
    app = tmp_path / CHECKER_NAME
    app.write_bytes(checker_bytes())
    bad = subprocess.run([sys.executable, "-I", "-S", str(app), "--nnodes", "0"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert bad.returncode == 2 and "usage: incheck.pyz --nnodes N" in bad.stderr, bad.stderr
    helped = subprocess.run([sys.executable, "-I", "-S", str(app), "--help"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert helped.returncode == 0 and "verl-env train check: verl's own checks" in helped.stderr
    run = subprocess.run([sys.executable, "-I", "-S", str(app), "--nnodes", "1",
                          "--gpus-per-node", "1", "--", "a=1"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=60)
    report = json.loads(run.stdout)
    assert run.returncode == 3 and report["status"] == "error", run.stderr
    assert report["error"].startswith("verl is not importable here: ")
