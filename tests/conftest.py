"""Shared fixtures: a real Docker Engine per session and the debootstrap base image.

Tests that need a real part are marked (docker, registry, slurm, gpu, apptainer). A part that is
absent here (no root, a tool not installed, no GPU) makes them skip with a visible reason; a part
that is here but fails to come up (the debootstrap base, the engine) is an error, never a skip.
``--expected-skips FILE`` (``scripts/test.sh`` passes ``tests/expected-skips.txt``) fails the run
for every skip the reviewed list does not name (``tests/support/skips.py``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import cpuacct, groups, shared_image, skips
from tests.support.dockerd import Dockerd, import_debian_base, start_dockerd, unavailable_reason

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "cpu.yaml"
# the emulated group's session fixtures (one arm64 build, one emulated gate per session)
pytest_plugins = ["tests.support.arm64"]
CA_BUNDLE = Path(os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt"))

# A shell without job control starts a background command (`pytest ... &`, as test.sh does for
# its side groups, or a CI runner's `cmd &`) with SIGINT ignored, and every process it starts
# inherits that: a test that interrupts `build-env` with SIGINT would then see it run on. The
# tests start the tool as a user's terminal would, with SIGINT's default action.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser: pytest.Parser) -> None:
    skips.add_option(parser)


def pytest_configure(config: pytest.Config) -> None:
    skips.configure(config)
    cpuacct.configure(config)  # with VERL_ENV_TEST_CPU: the group's CPU, test by test


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups.check(items)  # a test that would start a real part in a group meant to have none


@pytest.fixture(scope="session")
def dockerd() -> Iterator[Dockerd]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    d = start_dockerd()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="session")
def docker_host(dockerd: Dockerd) -> Iterator[str]:
    """DOCKER_HOST of the session's engine, exported for the code under test."""
    old = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = dockerd.host
    try:
        yield dockerd.host
    finally:
        if old is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = old


@pytest.fixture
def docker_context_env(docker_host: str, tmp_path: Path) -> dict[str, str]:
    """The environment of a login node that names the session's engine only through a docker
    context (``verl-env-remote`` in a private docker config; DOCKER_HOST empty). The engine is a
    second local daemon on its own socket, never the machine's default one."""

    return docker_context(docker_host, tmp_path / "docker-config")


def docker_context(docker_host: str, config: Path) -> dict[str, str]:
    """A private docker config under ``config`` whose context ``verl-env-remote`` names the
    session's engine: the environment that reaches it only through that context."""
    assert docker_host != "unix:///var/run/docker.sock", docker_host
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker CLI to create the context with")
    subprocess.run([docker, "--config", str(config), "context", "create", "verl-env-remote",
                    "--docker", f"host={docker_host}"], check=True, capture_output=True)
    return {"DOCKER_HOST": "", "DOCKER_CONFIG": str(config), "DOCKER_CONTEXT": "verl-env-remote"}


@pytest.fixture(scope="session")
def debian_base(docker_host: str) -> str:
    """``verl-env-test/debian:bookworm`` built with debootstrap from this machine's apt sources.
    A failure (debootstrap, the mirror, ``docker import``) is an error of every test that needs
    the base: skipping them would hide a broken environment behind a green run."""
    try:
        return import_debian_base(docker_host)
    except RuntimeError as exc:
        failed = str(exc)
    pytest.fail(f"no debootstrap base image: {failed}", pytrace=False)


@pytest.fixture(scope="session")
def ca_bundle() -> Path:
    """The host CA bundle: containers reach the package index only with it injected."""
    if not CA_BUNDLE.is_file():
        pytest.skip(f"no CA bundle at {CA_BUNDLE}")
    return CA_BUNDLE


@pytest.fixture(scope="session", autouse=True)
def isolated_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Verdicts and caches of the code under test go to a per-session directory."""
    state = tmp_path_factory.mktemp("state")
    old = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(state)
    try:
        yield state
    finally:
        if old is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = old


def installed_build_env() -> Path:
    """The ``build-env`` executable as users get it: installed from the wheel into a fresh venv.

    ``scripts/test.sh`` builds the wheel and the venv once and exports ``VERL_ENV_CLI``; a bare
    ``pytest`` run builds them here (once per session). The source tree is never on its path.
    """
    global _INSTALLED
    if _INSTALLED is None:
        given = os.environ.get("VERL_ENV_CLI")
        if given:
            _INSTALLED = Path(given)
        else:
            root = Path(tempfile.mkdtemp(prefix="verl-env-wheel-", dir="/var/tmp"))
            atexit.register(shutil.rmtree, root, ignore_errors=True)
            _INSTALLED = install_wheel(root)
        if not os.access(_INSTALLED, os.X_OK):
            raise RuntimeError(f"VERL_ENV_CLI={_INSTALLED} is not an executable")
    return _INSTALLED


_INSTALLED: Path | None = None
# Where CLI-level tests run from: outside the checkout, like a user's own directory.
OUTSIDE = Path(tempfile.mkdtemp(prefix="verl-env-cwd-", dir="/var/tmp"))
atexit.register(shutil.rmtree, OUTSIDE, ignore_errors=True)


def install_wheel(root: Path) -> Path:
    """``uv build --wheel`` of this checkout, installed into a fresh venv under ``root``. uv's
    temporary files (a lock file per setuptools build, which uv leaves) go under ``root``, as in
    scripts/test.sh, not into /tmp."""
    (root / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(root / "tmp")}
    subprocess.run(["uv", "build", "--wheel", "-q", "-o", str(root / "dist"), str(REPO)],
                   check=True, capture_output=True, text=True, env=env)
    wheel = next((root / "dist").glob("verl_env-*.whl"))
    subprocess.run(["uv", "venv", "-q", "--seed", "--python", sys.executable, str(root / "venv")],
                   check=True, capture_output=True, text=True, env=env)
    subprocess.run(["uv", "pip", "install", "-q", "--compile-bytecode", "--python",
                    str(root / "venv" / "bin" / "python"), str(wheel)],
                   check=True, capture_output=True, text=True, env=env)
    return root / "venv" / "bin" / "build-env"


def run_build_env(*args: str, timeout: float = 1800, env: dict[str, str] | None = None,
                  cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed ``build-env`` (see :func:`installed_build_env`) from a directory outside
    the checkout. Paths given to it must be absolute."""
    environ = {**os.environ, **(env or {})}
    environ.pop("PYTHONPATH", None)
    return subprocess.run([str(installed_build_env()), *args], cwd=cwd or OUTSIDE, text=True,
                          capture_output=True, timeout=timeout, env=environ)


@pytest.fixture(scope="session")
def cpu_image(debian_base: str, ca_bundle: Path, docker_host: str, pytestconfig: pytest.Config,
              tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The CI fixture target built, verified and tagged for real by the pipeline.

    Returns the build report (``image_id``, ``tags``, ``verification``...). Needs the package
    index reachable from containers (through the injected CA bundle). In a whole run one group
    builds it and the others gate the image it hands them (tests/support/shared_image.py).
    """
    import json

    workdir = tmp_path_factory.mktemp("cpu-build")
    print(f"CPU fixture image: {shared_image.receive(pytestconfig, 'cpu-x86_64', docker_host)}")
    proc = run_build_env("--target", "cpu-x86_64", "--matrix", str(FIXTURE),
                         "--ca-bundle", str(ca_bundle), "--workdir", str(workdir), "--json")
    report = json.loads(proc.stdout) if proc.returncode == 0 else None
    shared_image.offer(pytestconfig, "cpu-x86_64", docker_host, report)
    if report is None:
        pytest.fail(f"fixture build failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return report


@pytest.fixture(scope="session")
def cpu_sif(cpu_image: dict, docker_host: str, tmp_path_factory: pytest.TempPathFactory
            ) -> dict:
    """The CPU fixture image's native SIF, made once per session by ``build-env sif --target``
    through a docker context (DOCKER_HOST empty, as a login node driving a build node), its
    self-test run from the SIF by a real runtime: ``{"path": SIF, "report": its report}``.
    tests/sif/test_cpu_sif.py holds the conversion to what apptainer writes; the train check
    from the job's SIF (tests/train) runs on the same file. Uncompressed (``--compression
    none``): gzip of the 2 GiB export is about 70 CPU-seconds; the main job extended
    (tests/publish/test_main_job_extended.py) converts this image with gzip, and runs it."""
    import json

    missing = [t for t in ("mksquashfs", "unsquashfs", "siftool", "ch-run", "squashfuse")
               if shutil.which(t) is None]
    if missing:
        pytest.skip(f"missing {', '.join(missing)} (apt-get install squashfs-tools siftool "
                    "charliecloud-runtime squashfuse)")
    work = tmp_path_factory.mktemp("cpu-sif")
    out, report = work / "cpu-x86_64.sif", work / "report.json"
    proc = run_build_env("sif", "--target", "cpu-x86_64", "--matrix", str(FIXTURE),
                         "--compression", "none", "--output", str(out), "--report", str(report),
                         timeout=1800,
                         env=docker_context(docker_host, work / "docker-config"))
    if proc.returncode != 0:
        pytest.fail(f"build-env sif of the CPU fixture failed (exit {proc.returncode}):\n"
                    f"{proc.stderr[-3000:]}{proc.stdout[-2000:]}")
    return {"path": out, "report": json.loads(report.read_text())}
