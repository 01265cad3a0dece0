"""`build-env doctor` against real occupied ports, real read-only and small mounts, a fake sysfs
tree, and real process affinity."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from builder.cluster import doctor
from builder.cli import main
from builder.cluster.doctor import FAIL, OK, SKIP, WARN, Finding, run_doctor
from builder.cluster.ports import RayPorts
from tests.slurm.conftest import free_port_block

REPO = Path(__file__).resolve().parents[2]


def by_id(findings: list[Finding], fid: str) -> Finding:
    [found] = [f for f in findings if f.id == fid]
    assert found.status == OK or found.fix, f"{fid}: a {found.status} finding needs a fix line"
    return found


def free_ports() -> RayPorts:
    b = free_port_block(40)
    return RayPorts(gcs=b, dashboard=b + 1, client=b + 2, node_manager=b + 3, object_manager=b + 4,
                    runtime_env_agent=b + 5, dashboard_agent_grpc=b + 6, metrics_export=b + 7,
                    dashboard_agent_listen=b + 8, min_worker=b + 20, max_worker=b + 29)


@contextmanager
def mounted(target: Path, options: str) -> Iterator[Path]:
    """A tmpfs we mount for the test and always unmount."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    target.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


def test_taken_ports_fail_and_free_ports_pass() -> None:
    ports = free_ports()
    assert by_id(doctor.check_ports(ports), "ports.ray").status == OK
    listening = socket.socket()
    listening.bind(("127.0.0.1", ports.gcs))  # an old Ray GCS / Redis on 6379
    listening.listen()
    bound = socket.socket()
    bound.bind(("0.0.0.0", ports.dashboard))  # bound, not listening
    worker = socket.socket()
    worker.bind(("0.0.0.0", ports.min_worker + 3))
    try:
        findings = doctor.check_ports(ports)
    finally:
        for sock in (listening, bound, worker):
            sock.close()
    ray = by_id(findings, "ports.ray")
    assert ray.status == FAIL
    assert f"{ports.gcs} (gcs)" in ray.message and f"{ports.dashboard} (dashboard)" in ray.message
    assert str(ports.client) not in ray.message
    workers = by_id(findings, "ports.ray_workers")
    assert workers.status == WARN and f"1 of {ports.min_worker}-{ports.max_worker}" in workers.message


def test_whole_worker_range_taken_fails() -> None:
    ports = free_ports()
    held = []
    try:
        for port in ports.worker_range():
            sock = socket.socket()
            sock.bind(("0.0.0.0", port))
            held.append(sock)
        assert by_id(doctor.check_ports(ports), "ports.ray_workers").status == FAIL
    finally:
        for sock in held:
            sock.close()


def test_hf_cache_on_read_only_mount_fails(tmp_path: Path) -> None:
    with mounted(tmp_path / "ro", "ro,size=1m") as ro:
        found = by_id(doctor.check_hf_cache(ro / "hf"), "env.hf_cache")
        assert found.status == FAIL and "cannot be created" in found.message
        found = by_id(doctor.check_hf_cache(ro), "env.hf_cache")
        assert found.status == FAIL


def test_hf_cache_under_a_file_fails_and_writable_passes(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    assert by_id(doctor.check_hf_cache(tmp_path / "file" / "hf"), "env.hf_cache").status == FAIL
    (tmp_path / "hf").mkdir()
    assert by_id(doctor.check_hf_cache(tmp_path / "hf"), "env.hf_cache").status == OK
    assert list((tmp_path / "hf").iterdir()) == []  # the probe file is gone


def test_small_shm_fails(tmp_path: Path) -> None:
    with mounted(tmp_path / "shm", "size=256m") as shm:
        found = by_id(doctor.check_shm(shm), "preflight.shm")
    assert found.status == FAIL and "0.25 GiB" in found.message and found.fix


def fake_sysfs(root: Path, ports: dict[str, str], nets: tuple[str, ...] = ("lo", "eth0", "ib0")) -> Path:
    for spec, state in ports.items():
        dev, port = spec.split(":")
        path = root / "class" / "infiniband" / dev / "ports" / port
        path.mkdir(parents=True)
        (path / "state").write_text(state + "\n")
    for net in nets:
        (root / "class" / "net" / net).mkdir(parents=True)
    return root


def test_infiniband_port_states(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path / "a", {"mlx5_0:1": "4: ACTIVE", "mlx5_1:1": "1: DOWN"})
    found = by_id(doctor.check_infiniband(sysfs), "ib.ports")
    assert found.status == FAIL and "mlx5_1 port 1: 1: DOWN" in found.message
    assert "mlx5_0" not in found.message
    sysfs = fake_sysfs(tmp_path / "b", {"mlx5_0:1": "4: ACTIVE"})
    assert by_id(doctor.check_infiniband(sysfs), "ib.ports").status == OK
    assert by_id(doctor.check_infiniband(tmp_path / "none"), "ib.ports").status == SKIP


@pytest.mark.parametrize("env, status", [
    ({}, OK),
    ({"NCCL_IB_HCA": "mlx5_0:1"}, OK),
    ({"NCCL_IB_HCA": "mlx5"}, OK),  # prefix match, as NCCL does
    ({"NCCL_IB_HCA": "=mlx5"}, FAIL),  # exact match
    ({"NCCL_IB_HCA": "mlx5_9"}, FAIL),
    ({"NCCL_IB_HCA": "^mlx5_9"}, OK),  # exclusion lists name what to avoid
    ({"NCCL_SOCKET_IFNAME": "ib"}, OK),
    ({"NCCL_SOCKET_IFNAME": "bond0"}, FAIL),
    ({"NCCL_SOCKET_IFNAME": "^docker,lo"}, OK),
    ({"GLOO_SOCKET_IFNAME": "ib0"}, OK),
    ({"GLOO_SOCKET_IFNAME": "ib1"}, FAIL),
    ({"NCCL_IB_DISABLE": "1"}, FAIL),
])
def test_nccl_variables_against_devices(env: dict[str, str], status: str, tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path, {"mlx5_0:1": "4: ACTIVE"})
    assert by_id(doctor.check_nccl_env(env, sysfs), "nccl.env").status == status


@pytest.mark.parametrize("env, status", [
    ({}, OK),
    ({"HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"}, OK),
    ({"HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "2,3"}, FAIL),
    ({"ROCR_VISIBLE_DEVICES": "0"}, FAIL),
])
def test_visible_devices(env: dict[str, str], status: str) -> None:
    """The self-test's own environment checks, same ids and words, with the doctor's fix."""
    found = doctor.check_visible_devices(env)
    assert [f.id for f in found] == ["env.hip_cuda_visible_devices", "env.rocr_visible_devices"]
    assert max((f.status for f in found), key=[OK, WARN, FAIL].index) == status
    assert all(f.fix for f in found if f.status != OK)


@pytest.mark.parametrize("env, status", [
    ({}, OK),
    ({"RAY_DEBUG": "1"}, OK),
    ({"RAY_DEBUG_POST_MORTEM": "1"}, WARN),
    ({"RAY_DEBUG": "legacy", "RAY_DEBUG_POST_MORTEM": "1"}, FAIL),
])
def test_ray_debug_conflicts(env: dict[str, str], status: str) -> None:
    assert by_id(doctor.check_ray_debug(env), "env.ray_debug").status == status


@pytest.mark.skipif(shutil.which("ch-run") is None, reason="ch-run not installed (charliecloud-runtime)")
def test_real_chrun_version_without_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("USER", raising=False)
    found = by_id(doctor.check_runtime("ch-run"), "runtime")
    assert found.status == OK and re.search(r"ch-run: \d+\.\d+", found.message), found


def test_runtime_present_and_missing(standin_runtime: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{standin_runtime}:{os.environ['PATH']}")
    found = by_id(doctor.check_runtime("apptainer"), "runtime")
    assert found.status == OK and "apptainer version 0.0.0-standin" in found.message
    assert by_id(doctor.check_runtime("no-such-runtime-xyz"), "runtime").status == FAIL


def test_runtime_pyxis_needs_the_plugin_and_enroot(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """--runtime pyxis: srun must know --container-image, and enroot must run."""
    def tool(name: str, body: str) -> None:
        (tmp_path / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / name).chmod(0o755)

    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    tool("srun", "echo '      --overlap   share resources'")
    found = by_id(doctor.check_runtime("pyxis"), "runtime")
    assert found.status == FAIL and "pyxis is not loaded" in found.message
    tool("srun", "echo '      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH'")
    found = by_id(doctor.check_runtime("pyxis"), "runtime")
    assert found.status == FAIL and "enroot is not on PATH" in found.message
    tool("enroot", '[ "$1" = version ] && echo 4.1.2')
    found = by_id(doctor.check_runtime("pyxis"), "runtime")
    assert found.status == OK and "enroot 4.1.2" in found.message


def test_cpu_limits_from_slurm_and_affinity() -> None:
    total = os.cpu_count() or 1
    env = {"SLURM_CPUS_ON_NODE": str(total)}
    assert by_id(doctor.check_cpus(env), "slurm.cpus").status == OK
    if total < 2:
        pytest.skip("one CPU: no smaller limit to test")
    found = by_id(doctor.check_cpus({"SLURM_CPUS_ON_NODE": "1"}), "slurm.cpus")
    assert found.status == WARN and "--num-cpus=1" in found.fix
    # a real affinity mask narrower than the machine (as a Slurm cgroup/cpuset gives)
    code = ("import os, sys; sys.path.insert(0, %r); os.sched_setaffinity(0, {0}); "
            "from builder.cluster import doctor; f = doctor.check_cpus({})[0]; print(f.status, f.fix)")
    out = subprocess.run([sys.executable, "-c", code % str(REPO)], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("warn") and "--num-cpus=1" in out


def _routable_interface() -> tuple[str, str] | None:
    for _, name in socket.if_nameindex():
        addr = doctor._ipv4_of(name)
        if addr and not addr.startswith("127."):
            return name, addr
    return None


def test_interface_checks() -> None:
    sysfs = Path("/sys")
    found = by_id(doctor.check_interface("lo", sysfs), "net.interface")
    assert found.status == FAIL and "loopback" in found.message
    found = by_id(doctor.check_interface("nosuch0", sysfs), "net.interface")
    assert found.status == FAIL and "lo" in found.message
    routable = _routable_interface()
    if routable is None:
        pytest.skip("no interface with a routable IPv4 address on this host")
    found = by_id(doctor.check_interface(routable[0], sysfs), "net.interface")
    assert found.status == OK and routable[1] in found.message


def test_run_doctor_covers_every_area(tmp_path: Path) -> None:
    findings = run_doctor(interface="lo", hf_home=str(tmp_path / "hf"), runtime="no-such-rt",
                          ports=free_ports(), env={"RAY_DEBUG_POST_MORTEM": "1"})
    ids = [f.id for f in findings]
    assert ids == ["ports.ray", "ports.ray_workers", "ports.ephemeral", "net.interface", "ib.ports",
                   "nccl.env", "env.hip_cuda_visible_devices", "env.rocr_visible_devices",
                   "env.ray_debug", "env.hf_cache", "preflight.shm", "preflight.infiniband",
                   "preflight.memlock", "gpu.driver", "runtime", "slurm.cpus"]
    assert all(f.status in (OK, WARN, FAIL, SKIP) for f in findings)
    assert all(f.fix for f in findings if f.status != OK)


def test_cli_exit_codes_and_json(tmp_path: Path, standin_runtime: Path,
                                 monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    routable = _routable_interface()
    if routable is None:
        pytest.skip("no interface with a routable IPv4 address on this host")
    ports = free_ports()
    monkeypatch.setattr(doctor, "RayPorts", lambda: ports)  # the host's 6379 may be someone's
    monkeypatch.setenv("PATH", f"{standin_runtime}:{os.environ['PATH']}")
    for var in ("RAY_DEBUG", "RAY_DEBUG_POST_MORTEM", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_DISABLE"):
        monkeypatch.delenv(var, raising=False)
    ok = ["--interface", routable[0], "--hf-home", str(tmp_path / "hf")]
    assert main(["doctor", *ok, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["summary"]["fail"] == 0
    assert report["schema"] == "verl-env/doctor/v1"
    assert {"id", "status", "message", "fix"} <= set(report["findings"][0])
    held = socket.socket()
    held.bind(("0.0.0.0", ports.gcs))
    held.listen()
    try:
        assert main(["doctor", *ok]) == 1
    finally:
        held.close()
    text = capsys.readouterr().out
    assert "[FAIL] ports.ray" in text and "fix: stop the old Ray/Redis" in text


def test_driver_against_the_targets_cuda_and_rdma_limits() -> None:
    """The node checks a GPU node needs, shared with the self-test: the driver against the
    target's CUDA (none here: a fail naming libcuda, never a pass), /dev/infiniband, memlock."""
    [driver] = doctor.check_driver("13.0", "cuda")
    assert driver.id == "gpu.driver" and driver.status == FAIL and "libcuda" in driver.message
    assert "R580" in driver.fix
    [unnamed] = doctor.check_driver(None, None)
    assert unnamed.status == SKIP and "--target" in unnamed.fix
    ib, memlock = doctor.check_memlock_and_rdma("/nonexistent/infiniband")
    assert ib.id == "preflight.infiniband" and ib.status == SKIP
    assert memlock.id == "preflight.memlock" and memlock.status in (OK, WARN)


def test_doctor_cli_takes_the_target_from_the_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    from builder.cli import main

    code = main(["doctor", "--target", "cuda-x86_64", "--interface", "lo", "--json"])
    report = json.loads(capsys.readouterr().out)
    driver = next(f for f in report["findings"] if f["id"] == "gpu.driver")
    assert code == 1 and driver["status"] == FAIL  # no NVIDIA driver on this machine
