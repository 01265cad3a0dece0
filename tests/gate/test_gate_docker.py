"""The gate on a real Docker Engine, against images derived from the CPU fixture image.

Each test verifies its own derived image (a distinct image ID), so the verdicts recorded here never
touch the fixture image's own verdict that other tests rely on.
"""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from builder.gate import verdicts
from builder.engine import OWNER_LABEL, Engine
from builder.errors import EngineError
from builder.gate.plan import HOST_DEV_ENV, expected_gpus
from tests.conftest import run_build_env
from tests.support.engine_probe import leftover_containers

pytestmark = [pytest.mark.docker, pytest.mark.network]


@pytest.fixture(scope="module")
def client(docker_host: str) -> docker.DockerClient:
    return docker.from_env()


@pytest.fixture(scope="module")
def derive(gate_base: str, client: docker.DockerClient):
    """Build ``FROM <fixture image>`` plus some lines; returns the new image ID."""
    made: list[str] = []

    def build(tag: str, lines: str) -> str:
        text = f"FROM {gate_base}\n{lines}\n"
        image, _ = client.images.build(fileobj=io.BytesIO(text.encode()), tag=tag, rm=True,
                                       network_mode="none")
        made.append(tag)
        return str(image.id)

    yield build
    for tag in made:
        client.images.remove(tag, force=True)


# Per-phase timeout for full runs: this machine is shared and often loaded (a safe argument:
# the verdict stays a release one).
SLOW = ("--selftest-args", "--timeout 600")


def _verify(*args: str, env: dict[str, str] | None = None, out: Path) -> tuple[int, dict, str]:
    proc = run_build_env("verify", *args, "--report", str(out), env=env, timeout=1800)
    report = json.loads(out.read_text()) if out.exists() else {}
    return proc.returncode, report, proc.stdout + proc.stderr


def _check(report: dict, cid: str) -> dict:
    return next(c for c in report["checks"] if c["id"] == cid)


def test_expected_gpu_on_the_cpu_image_fails(derive, tmp_path: Path) -> None:
    image = derive("verl-env-test/gate:expect", "LABEL org.verl-env.test=expect")
    rc, report, out = _verify(image, "--expect-gpus", "1", *SLOW, out=tmp_path / "r.json")
    assert rc == 1, out
    assert report["overall"] == "fail"
    count = _check(report, "gpu.device_count")
    assert count["status"] == "fail" and count["required"] and "1 expected" in count["reason"]
    gpus = report["gate"]["gpus"]
    assert gpus["expected"] == 1 and gpus["source"] == "--expect-gpus"
    assert gpus["in_image"] == {"count": 0, "reason": "GPUs torch sees inside the container"}
    assert report["gate"]["scope"] == "release"  # a full run: its fail is the verdict
    assert not verdicts.is_verified(image)
    assert "overall is 'fail', not 'pass'" in (verdicts.release_problem(verdicts.lookup(image)) or "")
    assert "GPUs expected: 1" in out


def _tree(root: Path, names: list[str]) -> Path:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    return root


def test_host_gpus_are_counted_through_the_engine(gate_base: str, docker_host: str,
                                                  tmp_path: Path) -> None:
    engine = Engine.connect()
    image = gate_base
    nvidia = _tree(tmp_path / "nv", ["nvidia0", "nvidia1", "nvidia3", "nvidiactl", "nvidia-uvm",
                                     "nvidia-modeset", "nvidia-caps/nvidia-cap1"])
    amd = _tree(tmp_path / "amd", ["kfd", "dri/renderD128", "dri/renderD129", "dri/card0",
                                   "dri/card1"])
    no_kfd = _tree(tmp_path / "nokfd", ["dri/renderD128"])
    plan = expected_gpus(engine, image, "cuda", image_arch="amd64", dev_root=str(nvidia))
    assert (plan.expected, plan.host_count, plan.source) == (3, 3, "engine host")
    assert plan.host_devices == ("nvidia0", "nvidia1", "nvidia3")  # nvidiactl etc. not listed
    plan = expected_gpus(engine, image, "rocm", image_arch="amd64", dev_root=str(amd))
    assert (plan.expected, plan.vendor) == (2, "amd")
    assert expected_gpus(engine, image, "rocm", image_arch="amd64",
                         dev_root=str(no_kfd)).expected == 0
    # an emulated image is not probed: 0, with the reason
    emu = expected_gpus(engine, image, "cuda", image_arch="arm64", dev_root=str(nvidia))
    assert emu.expected == 0 and emu.source == "emulated" and emu.host_count is None
    # a device root missing on the daemon's host is an error, and is not created there
    missing = tmp_path / "no-such-dev"
    with pytest.raises(EngineError, match="does not exist"):
        expected_gpus(engine, image, "cuda", image_arch="amd64", dev_root=str(missing))
    assert not missing.exists()
    # the probe left no container behind
    assert leftover_containers(engine) == []


def test_gpus_the_host_shows_but_the_image_cannot_see_fail(derive, tmp_path: Path) -> None:
    """The fail-open case of the issue: the host has GPUs, torch in the image sees none."""
    image = derive("verl-env-test/gate:cuda-label", "LABEL org.verl-env.accelerator=cuda")
    tree = _tree(tmp_path / "dev", ["nvidia0", "nvidia1", "nvidiactl"])
    rc, report, out = _verify(image, "--gpus", "none", *SLOW, env={HOST_DEV_ENV: str(tree)},
                              out=tmp_path / "r.json")
    assert rc == 1, out
    gpus = report["gate"]["gpus"]
    assert (gpus["expected"], gpus["host_count"], gpus["source"]) == (2, 2, "engine host")
    assert gpus["dev_root"] == str(tree) and gpus["in_image"]["count"] == 0
    assert "2 nvidia GPU(s)" in gpus["reason"]
    assert _check(report, "gpu.device_count")["status"] == "fail"
    assert not any(c["status"] == "skip" and c["id"] == "gpu.device_count"
                   for c in report["checks"])
    assert not verdicts.is_verified(image)


def test_narrowed_run_is_partial_and_unlocks_nothing(derive, tmp_path: Path) -> None:
    image = derive("verl-env-test/gate:partial", "LABEL org.verl-env.test=partial")
    rc, report, out = _verify(image, "--selftest-args", "--phases preflight",
                              out=tmp_path / "r.json")
    assert rc == 0 and report["overall"] == "pass", out
    gate = report["gate"]
    assert gate["scope"] == "partial" and gate["phases"] == ["preflight"]
    assert gate["selftest_args"] == ["--phases", "preflight"]
    assert "partial verdict, unlocks no tag, SIF or publish" in out
    assert not verdicts.is_verified(image)
    why = verdicts.release_problem(verdicts.lookup(image)) or ""
    assert "partial" in why and "env,imports,versions,abi,cpu,ray not run" in why
    recorded = verdicts.lookup(image)
    assert recorded is not None and recorded.scope == "partial" and recorded.level is None
    # verify's own --phases narrows the same way
    rc, report, out = _verify(image, "--phases", "preflight,env", out=tmp_path / "r2.json")
    assert rc == 0 and report["gate"]["scope"] == "partial", out
    # bad self-test arguments are refused before anything runs
    proc = run_build_env("verify", image, "--selftest-args", "--expect-gpus 3")
    assert proc.returncode != 0 and "use verify's --expect-gpus" in proc.stderr


def _watch(client: docker.DockerClient, stop: threading.Event, seen: dict[str, Any]) -> None:
    while not stop.is_set():
        try:  # the SDK inspects each listed container: one removed in between is NotFound
            listed = client.containers.list(all=True, filters={"label": OWNER_LABEL})
        except docker.errors.NotFound:  # (CI 2026-11-30: it ended the watch before the gate ran)
            listed = []
        for c in listed:
            try:
                seen.setdefault(c.id, c.attrs)
            except docker.errors.NotFound:
                pass
        time.sleep(0.1)


def test_shell_entrypoint_image_verifies_with_no_bind_mount(derive, client: docker.DockerClient,
                                                            tmp_path: Path) -> None:
    image = derive("verl-env-test/gate:sh-entrypoint", 'ENTRYPOINT ["sh"]\nCMD ["-c", "exit 7"]')
    # the image as a vendor ships it: a plain run starts its shell, which exits 7
    with pytest.raises(docker.errors.ContainerError, match="exit status 7"):
        client.containers.run(image, remove=True, network_mode="none")
    seen: dict[str, Any] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(client, stop, seen), daemon=True)
    watcher.start()
    try:
        rc, report, out = _verify(image, *SLOW, out=tmp_path / "r.json")
    finally:
        stop.set()
        watcher.join()
    assert rc == 0 and report["overall"] == "pass", out
    assert report["gate"]["scope"] == "release" and report["gate"]["bind_mounts"] == []
    assert report["gate"]["selftest_args"] == ["--timeout", "600"]
    assert verdicts.is_verified(image) and verdicts.release_problem(verdicts.lookup(image)) is None
    # a cpu image's full run: a build verdict with no GPU phase pending
    assert ": pass, build verdict (" in out and "gpu:" not in out, out
    recorded = verdicts.lookup(image)
    assert recorded is not None and recorded.level == "build" and recorded.gpu.status == "none"
    # the verification container, seen while it ran: entrypoint replaced, nothing bind-mounted
    assert seen, "the verification container was never seen"
    for attrs in seen.values():
        assert attrs["Config"]["Entrypoint"][:2] == ["/bin/sh", "-c"]
        assert attrs["Config"]["Cmd"][:2] == ["--json", "/verl-env-out/report.json"]
        assert not attrs["HostConfig"].get("Binds") and not attrs["HostConfig"].get("Mounts")
        assert attrs["Mounts"] == []
    assert client.containers.list(all=True, filters={"label": OWNER_LABEL}) == []


def test_files_go_in_and_out_through_the_engine(derive, docker_host: str) -> None:
    """Copied in as root, readable and writable by an image that runs as another user."""
    image = derive("verl-env-test/gate:user", "USER 1000:1000")
    engine = Engine.connect()
    res = engine.run(image, ["-c", "id -u > /out/uid; cat /in/deep/a.txt >> /out/uid"],
                     entrypoint=["/bin/sh"], timeout=120, files={"/in/deep/a.txt": b"hello\n"},
                     dirs=["/out"], collect=["/out/uid", "/out/missing"])
    assert res.exit_code == 0, res.logs
    assert res.files == {"/out/uid": b"1000\nhello\n"}
    assert leftover_containers(engine) == []
