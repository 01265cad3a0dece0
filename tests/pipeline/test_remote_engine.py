"""A login node drives a build node: the engine is named by a docker context (DOCKER_HOST unset),
and build, verify and tag all reach it through that context. Nothing is bind-mounted from this
machine into the engine's containers (see tests/gate for the container-side proof)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURE, run_build_env

pytestmark = [pytest.mark.docker, pytest.mark.network]


def test_build_verify_and_tag_through_a_docker_context(cpu_image: dict, ca_bundle: Path,
                                                        tmp_path: Path,
                                                        docker_context_env: dict[str, str]) -> None:
    proc = run_build_env("verify", "verl-env:cpu-x86_64", "--json", env=docker_context_env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["gate"]["scope"] == "release"
    proc = run_build_env("--target", "cpu-x86_64", "--matrix", str(FIXTURE), "--ca-bundle",
                         str(ca_bundle), "--workdir", str(tmp_path / "a"), "--json",
                         env=docker_context_env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["image_id"] == cpu_image["image_id"]
    # a real BuildKit build goes to the context's engine too (it fails there, at its apt step)
    proc = run_build_env("--target", "cpu-x86_64-badapt", "--matrix", str(FIXTURE),
                         "--ca-bundle", str(ca_bundle), "--workdir", str(tmp_path / "b"),
                         env=docker_context_env)
    assert proc.returncode == 1 and "verl-env-no-such-package" in proc.stderr, proc.stderr


def test_an_unknown_context_is_a_clear_error(docker_context_env: dict[str, str]) -> None:
    proc = run_build_env("verify", "verl-env:cpu-x86_64", env={**docker_context_env,
                                                                "DOCKER_CONTEXT": "nope"})
    assert proc.returncode == 1
    assert "docker context 'nope' does not exist" in proc.stderr, proc.stderr
