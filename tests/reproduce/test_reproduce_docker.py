"""``build-env reproduce`` for real: the CPU fixture rebuilt with no cache gives the same files
(the only full rebuild of the suite), and a planted non-deterministic step in the smallest image
(fixtures/tiny.yaml: the Debian base, the interpreter, uv, the self-test) is caught, naming the
file and nothing else."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from builder import shipped
from tests.conftest import FIXTURE, REPO, run_build_env

HERE = Path(__file__).resolve().parent
TINY = HERE / "fixtures" / "tiny.yaml"
SNAPSHOT = REPO / "tests" / "fixtures" / "metadata" / "pypi-snapshot.json"
PLANTED = "/opt/verl-env/planted-random"


def _images(docker_host: str) -> set[str]:
    import docker

    client = docker.DockerClient(base_url=docker_host, timeout=600)
    try:
        return {image.id for image in client.images.list(all=True)}
    finally:
        client.close()


@pytest.mark.docker
@pytest.mark.slow
def test_the_cpu_fixture_rebuilt_with_no_cache_is_identical(
        cpu_image: dict[str, Any], ca_bundle: Path, docker_host: str, tmp_path: Path) -> None:
    image = cpu_image["image_id"]
    before = _images(docker_host)
    tree = tmp_path / "tree.json"
    proc = run_build_env("reproduce", image, "--matrix", str(FIXTURE), "--ca-bundle",
                         str(ca_bundle), "--tree", str(tree), timeout=3600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
    doc = json.loads(tree.read_text())
    assert proc.stdout == f"identical ({doc['files']} files)\n"
    assert doc["files"] > 10000 and doc["root"].startswith("sha256:")
    assert _images(docker_host) == before, "the rebuilt candidate was not removed"
    # the proved tree is recorded with the verdict: the image checks against it, no rebuild
    proc = run_build_env("reproduce", image, "--against-record")
    assert (proc.returncode, proc.stdout) == (0, f"identical (root {doc['root']})\n"), proc.stderr
    proc = run_build_env("reproduce", image, "--against-record", str(tree))
    assert (proc.returncode, proc.stdout) == (0, f"identical ({doc['files']} files)\n"), proc.stderr


def _planted_templates(where: Path) -> Path:
    """The shipped templates, with one step that writes random bytes into a file."""
    where.mkdir()
    text = (shipped.dockerfiles_dir() / "Dockerfile.j2").read_text()
    step = f"RUN head -c 16 /dev/urandom | od -An -tx1 > {PLANTED}\n\nLABEL "
    assert text.count("\nLABEL ") == 1
    (where / "Dockerfile.j2").write_text(text.replace("\nLABEL ", "\n" + step))
    shutil.copy(shipped.dockerfiles_dir() / "_macros.j2", where / "_macros.j2")
    return where


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.heavy
def test_a_planted_random_file_is_caught_and_named(debian_base: str, docker_host: str,
                                                   ca_bundle: Path, tmp_path: Path) -> None:
    templates = _planted_templates(tmp_path / "templates")
    site = ["--matrix", str(TINY), "--snapshot", str(SNAPSHOT), "--ca-bundle", str(ca_bundle),
            "--templates", str(templates)]
    proc = run_build_env("--target", "tiny-x86_64", *site, "--workdir", str(tmp_path / "w"))
    assert proc.returncode == 0, proc.stderr[-6000:]
    before = _images(docker_host)
    proc = run_build_env("reproduce", "--target", "tiny-x86_64", *site)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-6000:]
    lines = proc.stdout.splitlines()
    # the planted file, and nothing else: the rest of the image rebuilds to the same bytes
    assert len(lines) == 2, proc.stdout
    assert lines[0].startswith(f"{PLANTED}: content ") and "size" not in lines[0]
    assert lines[-1].startswith("differs: 1 of ")
    assert _images(docker_host) == before, "the rebuilt candidate was not removed"
    # without the planted step the inputs are not the image's: refused, exit 3, naming it
    proc = run_build_env("reproduce", "verl-env:tiny-x86_64", "--matrix", str(TINY),
                         "--snapshot", str(SNAPSHOT), "--ca-bundle", str(ca_bundle))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "the inputs the image records cannot be had here" in proc.stderr
    assert "content: the image is verl-env:tiny-x86_64-verl" in proc.stderr, proc.stderr
    assert _images(docker_host) == before
