"""``build-env doctor``: pre-flight one cluster node for the known multi-node pitfalls, or a
build host for what a build needs (:func:`run_build_host`).

Each check returns a :class:`Finding` with a one-line fix. Everything the checks read (the
environment, sysfs, /dev/shm, the runtime command) can be pointed elsewhere, so the checks are
tested against real sockets, real mounts and a fake sysfs tree. :func:`run_doctor` runs them
all; the command (:mod:`builder.commands.doctor`) prints them.
"""

from __future__ import annotations

import base64
import errno
import fcntl
import getpass
import json
import os
import resource
import shutil
import socket
import ssl
import struct
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from builder.engine import Engine, HostFacts, find_buildkit_cli
from builder.errors import BuildEnvError, redact
from builder.selftest.phases import envlint, gpu, preflight
from builder.selftest.report import Check
from builder.cluster.ports import RayPorts

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
_SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class Finding:
    """One pre-flight result: ``status`` is ok|warn|fail|skip; ``fix`` is a one-line remedy."""

    id: str
    status: str
    message: str
    fix: str = ""


def _port_taken(port: int) -> bool:
    """True when a server could not bind ``port`` on all addresses (someone holds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def check_ports(ports: RayPorts) -> list[Finding]:
    """Ray's fixed ports (GCS, dashboard, client, per-node) and the worker port range."""
    fixed = {**ports.head_only(), **ports.per_node()}
    taken = [f"{p} ({name})" for name, p in fixed.items() if _port_taken(p)]
    out = [Finding("ports.ray", FAIL, f"in use: {', '.join(taken)}",
                   "stop the old Ray/Redis holding them (`ss -ltnp` names it; `ray stop`)")
           if taken else
           Finding("ports.ray", OK, f"free: {', '.join(str(p) for p in fixed.values())}")]
    workers = ports.worker_range()
    busy = [p for p in workers if _port_taken(p)]
    span = f"{workers.start}-{workers.stop - 1}"
    if len(busy) == len(workers):
        out.append(Finding("ports.ray_workers", FAIL, f"every port of {span} is in use",
                           "free the worker range or pick another with --min/--max-worker-port"))
    elif busy:
        shown = ", ".join(map(str, busy[:5])) + (" …" if len(busy) > 5 else "")
        out.append(Finding("ports.ray_workers", WARN, f"{len(busy)} of {span} in use: {shown}",
                           "stop what holds them; Ray workers fail to start on a taken port"))
    else:
        out.append(Finding("ports.ray_workers", OK, f"{span} free"))
    out.append(_ephemeral_overlap(workers))
    return out


def _ephemeral_overlap(workers: range, path: str = "/proc/sys/net/ipv4/ip_local_port_range"
                       ) -> Finding:
    try:
        low, high = map(int, Path(path).read_text().split())
    except (OSError, ValueError):
        return Finding("ports.ephemeral", SKIP, f"cannot read {path}",
                       "check the ephemeral range with `sysctl net.ipv4.ip_local_port_range`")
    if low <= workers.stop - 1 and workers.start <= high:
        return Finding("ports.ephemeral", WARN,
                       f"worker range {workers.start}-{workers.stop - 1} overlaps the ephemeral "
                       f"range {low}-{high}: outgoing connections can take worker ports",
                       "move the worker range below the ephemeral range (or set "
                       "net.ipv4.ip_local_reserved_ports)")
    return Finding("ports.ephemeral", OK, f"ephemeral range {low}-{high} outside the worker range")


def check_infiniband(sysfs: Path) -> list[Finding]:
    """State of every InfiniBand port under ``sysfs``/class/infiniband."""
    root = sysfs / "class" / "infiniband"
    states = sorted(root.glob("*/ports/*/state"))
    if not states:
        return [Finding("ib.ports", SKIP, "no InfiniBand devices (NCCL will use sockets)",
                        "nothing to do without IB; on IB nodes load the driver (mlx5_ib) first")]
    down = []
    for state in states:
        text = state.read_text().strip()
        if "ACTIVE" not in text:
            down.append(f"{state.parts[-4]} port {state.parts[-2]}: {text}")
    if down:
        return [Finding("ib.ports", FAIL, "; ".join(down),
                        "bring the port up (`ibstat`, check cable/subnet manager) or exclude the "
                        "HCA with NCCL_IB_HCA")]
    return [Finding("ib.ports", OK, f"{len(states)} port(s) ACTIVE")]


def _names_in(spec: str) -> tuple[bool, bool, list[str]]:
    """Parse NCCL list syntax: leading ``^`` excludes, ``=`` exact; ``dev:port`` entries."""
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    names = [n.split(":")[0].strip() for n in spec.lstrip("=").split(",") if n.strip()]
    return exclude, exact, names


def check_nccl_env(env: Mapping[str, str], sysfs: Path) -> list[Finding]:
    """NCCL/RCCL/gloo variables that name HCAs or interfaces which do not exist here."""
    hcas = {p.name for p in (sysfs / "class" / "infiniband").glob("*")}
    nets = {p.name for p in (sysfs / "class" / "net").glob("*")}
    problems = []
    spec = env.get("NCCL_IB_HCA")
    if spec:
        exclude, exact, names = _names_in(spec)
        if not exclude:
            missing = [n for n in names if not (n in hcas if exact else
                                                any(h.startswith(n) for h in hcas))]
            if missing:
                problems.append(f"NCCL_IB_HCA names missing HCA(s) {', '.join(missing)} "
                                f"(present: {', '.join(sorted(hcas)) or 'none'})")
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        spec = env.get(var)
        if not spec:
            continue
        exclude, exact, names = _names_in(spec)
        if not exclude and not any(n in nets if exact or var.startswith("GLOO")
                                   else any(i.startswith(n) for i in nets) for n in names):
            problems.append(f"{var}={spec} matches no interface (present: {', '.join(sorted(nets))})")
    if env.get("NCCL_IB_DISABLE") == "1" and hcas:
        problems.append("NCCL_IB_DISABLE=1 although InfiniBand devices exist")
    if problems:
        return [Finding("nccl.env", FAIL, "; ".join(problems),
                        "fix the site profile (build-env slurm --env NAME=VALUE) to name devices "
                        "that exist (`ibdev2netdev`, `ip -br link`)")]
    named = [k for k in ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if env.get(k)]
    return [Finding("nccl.env", OK, f"consistent ({', '.join(named) or 'nothing set'})")]


# The node checks the self-test also runs inside the image, reused here with the same ids and
# the same wording (builder/selftest/phases/envlint.py, preflight.py, gpu.py); the doctor adds a fix.
FIXES = {
    "env.hip_cuda_visible_devices": 'export HIP_VISIBLE_DEVICES="$CUDA_VISIBLE_DEVICES"',
    "env.rocr_visible_devices": 'export HIP_VISIBLE_DEVICES="$ROCR_VISIBLE_DEVICES"; '
                                "unset ROCR_VISIBLE_DEVICES",
    "env.ray_debug": "unset RAY_DEBUG=legacy / RAY_DEBUG_POST_MORTEM for unattended jobs "
                     "(Ray >= 2.39 has the new debugger)",
    "env.hf_cache": "point HF_HOME (build-env slurm --hf-home) at a shared directory you own",
    "preflight.shm": "enlarge /dev/shm (docker: --shm-size=16g; apptainer uses the host's) to "
                     ">= 1 GiB and >= 30% of RAM",
    "preflight.memlock": "raise the memlock limit (limits.conf: * - memlock unlimited; Slurm: "
                         "PropagateResourceLimits)",
    "preflight.infiniband": "pass /dev/infiniband into the container (the job binds it)",
    "gpu.driver": "install a driver that supports the image's CUDA (CUDA 13 needs R580+), or "
                  "use a target built for an older CUDA",
}
_STATUS = {"pass": OK, "warn": WARN, "fail": FAIL, "skip": SKIP, "incomplete": FAIL}


def _number(value: float) -> str:
    """A measured number as people read it: 23.54058 -> 23.5, 0.0625 -> 0.06, 3.0 -> 3."""
    text = f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def value_text(check: Check) -> str:
    """A check's value with its unit, and the threshold it was held to (``23.5 GiB (>= 1
    GiB)``); ``ok`` when it has none. A float is rounded, never printed raw."""
    value = check.value
    if value is None:
        return "ok"
    if isinstance(value, float):
        text = _number(value)
    elif isinstance(value, (int, str)):
        text = str(value)
    else:
        text = json.dumps(value, default=str)
    text += f" {check.unit}" if check.unit else ""
    limit = (check.threshold or {}).get("value")
    if isinstance(limit, (int, float)) and not isinstance(limit, bool):
        op = (check.threshold or {}).get("op", "")
        text += f" ({op} {_number(float(limit))}{' ' + check.unit if check.unit else ''})"
    return text


def from_check(check: Check) -> Finding:
    """A self-test check as a doctor finding (same id, same words, and the doctor's fix)."""
    return Finding(check.id, _STATUS.get(check.status, FAIL), check.reason or value_text(check),
                   FIXES.get(check.id, ""))


def check_visible_devices(env: Mapping[str, str], accelerator: str = "rocm") -> list[Finding]:
    """HIP_VISIBLE_DEVICES == CUDA_VISIBLE_DEVICES, and no ROCR_VISIBLE_DEVICES under Ray."""
    return [from_check(envlint.lint_visible_devices(env)),
            from_check(envlint.lint_rocr(env, accelerator))]


def check_ray_debug(env: Mapping[str, str]) -> list[Finding]:
    """RAY_DEBUG=legacy with RAY_DEBUG_POST_MORTEM, or post-mortem alone (a failed task waits)."""
    return [from_check(envlint.lint_ray_debug(env))]


def check_hf_cache(path: Path) -> list[Finding]:
    """The Hugging Face cache (HF_HOME and its hub directory) can be written."""
    paths = envlint.hf_cache_paths({"HF_HOME": str(path)}, str(Path.home()))
    return [from_check(envlint.lint_hf_cache(
        [(label, p, *envlint.probe_writable(p)) for label, p in paths]))]


def check_shm(path: Path, gpus_expected: bool = True) -> list[Finding]:
    """/dev/shm size: NCCL needs >= 1 GiB, Ray's object store 30 % of RAM."""
    return [from_check(preflight.decide_shm(preflight.probe_shm(str(path)), preflight.probe_ram(),
                                            gpus_expected))]


def check_memlock_and_rdma(dev: str = "/dev/infiniband") -> list[Finding]:
    """/dev/infiniband and the memlock limit RDMA registration needs."""
    devices = preflight.probe_ib_devices(dev)
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return [from_check(preflight.decide_infiniband(devices)),
            from_check(preflight.decide_memlock(soft, resource.RLIM_INFINITY, bool(devices)))]


def check_driver(cuda: str | None, accelerator: str | None) -> list[Finding]:
    """The node's driver against the target's CUDA (``--target`` or ``--cuda``)."""
    if accelerator == "rocm":
        return [from_check(gpu.decide_driver(None, None, None, rocm=True))]
    if not cuda:
        return [Finding("gpu.driver", SKIP, "no CUDA version to hold the driver to",
                        "name the image's target: build-env doctor --target T (or --cuda 13.0)")]
    driver = (gpu.read_text("/proc/driver/nvidia/version") or "").splitlines()
    return [from_check(gpu.decide_driver(gpu.probe_driver_cuda(), cuda,
                                         driver[0] if driver else None, rocm=False))]


def check_pyxis() -> list[Finding]:
    """pyxis: srun knows --container-image (the plugin is loaded) and enroot is on PATH."""
    srun = shutil.which("srun")
    try:
        help_text = subprocess.run([srun, "--help"], capture_output=True, text=True,
                                   timeout=20).stdout if srun else ""
    except (OSError, subprocess.TimeoutExpired):
        help_text = ""
    if "--container-image" not in help_text:
        return [Finding("runtime", FAIL, "srun has no --container-image: pyxis is not loaded",
                        "load pyxis in plugstack.conf (or use --runtime apptainer)")]
    path = shutil.which("enroot")
    if path is None:
        return [Finding("runtime", FAIL, "pyxis is loaded but enroot is not on PATH",
                        "install enroot on every node (pyxis runs it with slurmd's PATH)")]
    try:
        proc = subprocess.run([path, "version"], capture_output=True, text=True, timeout=20)
        version = proc.stdout.strip() if proc.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    if not version:
        return [Finding("runtime", FAIL, f"{path} version failed", "reinstall enroot")]
    return [Finding("runtime", OK, f"pyxis loaded; {path}: enroot {version}")]


def check_runtime(runtime: str) -> list[Finding]:
    """The container runtime is on PATH, and its version."""
    if runtime == "pyxis":
        return check_pyxis()
    path = shutil.which(runtime)
    if path is None:
        return [Finding("runtime", FAIL, f"{runtime} not found on PATH",
                        f"module load {runtime} (or install it on every node)")]
    try:
        env = dict(os.environ)
        env.setdefault("USER", getpass.getuser())  # ch-run refuses to start without $USER
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20,
                              env=env)
        version = (proc.stdout or proc.stderr).strip().splitlines()[0] if proc.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired, IndexError):
        version = ""
    if not version:
        return [Finding("runtime", FAIL, f"{path} --version failed", f"reinstall {runtime}")]
    return [Finding("runtime", OK, f"{path}: {version}")]


def check_cpus(env: Mapping[str, str]) -> list[Finding]:
    """CPUs this process may use (affinity, SLURM_CPUS_ON_NODE) vs os.cpu_count() (what Ray
    takes without --num-cpus)."""
    total = os.cpu_count() or 0
    allowed = len(os.sched_getaffinity(0))
    limits = [allowed]
    slurm = env.get("SLURM_CPUS_ON_NODE")
    if slurm and slurm.isdigit():
        limits.append(int(slurm))
    usable = min(limits)
    msg = f"Ray would take {total} CPUs; allowed {allowed} (affinity)" + (
        f", SLURM_CPUS_ON_NODE={slurm}" if slurm else "")
    if usable < total:
        return [Finding("slurm.cpus", WARN, msg,
                        f"start Ray with --num-cpus={usable} (the build-env slurm script does)")]
    return [Finding("slurm.cpus", OK, msg)]


def _ipv4_of(interface: str) -> str | None:
    packed = struct.pack("256s", interface.encode()[:15])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            data = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, packed)
        except OSError:
            return None
    return socket.inet_ntoa(data[20:24])


def check_interface(interface: str, sysfs: Path) -> list[Finding]:
    """The chosen interface exists and has a routable (non-loopback) IPv4 address."""
    nets = sorted(p.name for p in (sysfs / "class" / "net").glob("*"))
    if interface not in nets:
        return [Finding("net.interface", FAIL, f"no interface {interface} (have: {', '.join(nets)})",
                        "pass --interface with one of those (the one on the fast fabric)")]
    addr = _ipv4_of(interface)
    if addr is None:
        return [Finding("net.interface", FAIL, f"{interface} has no IPv4 address",
                        f"configure {interface} or choose another --interface")]
    if addr.startswith("127."):
        return [Finding("net.interface", FAIL, f"{interface} has loopback address {addr}: "
                        "other nodes cannot reach Ray or NCCL there",
                        "choose the cluster fabric interface (ib0, or the node's data NIC)")]
    return [Finding("net.interface", OK, f"{interface} {addr}")]


def run_doctor(interface: str = "ib0", hf_home: str | None = None, runtime: str = "apptainer",
               ports: RayPorts | None = None, env: Mapping[str, str] | None = None,
               sysfs: str = "/sys", shm: str = "/dev/shm", accelerator: str | None = None,
               cuda: str | None = None) -> list[Finding]:
    """Run every check; nothing here raises for a bad node, it reports. ``accelerator`` and
    ``cuda``: the target whose image will run here (the driver check needs its CUDA)."""
    env = os.environ if env is None else env
    root = Path(sysfs)
    hf = Path(hf_home or env.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    findings: list[Finding] = []
    findings += check_ports(ports or RayPorts())
    findings += check_interface(interface, root)
    findings += check_infiniband(root)
    findings += check_nccl_env(env, root)
    findings += check_visible_devices(env, accelerator or "rocm")
    findings += check_ray_debug(env)
    findings += check_hf_cache(hf)
    findings += check_shm(Path(shm), gpus_expected=accelerator != "cpu")
    findings += check_memlock_and_rdma()
    findings += check_driver(cuda, accelerator)
    findings += check_runtime(runtime)
    findings += check_cpus(env)
    return findings


# --------------------------------------------------------------------------- build hosts
# What a build needs before it starts. The engine answers and BuildKit can drive it; the NVIDIA
# Container Toolkit is there for a CUDA target's GPU gate (without it the build still passes at
# the ``build`` level, its GPU phases ``pending``); the engine's data root has room for the
# target; the site CA bundle is a CA bundle; the package index answers one bounded request.
# Whether a machine is a cluster node (:func:`on_cluster`: a Slurm job's environment, or the
# node's slurmd running) decides which checks ``doctor`` runs by default.

GB = 1000 ** 3
# Free space a build needs under the engine's data root, by accelerator (the image, one
# candidate beside the last release, the source stages and their caches, and the largest
# layer's wheels unpacked while its step runs; see docs/guides/gpu-build-host.md).
NEEDS_GB = {"cuda": 60, "rocm": 90, "cpu": 10}
INDEX_TIMEOUT_S = 10.0
SLURMD_PIDFILES = ("/run/slurmd.pid", "/var/run/slurmd.pid")


def on_cluster(env: Mapping[str, str], pidfiles: tuple[str, ...] = SLURMD_PIDFILES) -> bool:
    """A cluster node: inside a Slurm job or allocation (``SLURM_*``), or the node's slurmd
    runs (its pid file names a live process)."""
    if any(k.startswith("SLURM_") for k in env):
        return True
    for pidfile in pidfiles:
        try:
            pid = int(Path(pidfile).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if Path(f"/proc/{pid}").exists():
            return True
    return False


def check_engine() -> tuple[Engine | None, list[Finding]]:
    """The engine answers (DOCKER_HOST, the docker context, the default socket)."""
    try:
        engine = Engine.connect()
    except BuildEnvError as exc:
        return None, [Finding("engine", FAIL, str(exc).removeprefix("engine: "),
                              "start dockerd, or point DOCKER_HOST / `docker context use` at "
                              "the engine builds should use")]
    return engine, []


def check_buildkit(facts: HostFacts | None) -> list[Finding]:
    """A docker CLI that drives BuildKit (the Dockerfiles use RUN --mount)."""
    try:
        cli = find_buildkit_cli()
    except BuildEnvError as exc:
        return [Finding("engine.buildkit", FAIL, str(exc).split(": ", 1)[-1][:300],
                        "install the buildx plugin (apt-get install docker-buildx)")]
    default = f"; the engine's default builder: {facts.builder_version}" if (
        facts and facts.builder_version) else ""
    return [Finding("engine.buildkit", OK, f"{cli}{default}")]


def check_nvidia_toolkit(facts: HostFacts, accelerator: str | None) -> list[Finding]:
    """The NVIDIA Container Toolkit, for a CUDA target's GPU gate: the ``nvidia`` runtime
    registered with the engine, or CDI specs for ``nvidia.com/gpu``. Missing is a warning: the
    build is gated without GPUs and its verdict says the GPU phases are pending."""
    if accelerator not in (None, "cuda"):
        return [Finding("gpu.toolkit", SKIP, f"a {accelerator} target: the NVIDIA Container "
                        "Toolkit is not used")]
    cdi = [d for d in facts.cdi_devices if d.startswith("nvidia.com/gpu")]
    specs = _nvidia_cdi_specs(facts) if not cdi else []
    if "nvidia" in facts.runtimes or cdi or specs:
        how = ("runtime nvidia registered" if "nvidia" in facts.runtimes else
               f"CDI devices {', '.join(cdi[:3])}" if cdi else f"CDI specs {', '.join(specs)}")
        return [Finding("gpu.toolkit", OK, f"NVIDIA Container Toolkit: {how}")]
    return [Finding("gpu.toolkit", WARN,
                    "no NVIDIA Container Toolkit (no nvidia runtime registered with the engine, "
                    f"no nvidia.com/gpu CDI spec; runtimes: {', '.join(facts.runtimes) or '-'}): "
                    "builds still run, but the gate cannot hand GPUs to the image, so the GPU "
                    "gate phases will be pending (a build verdict, no GPU proof)",
                    "install nvidia-container-toolkit and run `nvidia-ctk runtime configure "
                    "--runtime=docker` (or `nvidia-ctk cdi generate`), then restart dockerd; "
                    "or verify the image later on a GPU node")]


def _nvidia_cdi_specs(facts: HostFacts) -> list[str]:
    """CDI spec files naming ``nvidia.com/gpu`` in the engine's spec directories (a local
    engine's; an older engine does not list its devices)."""
    if not facts.local:
        return []
    found = []
    for directory in facts.cdi_spec_dirs:
        for spec in sorted(Path(directory).glob("*")):
            try:
                if spec.is_file() and "nvidia.com/gpu" in spec.read_text(errors="replace"):
                    found.append(str(spec))
            except OSError:
                continue
    return found


def check_build_host_driver(cuda: str | None, accelerator: str | None,
                            proc: str = "/proc/driver/nvidia/version") -> list[Finding]:
    """The driver against the target's CUDA, where this host has an NVIDIA driver (the GPU
    gate runs here); without one the GPU phases are pending, which is no failure of a build."""
    if accelerator not in (None, "cuda"):
        return []
    if not Path(proc).exists():
        return [Finding("gpu.driver", SKIP, "no NVIDIA driver on this host: the GPU gate phases "
                        "will be pending (verify on a GPU node for a gpu verdict)")]
    return check_driver(cuda, "cuda")


def check_disk(facts: HostFacts, accelerator: str | None) -> list[Finding]:
    """Free space under the engine's data root against what the target's build needs."""
    need = NEEDS_GB.get(accelerator or "cuda", NEEDS_GB["cuda"]) * GB
    what = f"a {accelerator} target" if accelerator else "a build (no --target: a cuda one)"
    if facts.free_bytes is None:
        return [Finding("engine.disk", SKIP, f"the engine's data root {facts.data_root or '?'} "
                        "is not on this machine: its free space cannot be measured from here")]
    msg = (f"{facts.free_bytes / GB:.1f} GB free under the data root {facts.data_root}; "
           f"{what} needs about {need // GB} GB")
    if facts.free_bytes < need:
        return [Finding("engine.disk", FAIL, msg,
                        "free space there (docker builder prune, docker image prune) or move "
                        "the data root (dockerd --data-root) to a larger disk")]
    return [Finding("engine.disk", OK, msg)]


def check_ca_bundle(ca_bundle: Path | None) -> list[Finding]:
    """The site CA bundle (``--ca-bundle``, config ``ca_bundle``, ``VERL_ENV_CA_BUNDLE``): a
    readable file of PEM certificates."""
    if ca_bundle is None:
        return [Finding("site.ca_bundle", SKIP, "no site CA bundle given (needed only behind a "
                        "TLS-intercepting proxy: --ca-bundle, config ca_bundle)")]
    try:
        text = Path(ca_bundle).read_text(errors="replace")
    except OSError as exc:
        return [Finding("site.ca_bundle", FAIL, f"{ca_bundle}: {exc.strerror or exc}",
                        "point --ca-bundle (config ca_bundle) at the site's PEM bundle")]
    count = text.count("-----BEGIN CERTIFICATE-----")
    if not count:
        return [Finding("site.ca_bundle", FAIL, f"{ca_bundle}: no PEM certificate in it",
                        "point --ca-bundle at a PEM file (-----BEGIN CERTIFICATE-----)")]
    return [Finding("site.ca_bundle", OK, f"{ca_bundle}: {count} certificate(s)")]


def check_index(index_url: str, ca_bundle: Path | None,
                timeout: float = INDEX_TIMEOUT_S) -> list[Finding]:
    """One bounded request to the package index's simple API (the builds' uv resolves
    there)."""
    parts = urllib.parse.urlsplit(index_url.rstrip("/") + "/pip/")
    headers = {"Accept": "text/html"}
    if parts.username is not None:  # credentials go in a header, never in a message
        user, secret = (urllib.parse.unquote(x or "") for x in (parts.username, parts.password))
        token = f"{user}:{secret}"
        headers["Authorization"] = "Basic " + base64.b64encode(token.encode()).decode()
        parts = parts._replace(netloc=parts.netloc.rsplit("@", 1)[1])
    shown = redact(index_url)
    context = ssl.create_default_context(cafile=str(ca_bundle)) if ca_bundle else None
    request = urllib.request.Request(urllib.parse.urlunsplit(parts), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            status = resp.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError, ssl.SSLError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return [Finding("site.index", FAIL, f"{shown}: {reason} (one request, {timeout:g} s "
                        "at most)", "give the site's index: --index-url (config index_url, "
                        "VERL_ENV_INDEX_URL); behind a TLS proxy also --ca-bundle")]
    if status >= 400:
        return [Finding("site.index", FAIL, f"{shown}: HTTP {status} for the simple page of pip",
                        "check --index-url (a PEP 503 simple index root, .../simple)")]
    return [Finding("site.index", OK, f"{shown} answers (HTTP {status})")]


def run_build_host(*, accelerator: str | None, ca_bundle: Path | None, index_url: str | None,
                   cuda: str | None = None) -> list[Finding]:
    """Every build-host check. ``index_url``: None leaves the index unchecked (no index could
    be told)."""
    engine, findings = check_engine()
    facts = None
    if engine is not None:
        try:
            facts = engine.host_facts()
        except Exception as exc:  # noqa: BLE001 - a report, not a crash: the engine's words
            findings.append(Finding("engine", FAIL, f"{engine.where} did not describe itself: "
                                    f"{exc}", "restart dockerd"))
        else:
            findings.append(Finding("engine", OK, f"{engine.where}: Docker {facts.version}"))
    findings += check_buildkit(facts)
    if facts is not None:
        findings += check_nvidia_toolkit(facts, accelerator)
        findings += check_disk(facts, accelerator)
    findings += check_build_host_driver(cuda, accelerator)
    findings += check_ca_bundle(ca_bundle)
    if index_url:
        findings += check_index(index_url, ca_bundle)
    else:
        findings.append(Finding("site.index", SKIP, "no package index configured",
                                "give --index-url (config index_url, VERL_ENV_INDEX_URL)"))
    return findings


