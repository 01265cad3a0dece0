"""The CUDA-shaped fixture on a real Docker Engine (tests/fixtures/cuda): a `cuda` target whose
source stage, rendered by the shipped templates, compiles a CUDA extension with the real nvcc of
the `nvidia-cuda-nvcc` wheel for the declared gpus, beside a package built from a git tag (a
local repository, pinned to its commit by `lock`) and a hashed sdist from the index; the image
is built, gated and tagged on this GPU-less host. Then: the same image held to one GPU more is
refused (device-code coverage), and a moved git tag stops the next build before it starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.conftest import run_build_env
from tests.core.test_source_shape import make_site, move_tag
from tests.support import engine_space

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow, pytest.mark.heavy]
TARGET = "cuda-shaped"
EXT = "verl-env-cuda-ext"
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture site in a directory of its own, its git source a local repository, locked
    (`build-env lock` resolves against the index and pins the git tag to its commit)."""
    root = tmp_path_factory.mktemp("cuda-site")
    matrix = make_site(root)
    t0 = time.monotonic()
    proc = run_build_env("lock", "--target", TARGET, "--matrix", str(matrix), timeout=600)
    TIMINGS["lock"] = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    return matrix


@pytest.fixture(scope="module")
def built(site: Path, debian_base: str, ca_bundle: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The fixture built and gated. When the module ends, what it built (its images and the
    build cache: about 18 GB, CUDA torch in two stages beside uv's cache) leaves the group's
    engine, which the later heavy modules and the other groups' disk need back."""
    engine = engine_space.client()
    before = engine_space.image_ids(engine)
    try:
        yield _build(site, ca_bundle, tmp_path_factory)
    finally:
        engine_space.clear(engine, before, f"{TARGET} module done")


def _build(site: Path, ca_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    workdir = tmp_path_factory.mktemp("cuda-build")
    t0 = time.monotonic()
    proc = run_build_env("--target", TARGET, "--matrix", str(site), "--ca-bundle",
                         str(ca_bundle), "--workdir", str(workdir), "--json", timeout=3600)
    TIMINGS["pipeline"] = time.monotonic() - t0
    if proc.returncode != 0:
        pytest.fail(f"cuda-shaped build failed (exit {proc.returncode}):\n"
                    f"{proc.stderr[-6000:]}\n{proc.stdout[-4000:]}")
    report = json.loads(proc.stdout)
    report["_workdir"] = str(workdir)
    return report


def _checks(report: dict) -> dict[str, dict]:
    return {c["id"]: c for c in report["checks"]}


def test_cuda_shaped_fixture_builds_with_nvcc_and_passes_the_gate(built: dict,
                                                                  docker_host: str) -> None:
    assert built["result"] == "pass", built.get("error")
    assert built["tags"][-1] == f"verl-env:{TARGET}"
    image = docker.from_env().images.get(f"verl-env:{TARGET}")
    labels = image.labels
    assert labels["org.verl-env.gpus"] == "sm_80,sm_90"
    assert labels["org.verl-env.source.verl-env-gitpkg"].startswith("git v0.1.0 ")
    assert labels["org.verl-env.source.verl-env-cuda-ext"].startswith("tree sha256:")
    assert labels["org.verl-env.source.simplejson"].startswith("sdist sha256:")
    checks = _checks(built["verification"])
    for name in (EXT, "verl-env-gitpkg", "simplejson"):
        assert checks[f"cpu.source_build.{name}"]["status"] == "pass", checks
    assert "returned True" in checks[f"cpu.source_build.{EXT}"]["reason"]
    assert checks["versions.torch_build"]["status"] == "pass", checks["versions.torch_build"]
    # device-code coverage (issue 19 item 4): every native library runs on sm_80 and sm_90
    # (none fails; a library that runs only by JIT from PTX may warn)
    coverage = {cid: c for cid, c in checks.items() if cid.startswith("coverage.")}
    assert coverage[f"coverage.{EXT}"]["status"] == "pass", coverage[f"coverage.{EXT}"]
    assert not [c for c in coverage.values() if c["status"] == "fail"]
    for cid, c in sorted(coverage.items()):
        if c["status"] != "pass":
            print(f"\n  {c['status']}: {cid}: {c.get('reason')}")
    # the extension holds device code for exactly the declared GPUs (read with the image's own
    # python: the .so's .nv_fatbin section is there, its arch list is the one compiled)
    out = docker.from_env().containers.run(
        image.id, ["/opt/venv/bin/python", "-c",
                   "import verl_env_cuda_ext as m; print(m._kernels.arch_list())"],
        remove=True, entrypoint=[]).decode().strip()
    assert out == "8.0;9.0"
    # nvcc, the build tools and the compilers stayed in the source stages
    history = " ".join(h.get("CreatedBy", "") for h in image.history())
    assert "build-essential" not in history and "nvidia-cuda-nvcc" not in history
    stages = built["stages"]
    assert stages["verify"]["scope"] == "release", stages["verify"]
    print(f"\ncuda-shaped timings: lock {TIMINGS.get('lock', 0):.0f} s, pipeline "
          f"{TIMINGS.get('pipeline', 0):.0f} s, build {stages['build'].get('seconds')} s, "
          f"verify {stages['verify'].get('seconds')} s")
    _print_steps(stages["build"])


def _print_steps(build: dict) -> None:
    for s in build.get("step_times", []):
        if s.get("seconds", 0) >= 1 or s["instruction"].startswith("RUN") and "pip wheel" in \
                s["instruction"]:
            print(f"  {s['seconds']:7.1f} s  {'cached ' if s['cached'] else ''}[{s['stage']} "
                  f"{s['at']}] {s['instruction'][:70]}")


def _runs(build: dict, stage: str) -> list[dict]:
    return [s for s in build["step_times"] if s["stage"] == stage
            and s["instruction"].startswith("RUN")]


def test_changing_one_source_rebuilds_only_its_own_stage(built: dict, site: Path,
                                                         ca_bundle: Path, tmp_path: Path) -> None:
    """One stage per source package: a changed extension source recompiles that extension
    only; the git package's and the sdist's compiled wheels come from the build cache."""
    cu = site.parent / "ext" / "verl_env_cuda_ext" / "kernels.cu"
    original = cu.read_text()
    cu.write_text(original + "\n// changed: a new tree hash, a new content tag\n")
    try:
        t0 = time.monotonic()
        proc = run_build_env("--target", TARGET, "--matrix", str(site), "--ca-bundle",
                             str(ca_bundle), "--workdir", str(tmp_path), "--json", timeout=3600)
        seconds = time.monotonic() - t0
    finally:
        cu.write_text(original)
    assert proc.returncode == 0, proc.stderr[-5000:]
    report = json.loads(proc.stdout)
    assert report["tags"][0] != built["tags"][0]  # another content tag
    build = report["stages"]["build"]
    for stage in ("source-verl-env-gitpkg", "source-simplejson", "source-build"):
        runs = _runs(build, stage)
        assert runs and all(s["cached"] for s in runs), (stage, runs)
    ext = _runs(build, f"source-{EXT}")
    assert ext and not any(s["cached"] for s in ext), ext
    print(f"\nrebuild after one changed source: pipeline {seconds:.0f} s, build "
          f"{build['seconds']} s ({build['cache_hits']} cached steps)")
    _print_steps(build)


def test_one_gpu_too_many_is_refused_naming_the_so(built: dict, site: Path) -> None:
    """The device-code coverage phase (builder/selftest/phases/coverage.py): the image compiled for
    sm_80/sm_90, held to a target that also declares sm_103, fails a ``coverage.*`` check
    naming the extension's shared object."""
    proc = run_build_env("verify", f"verl-env:{TARGET}", "--target",
                         "cuda-shaped-one-gpu-too-many", "--matrix", str(site), "--json",
                         timeout=900)
    report = json.loads(proc.stdout)
    coverage = [c for c in report["checks"] if c["id"].startswith("coverage.")]
    assert coverage, [c["id"] for c in report["checks"]]  # the phase ran
    assert proc.returncode == 1, proc.stderr
    failed = [c for c in coverage if c["status"] == "fail"]
    assert any("_kernels" in (c.get("reason") or "") and "sm_103" in (c.get("reason") or "")
               for c in failed), failed
    for c in failed:
        print(f"\n  refused: {c['id']}: {c.get('reason')}")


def test_moved_git_tag_stops_check_lock_and_build(built: dict, site: Path, ca_bundle: Path,
                                                   tmp_path: Path) -> None:
    recorded = json.loads((site.parent / "locks" / f"{TARGET}.sources.json").read_text())
    commit = recorded["packages"]["verl-env-gitpkg"]["commit"]
    moved = move_tag(site.parent / "gitpkg.git")
    assert moved != commit
    t0 = time.monotonic()
    proc = run_build_env("--target", TARGET, "--matrix", str(site), "--ca-bundle",
                         str(ca_bundle), "--workdir", str(tmp_path), "--json", timeout=600)
    assert proc.returncode != 0
    text = proc.stderr + proc.stdout
    for needle in ("verl-env-gitpkg", "'v0.1.0'", commit, moved):
        assert needle in text, text[-3000:]
    # refused before anything was built (the messages above); the bound only catches a hang
    assert time.monotonic() - t0 < 600
    check = run_build_env("check", "--target", TARGET, "--matrix", str(site))
    assert check.returncode == 1 and moved in check.stderr and commit in check.stderr
    lock = run_build_env("lock", "--target", TARGET, "--matrix", str(site))
    assert lock.returncode != 0 and moved in lock.stderr and "--repin" in lock.stderr
    subprocess.run(["git", "-C", str(site.parent / "gitpkg.git"), "tag", "-f", "v0.1.0", commit],
                   check=True, capture_output=True)


def test_a_prebuilt_wheel_replaces_the_source_build(built: dict, site: Path, ca_bundle: Path,
                                                   tmp_path: Path) -> None:
    """Prebuilt first: with a site wheelhouse holding a fitting simplejson wheel, `lock` takes
    it, the build has no simplejson stage, the image holds that very wheel, the gate passes."""
    wheelhouse = tmp_path / "wheelhouse"
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--isolated", "--no-deps",
                           "--only-binary", ":all:", "--python-version", "3.11",
                           "--platform", "manylinux_2_17_x86_64", "simplejson==4.3.0",
                           "-d", str(wheelhouse)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PIP_CONFIG_FILE": "/dev/null"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    [wheel] = wheelhouse.glob("simplejson-4.3.0-*.whl")
    text = site.read_text()
    line = '      simplejson: {version: "4.3.0", build: source}'
    site.write_text(text.replace(line, line[:-1] + f", prebuilt: [{{wheelhouse: {wheelhouse}}}]}}"))
    try:
        lock = run_build_env("lock", "--target", TARGET, "--matrix", str(site), timeout=600)
        assert lock.returncode == 0, lock.stderr
        listing = run_build_env("list", "--matrix", str(site))
        assert f"{TARGET}: simplejson: prebuilt wheel {wheel.name}" in listing.stdout
        proc = run_build_env("--target", TARGET, "--matrix", str(site), "--ca-bundle",
                             str(ca_bundle), "--workdir", str(tmp_path / "w"), "--json",
                             timeout=3600)
        assert proc.returncode == 0, proc.stderr[-5000:]
        report = json.loads(proc.stdout)
        build = report["stages"]["build"]
        assert not [s for s in build["step_times"] if s["stage"] == "source-simplejson"]
        assert _runs(build, "source-verl-env-gitpkg")  # the other source builds stay
        image = docker.from_env().images.get(report["image_id"])
        sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
        assert image.labels["org.verl-env.prebuilt.simplejson"] == f"{wheel.name} sha256:{sha}"
        checks = _checks(report["verification"])
        assert checks["versions.pin.simplejson"]["status"] == "pass"
        assert "cpu.source_build.simplejson" not in checks  # not built here
        installer = docker.from_env().containers.run(
            image.id, ["/opt/venv/bin/python", "-c", "import importlib.metadata as m; "
                       "print(m.distribution('simplejson').read_text('WHEEL'))"],
            remove=True, entrypoint=[]).decode()
        tag = wheel.name[:-len(".whl")].split("-", 2)[2]
        assert f"Tag: {tag}" in installer  # the wheelhouse's wheel, not one built from the sdist
        print(f"\nprebuilt simplejson: build {build['seconds']} s, "
              f"{build['cache_hits']} cached steps")
    finally:
        site.write_text(text)


def test_the_fixtures_extension_is_read_as_cuobjdump_reads_it(built: dict, tmp_path: Path
                                                              ) -> None:
    """The coverage phase's reading of the extension the fixture compiled in its source stage
    agrees with NVIDIA's own cuobjdump on the same file, copied out of the built image."""
    import io
    import tarfile

    from builder.selftest.elf.devcode import read_device_code
    from tests.selftest.test_devcode_real import as_cuobjdump, cuobjdump
    from tests.support import wheels

    why = wheels.supported()
    if why:
        pytest.skip(why)
    # marked network: an unreachable index is a failure of this run, not a skip
    tools = wheels.unpack(wheels.NVCC_WHEELS, "cuda-13.5.37") / "nvidia" / "cu13" / "bin"
    client = docker.from_env()
    container = client.containers.create(built["image_id"], ["true"], entrypoint=[])
    try:
        found = client.containers.run(
            built["image_id"], ["/opt/venv/bin/python", "-c",
                                "import verl_env_cuda_ext._kernels as k; print(k.__file__)"],
            remove=True, entrypoint=[]).decode().strip()
        stream, _ = container.get_archive(found)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.getmembers()[0]
            so = tmp_path / member.name
            so.write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
    finally:
        container.remove(force=True)
    code = read_device_code(str(so))
    assert code is not None and not code.problems
    ours = as_cuobjdump(code.cuda)
    assert ours == cuobjdump(tools, so)
    assert set(ours[0]) == {"sm_80", "sm_90"}  # the fixture's gpus, nothing else
