"""The README's build-host line, ``build-env doctor --target cuda-x86_64 && build-env --target
cuda-x86_64``, as written, against the real private dockerd of the test session: doctor passes
on an ordinary build host (no InfiniBand, no apptainer, no GPU), says that without the NVIDIA
Container Toolkit the GPU gate phases will be pending, and so lets the build start."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import OUTSIDE, installed_build_env, run_build_env
from tests.support.simple_index import serve_index

pytestmark = pytest.mark.docker

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture
def index() -> Iterator[str]:
    with serve_index() as url:
        yield url


def _env(index_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.pop("PYTHONPATH", None)
    env["VERL_ENV_INDEX_URL"] = index_url  # the site's index, as a firewalled site sets it
    env["PATH"] = f"{installed_build_env().parent}:{env['PATH']}"
    return env


def test_the_readme_line_reaches_the_build_on_a_build_host(docker_host: str, index: str
                                                          ) -> None:
    line = next(x for x in README.read_text().splitlines() if "build-env doctor" in x)
    doctor_part = line.split("&&")[1].strip()
    assert doctor_part == "build-env doctor --target cuda-x86_64"
    # the build itself (a CUDA image, hours) is not run here: an echo stands for it
    proc = subprocess.run(["bash", "-c", f"{doctor_part} && echo BUILD-WOULD-START"],
                          cwd=OUTSIDE, env=_env(index), text=True, capture_output=True,
                          timeout=600)
    out = proc.stdout
    print(out)  # what the user sees (pytest -s)
    fails = [x for x in out.splitlines() if x.lstrip().startswith("[FAIL]")]
    if any("engine.disk" in x for x in fails):
        # a host whose engine has less free space than a CUDA build needs (a CI machine, its
        # other test engines filling the same disk): the README line must stop right there,
        # for that reason alone, and never start the build
        assert [x for x in fails if "engine.disk" not in x] == [], out
        assert proc.returncode != 0 and "BUILD-WOULD-START" not in out, out + proc.stderr
        assert "a cuda target needs about" in out, out
        return
    assert proc.returncode == 0 and "BUILD-WOULD-START" in out, out + proc.stderr
    assert "ib0" not in out and "apptainer" not in out


def test_the_findings_against_the_real_engine(docker_host: str, index: str) -> None:
    proc = run_build_env("doctor", "--json", "--target", "cuda-x86_64", "--index-url", index,
                         env={k: v for k, v in _env(index).items()
                              if k != "VERL_ENV_INDEX_URL"}, timeout=600)
    doc = json.loads(proc.stdout)
    ids = {f["id"]: f for f in doc["findings"]}
    assert ids["engine"]["status"] == "ok" and docker_host in ids["engine"]["message"]
    assert ids["engine.buildkit"]["status"] == "ok"
    toolkit = ids["gpu.toolkit"]
    info = subprocess.run(["docker", "-H", docker_host, "info", "--format",
                           "{{json .Runtimes}}"], capture_output=True, text=True, timeout=60)
    has_nvidia = "nvidia" in json.loads(info.stdout or "{}")
    if has_nvidia:
        assert toolkit["status"] == "ok", toolkit
    else:  # the session's dockerd registers no nvidia runtime: a warning, never a failure
        assert toolkit["status"] == "warn", toolkit
        assert "GPU gate phases will be pending" in toolkit["message"]
    disk = ids["engine.disk"]
    assert disk["status"] in ("ok", "fail") and "under the data root" in disk["message"]
    assert "needs about 60 GB" in disk["message"]
    assert ids["site.index"]["status"] == "ok"
    assert proc.returncode == (1 if any(f["status"] == "fail" for f in ids.values()) else 0)
