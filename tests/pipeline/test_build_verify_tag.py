"""The main job on a real Docker Engine: build -> verify inside -> tag only on pass.

The fixture target is a real CPU-only verl environment (torch CPU, Ray, tensordict, verl) built
FROM a debootstrapped Debian base; the package index is reached through the injected CA bundle.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import docker
import pytest

from tests.conftest import OUTSIDE, REPO, installed_build_env, run_build_env

pytestmark = [pytest.mark.docker, pytest.mark.network]
FIXTURE = str(REPO / "tests/fixtures/cpu.yaml")


@pytest.fixture(scope="module")
def client(docker_host: str) -> docker.DockerClient:
    return docker.from_env()


def _checks(report: dict) -> dict[str, dict]:
    return {c["id"]: c for c in report["verification"]["checks"]}


def _no_containers(client: docker.DockerClient, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = [c.name for c in client.containers.list(all=True)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_fixture_is_built_verified_and_tagged(cpu_image: dict, client: docker.DockerClient
                                              ) -> None:
    assert cpu_image["result"] == "pass"
    assert cpu_image["tags"][-1] == "verl-env:cpu-x86_64"
    assert cpu_image["tags"][0].startswith("verl-env:cpu-x86_64-verl0.9.1-")
    image = client.images.get("verl-env:cpu-x86_64")
    assert image.id == cpu_image["image_id"]
    labels = image.labels
    assert labels["org.verl-env.pin.verl"] == "0.9.1"
    assert labels["org.verl-env.pin.torch"] == "2.13.0+cpu"
    assert labels["org.verl-env.lock-hash"] == cpu_image["lock_hash"]
    assert labels["org.verl-env.site-ca"].startswith("sha256:")
    checks = _checks(cpu_image)
    for cid in ("imports.verl", "imports.torch", "imports.ray", "versions.pin.verl",
                "versions.verl_requires", "cpu.tensordict_membership", "cpu.gloo_allreduce",
                "ray.local_start"):
        assert checks[cid]["status"] == "pass", checks[cid]
    # GPU checks did not run here: reported as skip with a reason, never as pass
    gpu = [c for c in checks.values() if c["phase"] in ("gpu", "collective")]
    assert gpu and all(c["status"] == "skip" and c["reason"] for c in gpu)
    stages = cpu_image["stages"]
    # built here, or (when an earlier fixture of the session built the same inputs, e.g. the gate
    # tests' base) found by its content tag and reused, never rebuilt under the same name
    build = stages["build"]
    assert build.get("steps", 0) > 10 or build.get("reused") == cpu_image["tags"][0], build
    assert stages["verify"]["overall"] == "pass"
    # a cpu image's full run: a build verdict, nothing pending (no GPU phase applies)
    assert stages["verify"]["level"] == "build" and stages["verify"]["gpu"] == "none"
    assert _no_containers(client) == []


def test_no_change_run_neither_builds_nor_reverifies(cpu_image: dict, ca_bundle: Path,
                                                     tmp_path: Path) -> None:
    proc = run_build_env("--target", "cpu-x86_64", "--matrix", FIXTURE, "--ca-bundle",
                         str(ca_bundle), "--workdir", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["image_id"] == cpu_image["image_id"] and report["reused"] is True
    assert report["content_hash"] == cpu_image["content_hash"]
    assert report["stages"]["build"] == {"seconds": 0.0, "reused": cpu_image["tags"][0]}
    assert "reused" in report["stages"]["verify"]
    assert report["stages"]["verify"]["level"] == "build"
    assert report["tags"] == cpu_image["tags"]


def test_content_tag_never_moves(cpu_image: dict, debian_base: str, ca_bundle: Path,
                                 tmp_path: Path, client: docker.DockerClient) -> None:
    """A content name found on an image without a release verdict is verified, never rebuilt
    or re-pointed; when that image fails the gate the name stays where it was."""
    base_id = client.images.get(debian_base).id
    content = cpu_image["tags"][0]
    client.images.get(base_id).tag(*content.split(":"))
    try:
        proc = run_build_env("--target", "cpu-x86_64", "--matrix", FIXTURE, "--ca-bundle",
                             str(ca_bundle), "--workdir", str(tmp_path / "w"), "--json")
        assert proc.returncode == 1, proc.stderr
        report = json.loads(proc.stdout)
        assert report["image_id"] == base_id and report["tags"] == []
        assert "reuse" in proc.stderr and "verifying it" in proc.stderr
        assert client.images.get(content).id == base_id  # not rebuilt, not moved
        assert client.images.get("verl-env:cpu-x86_64").id == cpu_image["image_id"]
    finally:
        client.images.get(cpu_image["image_id"]).tag(*content.split(":"))
    assert client.images.get(content).id == cpu_image["image_id"]


def test_tag_once_refuses_to_move_a_name(cpu_image: dict, debian_base: str,
                                         docker_host: str) -> None:
    from builder.engine import Engine
    from builder.errors import EngineError

    engine = Engine.connect()
    content = cpu_image["tags"][0]
    engine.tag_once(cpu_image["image_id"], content)  # same image: a no-op
    with pytest.raises(EngineError, match="never moves"):
        engine.tag_once(engine.find(debian_base) or "", content)
    assert engine.find(content) == cpu_image["image_id"]


def test_wrong_pin_is_refused_and_tags_stay(cpu_image: dict, ca_bundle: Path, tmp_path: Path,
                                            client: docker.DockerClient) -> None:
    # a previous release of this target exists (here: the good image under its name)
    client.images.get(cpu_image["image_id"]).tag("verl-env", "cpu-x86_64-badimport")
    proc = run_build_env("--target", "cpu-x86_64-badimport", "--matrix", FIXTURE, "--ca-bundle",
                         str(ca_bundle), "--workdir", str(tmp_path))
    assert proc.returncode == 1, proc.stderr
    assert "imports.hydra-core" in proc.stderr and "no release tag applied" in proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["result"] == "fail" and report["tags"] == []
    bad = _checks(report)["imports.hydra-core"]
    assert bad["status"] == "fail" and "verl_env_no_such_module" in json.dumps(bad)
    # the previous release tag still points at the previous image; the candidate is gone
    assert client.images.get("verl-env:cpu-x86_64-badimport").id == cpu_image["image_id"]
    tags = {t for i in client.images.list() for t in i.tags}
    assert not any(t.startswith("verl-env:cpu-x86_64-badimport-verl") for t in tags)
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(report["image_id"])
    assert _no_containers(client) == []
    client.images.remove("verl-env:cpu-x86_64-badimport")


def test_keep_candidate(cpu_image: dict, ca_bundle: Path, tmp_path: Path,
                        client: docker.DockerClient) -> None:
    proc = run_build_env("--target", "cpu-x86_64-badimport", "--matrix", FIXTURE, "--ca-bundle",
                         str(ca_bundle), "--workdir", str(tmp_path), "--keep-candidate")
    assert proc.returncode == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["tags"] == ["verl-env:cpu-x86_64-badimport-candidate"]
    assert client.images.get(report["tags"][0]).id == report["image_id"]
    client.images.remove(report["tags"][0])


def _popen(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(installed_build_env()), *args], cwd=OUTSIDE, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy())


def _interrupt_when(proc: subprocess.Popen[str], ready, sig: int, timeout: float = 300) -> str:
    """Send ``sig`` to the running command once ``ready()`` holds; return its stderr."""
    deadline = time.monotonic() + timeout
    try:
        while not ready() and proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError("the command never reached the point to interrupt")
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(sig)
        return proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()


def _build_step_running(root: int) -> bool:
    """An apt-get or uv process among the descendants of ``root`` (a dockerd)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    stack, seen = [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            cmd = ""
        if pid != root and ("apt-get" in cmd or "uv pip install" in cmd):
            return True
        stack.extend(children.get(pid, []))
    return False


def test_interrupted_build_leaves_nothing(cpu_image: dict, debian_base: str, ca_bundle: Path,
                                          tmp_path: Path, client: docker.DockerClient,
                                          dockerd) -> None:
    # a different base forces a real (uncached) build; interrupt it inside a RUN step
    client.images.build(fileobj=__import__("io").BytesIO(
        f"FROM {debian_base}\nRUN echo other > /etc/verl-env-test\n".encode()),
        tag="verl-env-test/debian:other", network_mode="host", rm=True)
    before = {t for i in client.images.list() for t in i.tags}
    proc = _popen("--target", "cpu-x86_64", "--matrix", FIXTURE, "--ca-bundle", str(ca_bundle),
                  "--workdir", str(tmp_path), "--base-image", "verl-env-test/debian:other")
    # BuildKit runs RUN steps without Docker containers: wait for an install step's process
    # under this session's dockerd
    err = _interrupt_when(proc, lambda: _build_step_running(dockerd.proc.pid), signal.SIGINT)
    assert proc.returncode == 130, err
    assert _no_containers(client) == []
    after = {t for i in client.images.list() for t in i.tags}
    assert after == before  # no candidate, no release tag
    client.images.remove("verl-env-test/debian:other")


def test_interrupted_verification_leaves_nothing(cpu_image: dict, ca_bundle: Path,
                                                 tmp_path: Path, client: docker.DockerClient
                                                 ) -> None:
    before = {t: client.images.get(t).id for i in client.images.list() for t in i.tags}
    proc = _popen("--target", "cpu-x86_64", "--matrix", FIXTURE, "--ca-bundle", str(ca_bundle),
                  "--workdir", str(tmp_path), "--reverify")
    err = _interrupt_when(
        proc, lambda: client.containers.list(filters={"label": "org.verl-env.owner"}),
        signal.SIGTERM)
    assert proc.returncode == 143, err  # 128 + SIGTERM (docs/commands.md)
    assert _no_containers(client) == []
    after = {t: client.images.get(t).id for i in client.images.list() for t in i.tags}
    assert after == before
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["result"] == "interrupted" and report["tags"] == []


def test_verify_command_on_the_release_and_on_a_foreign_image(
        cpu_image: dict, debian_base: str, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = run_build_env("verify", "verl-env:cpu-x86_64", "--report", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(out.read_text())["overall"] == "pass"
    # an image this tool never built: the host's self-test is mounted in. Without a manifest
    # there is nothing to hold it to: an error (3) with a hint, never a pass
    proc = run_build_env("verify", debian_base)
    assert proc.returncode == 3 and "--target" in proc.stderr, proc.stdout + proc.stderr
    # held to the fixture target's pins, the bare Debian image fails (no torch, no verl)
    out2 = tmp_path / "foreign.json"
    proc = run_build_env("verify", debian_base, "--target", "cpu-x86_64", "--matrix", FIXTURE,
                         "--report", str(out2), "--json")
    report = json.loads(out2.read_text())
    assert json.loads(proc.stdout) == report  # --json prints what --report writes
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = {c["id"] for c in report["checks"] if c["status"] == "fail"}
    assert {"imports.verl", "imports.torch", "versions.pin.verl"} <= failed
    # and the release image passes when held to the same pins explicitly
    proc = run_build_env("verify", "verl-env:cpu-x86_64", "--target", "cpu-x86_64",
                         "--matrix", FIXTURE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_failing_build_step_is_surfaced(debian_base: str, ca_bundle: Path, tmp_path: Path,
                                          client: docker.DockerClient) -> None:
    before = {t for i in client.images.list() for t in i.tags}
    proc = run_build_env("--target", "cpu-x86_64-badapt", "--matrix", FIXTURE, "--ca-bundle",
                         str(ca_bundle), "--workdir", str(tmp_path))
    assert proc.returncode == 1
    line = next(x for x in proc.stderr.splitlines() if x.startswith("error:"))
    assert "[cpu-x86_64-badapt] build failed at step" in line and "apt-get" in line
    assert "verl-env-no-such-package" in proc.stderr  # the engine's own message is shown
    assert {t for i in client.images.list() for t in i.tags} == before
    assert _no_containers(client) == []
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["result"] == "error" and "build failed" in report["error"]


def test_several_targets_in_one_command(cpu_image: dict, ca_bundle: Path, tmp_path: Path,
                                        client: docker.DockerClient) -> None:
    """Targets run side by side; a failing one neither stops nor untags the other."""
    proc = run_build_env("build", "--target", "cpu-x86_64", "--target", "cpu-x86_64-badapt",
                         "--matrix", FIXTURE, "--ca-bundle", str(ca_bundle), "--workdir",
                         str(tmp_path), "--json")
    assert proc.returncode == 1, proc.stderr
    reports = json.loads(proc.stdout)
    assert reports["cpu-x86_64"]["result"] == "pass"
    assert reports["cpu-x86_64"]["tags"] == cpu_image["tags"]
    assert reports["cpu-x86_64-badapt"]["result"] == "error"
    assert "build failed" in reports["cpu-x86_64-badapt"]["error"]
    assert (tmp_path / "cpu-x86_64" / "report.json").is_file()
    assert (tmp_path / "cpu-x86_64-badapt" / "report.json").is_file()
    summary = [line for line in proc.stderr.splitlines() if line.startswith("cpu-x86_64")]
    assert len(summary) == 2 and "pass" in summary[0] and "error" in summary[1], proc.stderr
    assert client.images.get("verl-env:cpu-x86_64").id == cpu_image["image_id"]
    assert _no_containers(client) == []
