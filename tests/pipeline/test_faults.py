"""Faults of the Docker Engine under ``build-env --target T`` (issue 23), on real daemons.

- The engine dies (its dockerd SIGKILLed by PID) in the middle of a build step and in the middle
  of the gate: the run exits 1 naming the stage and the engine, tags nothing and records no
  verdict; the same command after a restart on the same data root builds, gates and tags.
- The engine's data root fills up during a build (a private dockerd whose data root is a loop
  ext4 filesystem with ~400 MB free): exit 1 naming the data root and its free space, no tag; the
  same command after the space is freed completes.
- Two ``build-env --target T`` of one target at once: one builds, the other waits on the run
  lock and then reuses the verified image; the content tag names one image.

The killed and the full engines are private dockerds (tests/support/dockerd.py) on the session's
cached debootstrap base (``docker load`` only); their builds are the CPU fixture's base, tools and
torch layer (``faults-x86_64``, tests/pipeline/fixtures/faults.yaml: a fault lands in a real
700 MB install, and the build after it is that layer again, not all 125 packages). The two runs
at once use the session's engine, where the CPU fixture itself is already built (a cached build).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

import requests
import urllib3.exceptions

from builder import exclusive as runlock
from builder.gate import verdicts
from builder.engine import BuildProgress, EngineHealth, PlainProgress, faults
from builder.engine.buildkit import _VERTEX
from builder.engine.containers import OWNER_LABEL
from builder.errors import EngineError
from tests.conftest import OUTSIDE, REPO, installed_build_env
from tests.support.dockerd import Dockerd, import_debian_base, start_dockerd, unavailable_reason

# the faulted builds: the CPU fixture's base, tools and torch layer (tests/pipeline/fixtures)
TARGET = "faults-x86_64"
FAULTS = str(REPO / "tests/pipeline/fixtures/faults.yaml")
# two runs at once: the CPU fixture itself, already built in the session's engine
CPU_TARGET = "cpu-x86_64"
CPU_FIXTURE = str(REPO / "tests/fixtures/cpu.yaml")
TIMEOUT = 900



def _apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (as scripts/debian-base.sh reads it), for a
    realistic apt output line; a placeholder where apt names none."""
    lines: list[str] = []
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        lines += [ln.split()[1] for ln in path.read_text().splitlines()
                  if ln.startswith("URIs:") and len(ln.split()) > 1]
    sources = Path("/etc/apt/sources.list")
    if sources.is_file():
        lines += [ln.split()[1] for ln in sources.read_text().splitlines()
                  if ln.startswith("deb ") and len(ln.split()) > 1]
    return next((u for u in lines if "security" not in u), "http://mirror.invalid/debian")


APT_MIRROR = _apt_mirror()

def _popen(host: str, *args: str) -> subprocess.Popen[str]:
    """The installed ``build-env`` against the engine at ``host``, from outside the checkout."""
    env = {**os.environ, "DOCKER_HOST": host}
    env.pop("PYTHONPATH", None)
    return subprocess.Popen([str(installed_build_env()), *args], cwd=OUTSIDE, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _build(host: str, ca_bundle: Path, workdir: Path, *extra: str
           ) -> subprocess.CompletedProcess[str]:
    proc = _popen(host, *_args(ca_bundle, workdir), "--json", *extra)
    out, err = proc.communicate(timeout=TIMEOUT)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _args(ca_bundle: Path, workdir: Path, target: str = TARGET, matrix: str = FAULTS
          ) -> list[str]:
    return ["--target", target, "--matrix", matrix, "--ca-bundle", str(ca_bundle),
            "--workdir", str(workdir)]


def _errors(stderr: str) -> list[str]:
    """The ``error:`` lines (printed too: ``pytest -rP`` shows what the user saw)."""
    assert "Traceback" not in stderr, stderr[-3000:]
    found = [line for line in stderr.splitlines() if line.startswith("error: ")]
    print("\n".join(found))
    return found


def _released(client: docker.DockerClient) -> list[str]:
    return sorted(t for image in client.images.list() for t in image.tags
                  if t.startswith("verl-env:"))


class Private:
    """A private dockerd that a test may kill and start again (holds the live one)."""

    def __init__(self, d: Dockerd) -> None:
        self.d = d

    @property
    def host(self) -> str:
        return self.d.host

    def kill(self) -> None:
        self.d.kill()

    def restart(self) -> None:
        self.d = self.d.restart()

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.d.host, timeout=120)


@pytest.fixture(scope="module")
def private(debian_base: str) -> Iterator[Private]:
    """A dockerd of this module's own with the session's debootstrap base (the cached tarball
    the session's ``debian_base`` made, imported: no second debootstrap)."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    holder = Private(start_dockerd())
    try:
        import_debian_base(holder.host, debian_base)
        yield holder
    finally:
        holder.d.stop()


# --------------------------------------------------------------------------- the pure parts


def test_a_full_disk_is_found_in_what_buildkit_apt_and_uv_print() -> None:
    uv = ("#9 4.2 error: Failed to install: torch-2.13.0+cpu-cp311.whl\n"
          "#9 4.2   Caused by: failed to write to file `/tmp/verl-env-uv/x`: No space left on "
          "device (os error 28)\n#9 ERROR: process did not complete successfully: exit code: 2")
    assert faults.no_space(uv) == ("#9 4.2   Caused by: failed to write to file `/tmp/verl-env-uv/"
                                   "x`: No space left on device (os error 28)")
    apt = "#5 3.1 E: Write error - write (28: No space left on device)"
    assert faults.no_space(apt) == apt
    commit = ("failed to solve: failed to compute cache key: write /var/lib/docker/overlay2/x/"
              "diff/a: no space left on device")
    assert faults.no_space(commit) == commit
    assert faults.no_space(f"#5 0.1 Get:1 {APT_MIRROR} bookworm InRelease") is None


class FaultsEngine(EngineHealth):
    """What faults asks of an engine: a remote one, at /run/x.sock, with its data root at
    /srv/docker and 3 GiB of idle build cache, answering or not."""

    def __init__(self, answers: bool) -> None:
        self.answers = answers

    @property
    def where(self) -> str:
        return "the Docker Engine at unix:///run/x.sock"

    def alive(self, timeout: float = 5) -> bool:
        return self.answers

    def is_local(self) -> bool:
        return False

    def data_root(self) -> str:
        return "/srv/docker"

    def idle_build_cache(self) -> int:
        return 3 << 30


def _engine(alive: bool) -> FaultsEngine:
    return FaultsEngine(alive)


def test_a_lost_connection_is_the_engine_down_only_when_it_does_not_answer() -> None:
    lost = requests.ConnectionError(urllib3.exceptions.ProtocolError(
        "Connection aborted.", ConnectionResetError(104, "Connection reset by peer")))
    assert faults.connection_lost(lost)
    assert not faults.connection_lost(ValueError("no"))
    fault = faults.translate(_engine(alive=False), lost, stage="verify",  # type: ignore[arg-type]
                             what="the gate of image sha256:1234", target="t")
    assert isinstance(fault, faults.EngineDown) and fault.exit_code == 3
    assert str(fault).startswith("verify: [t] the Docker Engine at unix:///run/x.sock stopped "
                                 "answering during the gate of image sha256:1234; no verdict was "
                                 "recorded and nothing was tagged.")
    # a slow engine (a read timeout reaches docker-py as a ConnectionError too) is not down
    assert faults.translate(_engine(alive=True), lost, stage="verify",  # type: ignore[arg-type]
                            what="x") is None


def test_a_full_data_root_names_it_and_what_can_be_freed() -> None:
    below = EngineError("could not run x: write /srv/docker/containers/y: no space left on "
                        "device")  # what the engine package raised, relabelled with the stage
    fault = faults.translate(_engine(alive=True), below, stage="verify",  # type: ignore[arg-type]
                             what="the gate of image sha256:1234", target="t")
    assert isinstance(fault, faults.DataRootFull) and fault.exit_code == 3
    text = str(fault)
    assert text.startswith("verify: [t] the Docker Engine at unix:///run/x.sock ran out of space "
                           "in the data root /srv/docker during the gate of image sha256:1234;")
    assert "not on this machine" in text and "3.0 GiB of build cache not in use" in text


def test_the_step_under_way_is_named() -> None:
    parser = PlainProgress(BuildProgress())
    for line in ["#4 [stage-0  1/13] FROM docker.io/library/debian:bookworm\n", "#4 DONE 0.0s\n",
                 "#5 [stage-0  2/13] RUN apt-get update     && apt-get install -y python3\n",
                 f"#5 0.102 Get:1 {APT_MIRROR} bookworm InRelease\n",
                 "error: failed to receive status: rpc error: code = Unavailable desc = error "
                 "reading from server: EOF\n"]:
        parser.feed(line)
    step = parser.current()
    assert step is not None
    assert parser.describe(step) == ("stage-0 2/13 (RUN apt-get update && apt-get install -y "
                                     "python3)")
    assert parser.error().startswith("build failed after step stage-0 2/13 (RUN apt-get update "
                                     "&& apt-get install -y python3) had started:\nerror: failed "
                                     "to receive status")


# --------------------------------------------------------------------------- the engine dies


def _kill_during_a_run_step(private: Private, ca_bundle: Path, workdir: Path
                            ) -> tuple[bool, int, str]:
    """Build with ``-v``; once the first RUN step's process prints, SIGKILL dockerd's PID.
    Returns whether it was killed, the run's exit status and its stderr."""
    proc = _popen(private.host, "-v", *_args(ca_bundle, workdir))
    assert proc.stderr is not None and proc.stdout is not None
    seen: list[str] = []
    running = None  # the vertex of the first RUN step, once its process prints
    killed = False
    for line in proc.stderr:
        seen.append(line)
        m = _VERTEX.match(line.rstrip("\n"))
        if m and running is None and m.group("text").startswith("RUN "):
            running = m.group(1)
        elif running and re.match(rf"#{running} \d+\.\d+ ", line):
            private.kill()  # the step's process runs: SIGKILL to dockerd's PID
            killed = True
            break
    rest = proc.stderr.read()  # through the same buffered reader as the lines above
    proc.stdout.read()
    proc.wait(timeout=300)
    return killed, proc.returncode, "".join(seen) + rest


@pytest.mark.fault
@pytest.mark.docker
@pytest.mark.network
@pytest.mark.slow
def test_the_engine_dies_during_the_build(private: Private, ca_bundle: Path, tmp_path: Path
                                          ) -> None:
    workdir = tmp_path / "build"
    for attempt in (1, 2):
        killed, code, stderr = _kill_during_a_run_step(private, ca_bundle, workdir)
        if killed:
            break
        # the build failed on its own before the fault could be injected (seen once: BuildKit
        # 20.10 ending a fresh engine's first RUN with "rpc error: ... unexpected EOF"); the
        # fault was not tried, so the build is started again once
        print(f"attempt {attempt}: the build ended before a RUN step ran:\n{stderr[-1500:]}")
    else:
        pytest.fail("the build ended twice before a RUN step ran:\n" + stderr[-3000:])
    assert code == 3, stderr[-3000:]  # an infrastructure error (docs/commands.md)
    [error] = _errors(stderr)
    assert re.match(rf"error: build: \[{TARGET}\] the Docker Engine at {re.escape(private.host)} "
                    r"stopped answering during the build, at step (\S+ )?\d+/\d+ \(RUN ", error
                    ), error
    assert "nothing was tagged" in error and "run the same command" in error, error
    report = json.loads((workdir / "report.json").read_text())
    assert report["result"] == "error" and report["tags"] == [] and report["image_id"] is None
    assert report["verification"] is None and "stopped answering" in report["error"]

    private.restart()  # the same data root, exec root and socket
    client = private.client()
    assert _released(client) == []  # nothing was tagged

    again = _build(private.host, ca_bundle, workdir)
    assert again.returncode == 0, again.stderr[-3000:]
    done = json.loads(again.stdout)
    assert done["result"] == "pass" and done["reused"] is False
    assert done["stages"]["build"]["steps"] >= 9 and done["stages"]["verify"]["overall"] == "pass"
    assert client.images.get(done["tags"][0]).id == done["image_id"]
    assert _released(client) == sorted(done["tags"])


@pytest.mark.fault
@pytest.mark.docker
@pytest.mark.network
@pytest.mark.slow
def test_the_engine_dies_during_the_gate(private: Private, ca_bundle: Path, tmp_path: Path
                                         ) -> None:
    # another site CA file (one more blank line): another label, so another image than the
    # previous test's; every earlier step comes from the build cache
    bundle = tmp_path / "site-ca.pem"
    bundle.write_bytes(ca_bundle.read_bytes() + b"\n")
    workdir = tmp_path / "build"
    client = private.client()
    proc = _popen(private.host, *_args(bundle, workdir))
    deadline = time.monotonic() + TIMEOUT
    gate: list = []
    while not gate:
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = proc.communicate()
            pytest.fail(f"no gate container came (exit {proc.returncode}):\n{err[-3000:]}")
        gate = client.containers.list(filters={"label": f"{OWNER_LABEL}=verify",
                                               "status": "running"})
        time.sleep(0.2)
    name = gate[0].name
    private.kill()  # the self-test runs in the gate container: SIGKILL to dockerd's PID
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 3, err[-3000:]
    [error] = _errors(err)
    assert error.startswith(f"error: verify: [{TARGET}] the Docker Engine at {private.host} "
                            f"stopped answering during the gate's self-test container {name} "
                            "(image sha256:"), error
    assert "no verdict was recorded and nothing was tagged" in error, error
    assert "stays in the engine, untagged" in error, error
    report = json.loads((workdir / "report.json").read_text())
    candidate = report["image_id"]
    assert report["result"] == "error" and report["tags"] == [] and candidate
    assert report["verification"] is None and "stopped answering" in report["error"]
    assert verdicts.lookup(candidate) is None  # no verdict, let alone a passing one

    private.restart()
    client = private.client()
    assert client.images.get(candidate).tags == []  # the candidate is left untagged
    left = client.containers.list(all=True, filters={"label": OWNER_LABEL})
    assert [c.name for c in left] == [name]  # the dead run's gate container, stopped
    assert left[0].status == "exited"

    again = _build(private.host, bundle, workdir)
    assert again.returncode == 0, again.stderr[-3000:]
    done = json.loads(again.stdout)
    assert done["result"] == "pass" and done["stages"]["verify"]["overall"] == "pass"
    assert done["image_id"] == candidate  # rebuilt from the cache: the same image, now gated
    assert client.images.get(done["tags"][0]).id == candidate
    recorded = verdicts.lookup(candidate)
    assert recorded is not None and recorded.overall == "pass"
    assert f"removed containers of runs that died: {name}" in again.stderr
    assert client.containers.list(all=True, filters={"label": OWNER_LABEL}) == []


# --------------------------------------------------------------------------- disk full


@pytest.fixture
def small_fs() -> Iterator[Path]:
    """An ext4 filesystem on a loop device (a sparse 8 GiB file), mounted for the test only."""
    if os.geteuid() != 0:
        pytest.skip("mounting a loop filesystem needs root")
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if not shutil.which(tool):
            pytest.skip(f"no {tool}")
    work = Path(tempfile.mkdtemp(prefix="verl-env-fullfs-", dir="/var/tmp"))
    image, mnt = work / "fs.img", work / "mnt"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(8 << 30)
    made = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True,
                          text=True)
    if made.returncode != 0:
        shutil.rmtree(work)
        pytest.skip(f"no loop device: {made.stderr.strip()}")
    dev = made.stdout.strip()
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-i", "65536", dev], check=True,
                       capture_output=True)
        subprocess.run(["mount", dev, str(mnt)], check=True, capture_output=True)
        try:
            yield mnt
        finally:
            if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    finally:
        subprocess.run(["losetup", "-d", dev], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.fault
@pytest.mark.docker
@pytest.mark.network
@pytest.mark.slow
def test_the_engines_data_root_fills_up_during_the_build(debian_base: str, ca_bundle: Path,
                                                         small_fs: Path, tmp_path: Path) -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    data_root = small_fs / "data"
    d = start_dockerd(data_root=data_root)
    try:
        import_debian_base(d.host, debian_base)
        # everything but ~400 MB taken: the base fits, the fixture's torch layer does not
        filler = small_fs / "filler"
        with open(filler, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, shutil.disk_usage(small_fs).free - (400 << 20))
        workdir = tmp_path / "build"
        full = _build(d.host, ca_bundle, workdir)
        assert full.returncode == 3, full.stderr[-3000:]
        [error] = _errors(full.stderr)
        assert re.match(rf"error: build: \[{TARGET}\] the Docker Engine at {re.escape(d.host)} "
                        rf"ran out of space in the data root {re.escape(str(data_root))} during "
                        r"the build, at step (\S+ )?\d+/\d+ \(RUN ", error), error
        assert re.search(r"the engine said: '.*(no space left on device|os error 28)", error,
                         re.IGNORECASE), error
        assert re.search(r"\. \d+(\.\d)? (B|KiB|MiB) free there now", error), error
        assert "Nothing was tagged" in error and "run the same command again" in error, error
        report = json.loads((workdir / "report.json").read_text())
        assert report["result"] == "error" and report["tags"] == [] and report["image_id"] is None
        client = docker.DockerClient(base_url=d.host, timeout=120)
        assert _released(client) == []

        filler.unlink()  # the space is freed
        again = _build(d.host, ca_bundle, workdir)
        assert again.returncode == 0, again.stderr[-3000:]
        done = json.loads(again.stdout)
        assert done["result"] == "pass" and done["stages"]["verify"]["overall"] == "pass"
        assert done["stages"]["build"]["cache_hits"] >= 1  # the steps before the full one
        assert _released(client) == sorted(done["tags"])
    finally:
        d.stop()


# --------------------------------------------------------------------------- two runs at once


@pytest.mark.fault
@pytest.mark.docker
@pytest.mark.network
@pytest.mark.slow
def test_two_builds_of_one_target_at_once(cpu_image: dict, docker_host: str, ca_bundle: Path,
                                          tmp_path: Path) -> None:
    prefix = "verl-env-twice"  # a content tag of its own: the first run builds (cached) and gates
    args = ["--tag-prefix", prefix, "--json"]
    first = _popen(docker_host, *_args(ca_bundle, tmp_path / "one", CPU_TARGET, CPU_FIXTURE),
                   *args)
    holder = f"pid {first.pid}: build of {CPU_TARGET}"
    deadline = time.monotonic() + 120
    while not any(holder in p.read_text(errors="replace")
                  for p in runlock.locks_dir().glob("*.lock")):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1]
        time.sleep(0.1)
    second = _popen(docker_host, *_args(ca_bundle, tmp_path / "two", CPU_TARGET, CPU_FIXTURE),
                    *args)
    client = docker.DockerClient(base_url=docker_host)
    try:
        out1, err1 = first.communicate(timeout=TIMEOUT)
        out2, err2 = second.communicate(timeout=TIMEOUT)
        assert first.returncode == 0, err1[-3000:]
        assert second.returncode == 0, err2[-3000:]
        one, two = json.loads(out1), json.loads(out2)
        print("\n".join(line for line in err2.splitlines() if "waiting" in line))
        assert f"build-env: waiting for {holder}" in err2
        assert one["reused"] is False and one["stages"]["build"]["steps"] > 10
        assert one["stages"]["verify"]["overall"] == "pass"
        assert two["reused"] is True and two["image_id"] == one["image_id"]
        assert two["tags"] == one["tags"] and two["stages"]["verify"]["reused"]
        # the content tag names one image, the one the first run verified
        assert {image.id for image in client.images.list(name=prefix)} == {one["image_id"]}
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for image in client.images.list(name=prefix):
            for tag in image.tags:
                if tag.startswith(prefix + ":"):
                    client.images.remove(tag, noprune=True)
