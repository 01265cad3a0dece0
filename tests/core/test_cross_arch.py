"""Cross-architecture pieces that need no engine: the QEMU binfmt_misc check, the gate's
architecture decision, the source-build check's verdicts and Ray's scaled startup deadlines."""

from __future__ import annotations

import struct
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from builder.engine import ContainerEngine, Engine, ImageInfo, emulation_problem
from builder.selftest.phases.cpu import decide_source_build, elf_machine
from builder.gate.plan import EMULATION_FACTOR, arch_plan, plan_selftest


def _binfmt(tmp: Path, handler: str | None) -> str:
    (tmp / "status").write_text("enabled\n")
    if handler is not None:
        (tmp / "qemu-aarch64").write_text(handler)
    return str(tmp)


def test_emulation_check_names_the_packages_and_the_flag(tmp_path: Path) -> None:
    unmounted = emulation_problem("aarch64", str(tmp_path / "none"))
    assert unmounted and "qemu-user-static binfmt-support" in unmounted
    assert "mount -t binfmt_misc binfmt_misc" in unmounted
    missing = emulation_problem("linux/arm64", _binfmt(tmp_path, None))
    assert missing and "qemu-aarch64" in missing and "update-binfmts --enable" in missing
    disabled = emulation_problem("arm64", _binfmt(tmp_path, "disabled\nflags: PF\n"))
    assert disabled and "disabled" in disabled
    no_f = emulation_problem("arm64", _binfmt(tmp_path, "enabled\ninterpreter /q\nflags: P\n"))
    assert no_f and "F (fix-binary)" in no_f
    assert emulation_problem("arm64", _binfmt(tmp_path, "enabled\ninterpreter /q\nflags: PF\n")
                             ) is None


@pytest.mark.parametrize("base_url, local", [
    ("http+docker://localhost", True),  # a unix socket: this machine's kernel runs the containers
    ("http+docker://ssh", False),  # ssh://build-node: another kernel, not checkable from here
    ("http://10.0.0.5:2375", False), ("https://build-node:2376", False)])
def test_only_a_local_engine_has_its_emulation_checked_here(base_url: str, local: bool) -> None:
    client = SimpleNamespace(api=SimpleNamespace(base_url=base_url))
    assert Engine(client).is_local() is local  # type: ignore[arg-type]


class _Engine(ContainerEngine):
    """An engine whose host has the architecture ``arch``."""

    def __init__(self, arch: str) -> None:
        self.arch = arch

    def daemon_arch(self) -> str:
        return self.arch


def _img(arch: str, label: str | None) -> ImageInfo:
    return ImageInfo("sha256:" + "ab" * 32, tags=("verl-env:cpu-arm64",), architecture=arch,
                     config={"Labels": {"org.verl-env.arch": label} if label else {}})


def test_gate_refuses_a_wrong_architecture_image() -> None:
    plan = arch_plan(_Engine("x86_64"), _img("amd64", "x86_64"), {"arch": "aarch64"})
    assert plan.refused and "verl-env:cpu-arm64" in plan.refused
    assert "sha256:abababab" in plan.refused and "amd64" in plan.refused
    assert "wants arm64" in plan.refused
    # the image's own label is the target when no manifest is given
    assert arch_plan(_Engine("x86_64"), _img("arm64", "x86_64"), None).refused


def test_emulation_is_detected_and_can_be_forced() -> None:
    plan = arch_plan(_Engine("x86_64"), _img("arm64", "aarch64"), None)
    assert plan.refused is None and plan.emulated is True
    assert plan.emulation_factor == EMULATION_FACTOR and plan.engine_host == "amd64"
    native = arch_plan(_Engine("x86_64"), _img("amd64", "x86_64"), None)
    assert native.emulated is False and native.emulation_factor == 1.0
    assert arch_plan(_Engine("x86_64"), _img("amd64", "x86_64"), None, True).emulated


def test_emulated_is_owned_by_verify_and_release_safe() -> None:
    from builder.errors import VerifyError

    with pytest.raises(VerifyError, match="--emulated is set by verify"):
        plan_selftest("cpu", ["--emulated", "10"])


def _elf(path: Path, machine: int) -> Path:
    path.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 11 + struct.pack("<H", machine) + b"\0" * 40)
    return path


def test_elf_machine(tmp_path: Path) -> None:
    assert elf_machine(str(_elf(tmp_path / "a.so", 183))) == 183
    assert elf_machine(str(_elf(tmp_path / "b.so", 62))) == 62
    (tmp_path / "c.so").write_bytes(b"not elf at all, but long enough")
    assert elf_machine(str(tmp_path / "c.so")) is None
    assert elf_machine(sys.executable) in (62, 183)


@pytest.mark.parametrize("modules,errors,smoke,smoke_error,status,words", [
    ({"ext._C": 183}, [], True, None, "pass", "returned True"),
    ({"ext._C": 183}, [], None, None, "pass", "1 compiled module"),
    ({"ext._C": 62}, [], True, None, "fail", "wrong architecture"),
    ({}, [], True, None, "fail", "no compiled module"),
    ({"ext._C": 183}, ["import ext._C failed: ImportError: x"], None, None, "fail", "ImportError"),
    ({"ext._C": 183}, [], False, None, "fail", "returned False"),
    ({"ext._C": 183}, [], None, "ext.verl_env_smoke() raised RuntimeError: y", "fail", "raised"),
])
def test_source_build_verdicts(modules: dict, errors: list, smoke: object,
                               smoke_error: str | None, status: str, words: str) -> None:
    c = decide_source_build("ext", "aarch64", modules, errors, smoke, smoke_error, "0.1.0")
    assert c.id == "cpu.source_build.ext" and c.status == status and words in c.reason


def test_ray_startup_deadlines_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait behind "The current node timed out during startup" gets the scaled default."""
    from builder.selftest.phases import rayphase

    seen = {}

    def wait_for_node(gcs_address: str, socket: str, timeout: float = 30) -> None:
        seen["timeout"] = timeout

    calls = []

    def get_node(gcs_address: str, node_id: str) -> dict:
        calls.append(node_id)
        if len(calls) < 3:  # the raylet registers late under emulation
            raise RuntimeError("node not found")
        return {"node_id": node_id}

    services = types.ModuleType("ray._private.services")
    services._timeout = 30  # type: ignore[attr-defined]
    services.wait_for_node = wait_for_node  # type: ignore[attr-defined]
    services.get_node = get_node  # type: ignore[attr-defined]
    monkeypatch.setattr(rayphase.time, "sleep", lambda s: None)
    monkeypatch.setattr(rayphase, "raylet_alive", lambda: True)
    private = types.ModuleType("ray._private")
    private.services = services  # type: ignore[attr-defined]
    ray = types.ModuleType("ray")
    ray._private = private  # type: ignore[attr-defined]
    for name, mod in (("ray", ray), ("ray._private", private),
                      ("ray._private.services", services)):
        monkeypatch.setitem(sys.modules, name, mod)
    for key in rayphase.RAY_STARTUP_CONFIG:  # set then deleted: restored to absent afterwards
        monkeypatch.setenv(f"RAY_{key}", "unset")
        monkeypatch.delenv(f"RAY_{key}")
    monkeypatch.setenv("RAY_raylet_start_wait_time_s", "7")  # a site's own setting is kept
    env = rayphase.scale_ray_startup(10)
    services.wait_for_node("gcs", "sock")  # type: ignore[attr-defined]
    assert seen["timeout"] == 300
    services.wait_for_node("gcs", "sock", timeout=5)  # type: ignore[attr-defined]
    assert seen["timeout"] == 5
    assert services.get_node("gcs", "n1") == {"node_id": "n1"} and len(calls) == 3
    assert "RAY_raylet_start_wait_time_s" not in env
    assert env["RAY_gcs_server_request_timeout_seconds"] == "600"


class _FakeRay:
    def __init__(self, failures: int, message: str = "The current node timed out during "
                 "startup. This could happen because ...") -> None:
        self.failures, self.message, self.inits, self.shutdowns = failures, message, [], 0

    def init(self, **kwargs: object) -> None:
        self.inits.append(kwargs["_temp_dir"])
        if len(self.inits) <= self.failures:
            raise Exception(self.message)

    def shutdown(self) -> None:
        self.shutdowns += 1


def test_ray_start_gets_more_attempts_only_on_a_startup_timeout() -> None:
    from builder.selftest.phases.rayphase import EMULATED_ATTEMPTS, NATIVE_ATTEMPTS, init_ray

    ray = _FakeRay(1)
    assert "started on attempt 2" in init_ray(ray, "/t", 0, 10.0)
    assert ray.inits == ["/t/1", "/t/2"] and ray.shutdowns == 1
    assert init_ray(_FakeRay(0), "/t", 0, 10.0) == ""
    # natively (a loaded build host): fewer attempts, said as such
    assert "(a loaded host: started on attempt 2" in init_ray(_FakeRay(1), "/t", 0, 1.0)
    native = NATIVE_ATTEMPTS
    with pytest.raises(Exception, match=f"a loaded host: each of {native} starts timed out"):
        init_ray(_FakeRay(native), "/t", 0, 1.0)
    with pytest.raises(Exception, match="boom"):
        init_ray(_FakeRay(1, "boom"), "/t", 0, 10.0)  # not a startup timeout
    last = EMULATED_ATTEMPTS
    assert f"started on attempt {last}" in init_ray(_FakeRay(last - 1), "/t", 0, 10.0)
    with pytest.raises(Exception, match=f"each of {last} starts timed out during startup"):
        init_ray(_FakeRay(last), "/t", 0, 10.0)


def test_raylet_alive_reads_proc(tmp_path: Path) -> None:
    from builder.selftest.phases.rayphase import raylet_alive

    (tmp_path / "12").mkdir()
    (tmp_path / "12" / "cmdline").write_bytes(b"/usr/bin/python3\0-m\0x\0")
    (tmp_path / "13").mkdir()
    (tmp_path / "13" / "cmdline").write_bytes(b"")  # a zombie
    assert raylet_alive(str(tmp_path)) is False
    (tmp_path / "14").mkdir()
    (tmp_path / "14" / "cmdline").write_bytes(b"/venv/ray/core/src/ray/raylet/raylet\0--x\0")
    assert raylet_alive(str(tmp_path)) is True
    assert raylet_alive(str(tmp_path / "missing")) is True


def test_the_raylet_is_given_its_agents_ports_so_it_does_not_wait_for_their_files(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's raylet waits a fixed 15 s for each agent port it was not given (the agents write
    them to files once bound): the self-test gives it free ones, fresh per start, and keeps a
    port the caller gave."""
    from builder.selftest.phases import rayphase

    class RayParams:  # ray._private.parameter.RayParams's shape (keyword arguments)
        def __init__(self, num_cpus: int | None = None, metrics_agent_port: int | None = None,
                     runtime_env_agent_port: int | None = None,
                     metrics_export_port: int | None = None) -> None:
            self.metrics_agent_port, self.runtime_env_agent_port = (metrics_agent_port,
                                                                    runtime_env_agent_port)
            self.metrics_export_port = metrics_export_port

    parameter = types.ModuleType("ray._private.parameter")
    parameter.RayParams = RayParams  # type: ignore[attr-defined]
    ray = types.SimpleNamespace(_private=types.SimpleNamespace(parameter=parameter))
    ports = iter(range(40001, 40010))
    monkeypatch.setattr(rayphase, "free_port", lambda: next(ports))
    pinned = ("metrics_agent_port", "metrics_export_port", "runtime_env_agent_port")
    assert rayphase.pin_agent_ports(ray) == pinned  # what this RayParams knows of AGENT_PORTS
    assert rayphase.pin_agent_ports(ray) == pinned  # wrapped once
    made = parameter.RayParams(num_cpus=1)  # type: ignore[attr-defined]
    assert isinstance(made, RayParams)
    assert (made.metrics_agent_port, made.metrics_export_port,
            made.runtime_env_agent_port) == (40001, 40002, 40003)
    again = parameter.RayParams(runtime_env_agent_port=7)  # type: ignore[attr-defined]
    assert (again.metrics_agent_port, again.runtime_env_agent_port) == (40004, 7)
    # a Ray without RayParams (or the fakes above): nothing to pin
    assert rayphase.pin_agent_ports(types.SimpleNamespace()) == ()


def test_the_head_starts_no_process_ray_init_never_waits_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The autoscaler monitor and the log monitor are started by ``ray.init`` but never waited
    for: the wrapped RayParams asks for neither unless the caller did, and a Ray whose RayParams
    knows neither option is handed neither."""
    from builder.selftest.phases import rayphase

    class RayParams:
        def __init__(self, no_monitor: bool | None = False,
                     include_log_monitor: bool | None = None) -> None:
            self.no_monitor, self.include_log_monitor = no_monitor, include_log_monitor

    parameter = types.ModuleType("ray._private.parameter")
    parameter.RayParams = RayParams  # type: ignore[attr-defined]
    rayphase.pin_agent_ports(types.SimpleNamespace(_private=types.SimpleNamespace(
        parameter=parameter)))
    made = parameter.RayParams()  # type: ignore[attr-defined]  # as ray.init makes it
    assert (made.no_monitor, made.include_log_monitor) == (True, False)
    made = parameter.RayParams(no_monitor=False,  # type: ignore[attr-defined]
                               include_log_monitor=True)
    assert (made.no_monitor, made.include_log_monitor) == (False, True)  # the caller's choice

    class OldRayParams:
        def __init__(self, num_cpus: int | None = None) -> None:
            self.num_cpus = num_cpus

    parameter.RayParams = OldRayParams  # type: ignore[attr-defined]
    rayphase.pin_agent_ports(types.SimpleNamespace(_private=types.SimpleNamespace(
        parameter=parameter)))
    assert parameter.RayParams(num_cpus=1).num_cpus == 1  # type: ignore[attr-defined]


def test_free_port_is_bindable() -> None:
    import socket

    from builder.selftest.phases.rayphase import free_port

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_the_raylet_is_given_the_agent_listen_port_ray_passes_only_to_the_agent() -> None:
    from builder.selftest.phases.rayphase import _listen_port_to_raylet, raylet_listen_port

    agent = ("--dashboard_agent_command=/venv/bin/python -u /ray/dashboard/agent.py "
             "--grpc-port=41 --listen-port=52365 --minimal")
    raylet = ["/ray/raylet", "--metrics-agent-port=41", agent, "--session-name=s"]
    assert raylet_listen_port(raylet) == 52365
    assert raylet_listen_port(["/ray/raylet", agent.replace("52365", "0")]) is None
    assert raylet_listen_port(["/ray/raylet"]) is None
    seen: list[tuple[list[str], str]] = []
    start = _listen_port_to_raylet(lambda command, kind, *a, **k: seen.append((command, kind)))
    assert _listen_port_to_raylet(start) is start  # wrapped once
    start(raylet, "raylet", True)
    start(["/ray/gcs_server", agent], "gcs_server", True)  # only the raylet's command changes
    start([*raylet, "--dashboard_agent_listen_port=9"], "raylet", True)  # a given flag is kept
    assert seen[0] == ([*raylet, "--dashboard_agent_listen_port=52365"], "raylet")
    assert seen[1] == (["/ray/gcs_server", agent], "gcs_server")
    assert seen[2][0][-1] == "--dashboard_agent_listen_port=9"
    assert sum(c.startswith("--dashboard_agent_listen_port") for c in seen[2][0]) == 1
