"""`--sif` and `--push` check what they need before anything is built: the run fails at once,
with a clear error, and leaves no build context, report or image behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import FIXTURE, installed_build_env, run_build_env

pytestmark = [pytest.mark.docker]


def _main_job(tmp_path: Path, ca_bundle: Path, *extra: str, env: dict[str, str] | None = None):
    return run_build_env("--target", "cpu-x86_64", "--matrix", str(FIXTURE), "--ca-bundle",
                         str(ca_bundle), "--workdir", str(tmp_path / "w"), *extra, env=env,
                         timeout=300)


def test_an_unreachable_registry_fails_before_the_build(docker_host: str, ca_bundle: Path,
                                                        tmp_path: Path) -> None:
    proc = _main_job(tmp_path, ca_bundle, "--push", "127.0.0.1:9/verl-env",
                     env={"DOCKER_CONFIG": str(tmp_path / "cfg")})
    assert proc.returncode == 3, proc.stderr  # a registry that does not answer: infrastructure
    assert "publish:" in proc.stderr and "127.0.0.1:9" in proc.stderr
    assert not (tmp_path / "w").exists()  # nothing rendered, nothing built


def test_a_missing_sif_backend_fails_before_the_build(docker_host: str, ca_bundle: Path,
                                                      tmp_path: Path) -> None:
    bare = str(installed_build_env().parent)  # the venv's python, no mksquashfs, no apptainer
    proc = _main_job(tmp_path, ca_bundle, "--sif", str(tmp_path / "x.sif"), env={"PATH": bare})
    assert proc.returncode == 1, proc.stderr
    assert "mksquashfs not found" in proc.stderr
    assert not (tmp_path / "w").exists() and not (tmp_path / "x.sif").exists()


def test_a_sign_key_needs_a_sif_and_a_readable_key(docker_host: str, ca_bundle: Path,
                                                    tmp_path: Path) -> None:
    key = tmp_path / "nokey.pem"
    proc = _main_job(tmp_path, ca_bundle, "--sign-key", str(key))
    assert proc.returncode == 2 and "--sif" in proc.stderr and "--push" in proc.stderr, proc.stderr
    proc = _main_job(tmp_path, ca_bundle, "--sif", str(tmp_path / "x.sif"), "--sign-key",
                     str(key))
    assert proc.returncode != 0 and "nokey.pem" in proc.stderr, proc.stderr
    assert not (tmp_path / "w").exists()
