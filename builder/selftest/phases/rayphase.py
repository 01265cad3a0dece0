"""Ray: start a private local head (``address="local"``: never joins an existing cluster),
run one CPU task, and with GPUs one GPU task; then shut down and remove its temp dir."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import signal
import socket
import tempfile
import time
from typing import Any

from ..manifest import GpuExpectation, declared
from ..phase import Run, Step, gpu_skip
from ..report import FAIL, PASS, SKIP, Check

PHASE = "ray"
OBJECT_STORE = 128 << 20


def decide_start(result: Any, error: str | None, version: str | None, note: str = "") -> Check:
    """The head must start and a task must return its value."""
    cid = "ray.local_start"
    if error is not None:
        return Check(cid, PHASE, FAIL, value=version, reason=error + note)
    if result != 42:
        return Check(cid, PHASE, FAIL, value=version, reason=f"task returned {result!r}{note}")
    return Check(cid, PHASE, PASS, value=version, reason="local head + 1 CPU task" + note)


STARTUP_TIMEOUT = "timed out during startup"
# Starts tried under emulation: 2 were not enough on a loaded 2-vCPU CI host (2026-11-25: both
# attempts' raylets died waiting for the emulated dashboard agent), nor 4 on one whose disk was
# half in I/O wait (2026-11-29, three test groups side by side).
EMULATED_ATTEMPTS = 8
# Starts tried natively: one failed on a 2-vCPU CI host at load 17 (2026-11-29, six test groups
# side by side: the raylet's fixed wait for the dashboard agent ran out), as it can on any build
# host busy with other builds. Three fit the phase's 180 s (a timed-out start takes about 30 s).
NATIVE_ATTEMPTS = 3


# The agents' ports the raylet otherwise learns from files the agents write once they have
# bound, waiting a fixed 15 s for them (Ray 2.60 NodeManager::WaitForDashboardAgentPorts:
# WaitForPersistedPort's default, used for each port given as 0; no setting reaches it): on a
# loaded or emulated host the dashboard agent can take longer to import, and the raylet dies
# ("timed out during startup"). Given up front, free ports are not waited for (the raylet
# connects to the agents when it needs them, under RAY_agent_register_timeout_ms, which a
# setting does reach: RAY_STARTUP_CONFIG).
AGENT_PORTS = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port",
               "runtime_env_agent_port")

# Head processes ``ray.init`` starts but never waits for or hears from: the autoscaler monitor
# and the log monitor (a local head with log_to_driver=False has no use for either). Either one
# failing leaves ``ray.init`` and the task passing, so the check never proved them; not starting
# them saves 1.4 s of CPU (two Python processes importing Ray) in the gate's busiest seconds.
# The GCS, the raylet, the dashboard agent and the runtime-env agent, which the raylet does wait
# for, and the worker that runs the check's task still start.
UNCHECKED_HEAD_PROCESSES = {"no_monitor": True, "include_log_monitor": False}


def free_port() -> int:
    """A TCP port free on every address now (the agent binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def pin_agent_ports(ray: Any) -> tuple[str, ...]:
    """Make every ``ray.init`` of this process give the raylet its agents' ports (fresh free
    ones per start, unless given) and start no UNCHECKED_HEAD_PROCESSES: ``RayParams`` wrapped
    where ``ray.init`` looks it up. Returns the ports pinned (none on a Ray whose RayParams
    knows neither)."""
    parameter = getattr(getattr(ray, "_private", None), "parameter", None)
    params = getattr(parameter, "RayParams", None)
    if params is None:
        return ()
    if getattr(params, "_verl_env_pinned", False):
        return tuple(params._verl_env_pinned)
    known = inspect.signature(params.__init__).parameters
    names = tuple(n for n in AGENT_PORTS if n in known)
    unchecked = {k: v for k, v in UNCHECKED_HEAD_PROCESSES.items() if k in known}

    class Pinned(params):  # type: ignore[misc, valid-type]
        _verl_env_pinned = names

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            for name in names:
                if kwargs.get(name) is None:
                    kwargs[name] = free_port()
            for name, value in unchecked.items():
                if kwargs.get(name) is None:
                    kwargs[name] = value
            super().__init__(*args, **kwargs)

    parameter.RayParams = Pinned
    services = getattr(ray._private, "services", None)
    if services is not None and hasattr(services, "start_ray_process"):
        services.start_ray_process = _listen_port_to_raylet(services.start_ray_process)
    return names


LISTEN_FLAG = "--dashboard_agent_listen_port"


def _listen_port_to_raylet(start: Any) -> Any:
    """``services.start_ray_process`` that also gives the raylet the dashboard agent's listen
    port, which Ray 2.60's Python passes to the agent (``--listen-port=N`` inside
    ``--dashboard_agent_command``) but not to the raylet, whose flag of that name then stays 0
    and is waited for."""
    if getattr(start, "_verl_env_pinned", False):
        return start

    def starting(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
        if process_type == "raylet" and not any(c.startswith(LISTEN_FLAG) for c in command):
            port = raylet_listen_port(command)
            if port:
                command = [*command, f"{LISTEN_FLAG}={port}"]
        return start(command, process_type, *args, **kwargs)

    starting._verl_env_pinned = True  # type: ignore[attr-defined]
    return starting


def raylet_listen_port(command: list[str]) -> int | None:
    """The nonzero ``--listen-port`` of the agent command in a raylet command line, if any."""
    for arg in command:
        if arg.startswith("--dashboard_agent_command="):
            for word in arg.split():
                if word.startswith("--listen-port="):
                    value = word.split("=", 1)[1]
                    return int(value) if value.isdigit() and int(value) else None
    return None


def init_ray(ray: Any, tmp: str, visible: int, factor: float) -> str:
    """``ray.init`` a private local head: up to EMULATED_ATTEMPTS starts under emulation
    (NATIVE_ATTEMPTS natively) while each times out during startup: Ray 2.60's raylet waits a
    fixed 15 s for the dashboard agent's metrics port file, which no setting reaches
    (RAY_agent_register_timeout_ms does not), and on a loaded build host (the more so emulated)
    the agent can take longer. Any other failure is not retried. Returns a note for the check's
    reason ("" when the first attempt started)."""
    attempts = EMULATED_ATTEMPTS if factor > 1 else NATIVE_ATTEMPTS
    how = "emulated" if factor > 1 else "a loaded host"
    pin_agent_ports(ray)
    for attempt in range(1, attempts + 1):
        try:
            ray.init(address="local", include_dashboard=False, num_cpus=1, num_gpus=visible,
                     object_store_memory=OBJECT_STORE, _temp_dir=f"{tmp}/{attempt}",
                     log_to_driver=False, configure_logging=False)
            return "" if attempt == 1 else (
                f" ({how}: started on attempt {attempt}; the earlier ones timed out during "
                f"startup)")
        except Exception as e:  # noqa: BLE001
            if STARTUP_TIMEOUT not in str(e):
                raise
            ray.shutdown()
            # A head that failed to start is not Ray's to stop (shutdown knows no node): its
            # GCS, dashboard, monitor and log monitor would run on beside the next attempt
            stop_processes_under(f"{tmp}/{attempt}/")
            if attempt == attempts:
                raise RuntimeError(f"{e} ({how}: each of {attempts} starts timed out during "
                                   "startup)") from e
    return ""


def decide_gpu_task(expect: GpuExpectation, visible: int, cluster_gpus: float | None,
                    task: dict[str, Any] | None, error: str | None,
                    noset: bool = False) -> Check:
    """With GPUs: Ray must count them all, and a ``num_gpus=1`` task must see exactly one
    (any number when Ray is told not to set the visibility variables)."""
    cid = "ray.gpu_task"
    if not expect.expected:
        return gpu_skip(cid, PHASE, expect)
    if visible == 0:
        return Check(cid, PHASE, SKIP, required=True, reason="no GPU visible")
    if error is not None:
        return Check(cid, PHASE, FAIL, reason=error)
    if cluster_gpus != visible:
        return Check(cid, PHASE, FAIL, value=cluster_gpus,
                     reason=f"Ray counts {cluster_gpus} GPU(s), torch sees {visible}")
    seen = (task or {}).get("count")
    if not seen or (not noset and seen != 1):
        return Check(cid, PHASE, FAIL, value=task,
                     reason=f"num_gpus=1 task sees {seen} device(s)")
    return Check(cid, PHASE, PASS, value=task, reason=f"Ray counts {visible} GPU(s)")


def gpu_task() -> dict[str, Any]:
    """Runs inside a Ray worker with one GPU."""
    import torch  # type: ignore[import-not-found]

    n = torch.cuda.device_count()
    ok = n > 0 and float(torch.ones(4, device="cuda").sum().item()) == 4.0
    return {"count": n, "ok": ok,
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES") or
            os.environ.get("HIP_VISIBLE_DEVICES")}


def ray_step(run: Run) -> list[Check]:
    """Start, run tasks, shut down."""
    expect = run.expect
    visible = 0
    if expect.expected:
        import torch  # type: ignore[import-not-found]

        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    tmp = tempfile.mkdtemp(prefix="run-", dir=run.options.get("ray_tmp") or "/tmp")
    version = None
    start: Check
    gpu: Check
    try:
        factor = float(run.options.get("emulated") or 1.0)
        if factor > 1:
            scale_ray_startup(factor)
        import ray  # type: ignore[import-not-found]

        version = ray.__version__
        run.fact("versions.ray", version)
        note = init_ray(ray, tmp, visible, factor)
        try:
            start = decide_start(ray.get(ray.remote(lambda: 42).remote(), timeout=60 * factor),
                                 None, version, note)
            if expect.expected and visible:
                try:
                    task = ray.get(ray.remote(num_gpus=1, num_cpus=0)(gpu_task).remote(),
                                   timeout=120)
                    gpu = decide_gpu_task(expect, visible, ray.cluster_resources().get("GPU"),
                                          task, None, noset=_noset())
                except Exception as e:  # noqa: BLE001
                    gpu = decide_gpu_task(expect, visible, None, None, f"{type(e).__name__}: {e}")
            else:
                gpu = decide_gpu_task(expect, visible, None, None, None)
        finally:
            ray.shutdown()
    except Exception as e:  # noqa: BLE001
        start = decide_start(None, f"{type(e).__name__}: {e}", version)
        gpu = decide_gpu_task(expect, visible, None, None, "Ray did not start") \
            if expect.expected and visible else decide_gpu_task(expect, visible, None, None, None)
    finally:
        stop_processes_under(tmp + "/")
        shutil.rmtree(tmp, ignore_errors=True)
    return [start, gpu]


def stop_processes_under(path: str, proc: str = "/proc", grace: float = 5.0) -> list[int]:
    """Stop every process whose command line names ``path`` (a Ray session's temporary
    directory: each of its processes is started with it), SIGTERM then SIGKILL after ``grace``
    seconds; returns their PIDs. Only this container's processes are seen."""
    found = [pid for pid in _pids_naming(path.encode(), proc) or [] if pid != os.getpid()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [pid for pid in found if _signal(pid, sig)]
        deadline = time.monotonic() + grace
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [pid for pid in alive if _running(pid, proc)]
        if not alive:
            break
    return found


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def _running(pid: int, proc: str) -> bool:
    """Alive and not a zombie (an exited child nobody has reaped yet counts as stopped)."""
    try:
        with open(f"{proc}/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


RAY_TMP = re.compile(r"vst-ray-(\d+)-[A-Za-z0-9_]+")
#: A directory a killed self-test left is removed only once it is this old: a run in another PID
#: namespace sharing /tmp (its PID invisible here) is long over by then.
RAY_TMP_STALE_S = 6 * 3600


def ray_tmp(parent: str = "/tmp") -> str:
    """Ray's temporary directory for this run, ``vst-ray-PID-XXXXXXXX`` under ``parent``. First
    the ones a self-test killed outright left behind (SIGKILL skips its ``finally``) are removed:
    this user's, named by a process that no longer runs, older than :data:`RAY_TMP_STALE_S`.
    Under ch-run, Apptainer and enroot /tmp is the node's, so they would pile up there."""
    now = time.time()
    try:
        entries = list(os.scandir(parent))
    except OSError:
        entries = []
    for entry in entries:
        m = RAY_TMP.fullmatch(entry.name)
        if m is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if (not entry.is_dir(follow_symlinks=False) or st.st_uid != os.getuid()
                or now - st.st_mtime < RAY_TMP_STALE_S or _running(int(m.group(1)), "/proc")):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"vst-ray-{os.getpid()}-", dir=parent)


# Ray's own startup deadlines, as environment overrides of its C++ config (RAY_<name>): the
# raylet's wait for the GCS and for its workers to register, and the GCS RPC deadlines.
RAY_STARTUP_CONFIG = {"raylet_start_wait_time_s": 10, "gcs_rpc_server_connect_timeout_s": 5,
                      "gcs_rpc_server_reconnect_timeout_s": 60,
                      "gcs_server_request_timeout_seconds": 60,
                      "worker_register_timeout_seconds": 60,
                      "agent_register_timeout_ms": 30_000}


def scale_ray_startup(factor: float) -> dict[str, str]:
    """Stretch Ray's startup deadlines for a run under QEMU emulation (about ten times slower).

    "The current node timed out during startup" is raised by ``ray._private.node.Node`` when
    the raylet has not registered with the GCS within a fixed 30 s: Ray >= 2.5x polls
    ``services.get_node`` against a local ``raylet_start_wait_time_s = 30`` (no setting reaches
    it), older releases call ``services.wait_for_node`` with a module-constant default. Both are
    wrapped (Node calls them through the module): ``get_node`` retries its "node not found"
    RuntimeError for 30 s x factor, ``wait_for_node`` gets a scaled default timeout. The C++
    processes read their deadlines from RAY_<name> environment variables (set unless already
    set). Returns the variables set."""
    env = {}
    for name, default in RAY_STARTUP_CONFIG.items():
        key = f"RAY_{name}"
        if key not in os.environ:
            env[key] = os.environ[key] = str(int(default * factor))
    import ray._private.services as services  # type: ignore[import-not-found]

    wait = services.wait_for_node
    if not getattr(wait, "_verl_env_scaled", False):
        default = float(getattr(services, "_timeout", 30))

        def scaled(*args: Any, **kwargs: Any) -> Any:
            if len(args) < 3 and "timeout" not in kwargs:
                kwargs["timeout"] = default * factor
            return wait(*args, **kwargs)

        scaled._verl_env_scaled = True  # type: ignore[attr-defined]
        services.wait_for_node = scaled
    get_node = getattr(services, "get_node", None)
    if get_node is not None and not getattr(get_node, "_verl_env_scaled", False):
        patience = 30 * factor

        def patient(*args: Any, **kwargs: Any) -> Any:
            deadline = time.monotonic() + patience
            while True:
                try:
                    return get_node(*args, **kwargs)
                except RuntimeError:
                    if time.monotonic() > deadline or not raylet_alive():
                        raise  # a raylet that died will never register: no use waiting
                    time.sleep(1)

        patient._verl_env_scaled = True  # type: ignore[attr-defined]
        services.get_node = patient
    return env


def raylet_alive(proc: str = "/proc") -> bool:
    """Whether a raylet process of this machine (container) is alive; True when unknown. An
    exited raylet is a zombie with an empty command line until Ray reaps it."""
    pids = _pids_naming(b"/raylet/raylet", proc)
    return pids is None or bool(pids)


def _pids_naming(needle: bytes, proc: str) -> list[int] | None:
    """The processes whose command line contains ``needle``; None when ``proc`` cannot be
    listed (unknown)."""
    try:
        pids = [int(d) for d in os.listdir(proc) if d.isdigit()]
    except OSError:
        return None
    found = []
    for pid in pids:
        try:
            with open(f"{proc}/{pid}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def _noset() -> bool:
    return any(os.environ.get(f"RAY_EXPERIMENTAL_NOSET_{v}_VISIBLE_DEVICES") == "1"
               for v in ("CUDA", "HIP", "ROCR"))


def plan(run: Run) -> list[Step]:
    """One step producing both records, when the target has Ray."""
    if not declared(run.manifest, "ray"):
        return []
    return [Step(("ray.local_start", "ray.gpu_task"), ray_step)]
