"""The only module that talks to the Docker Engine.

Builds go through BuildKit (the Dockerfile uses ``RUN --mount``, which the classic builder cannot
parse), driven by a docker CLI that can: ``docker buildx build`` or, with a CLI that has BuildKit
built in (Debian's 20.10 ``docker.io``), ``DOCKER_BUILDKIT=1 docker build``. Inspect, run, tag and
push go through the ``docker`` SDK. Build output (``--progress=plain``) is scanned line by line:
steps, cache hits, per-step seconds and errors are surfaced, never swallowed. The build process
and containers started here are always stopped and removed, also on SIGINT/SIGTERM (see
:func:`interrupts_raise`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests
import urllib3.exceptions

from builder.errors import EngineError
from builder.families import VENDORS

# Every container this tool starts carries this label, so leftovers are findable.
OWNER_LABEL = "org.verl-env.owner"


@dataclass
class BuildProgress:
    """What the build has done so far. ``steps``: one entry per Dockerfile step BuildKit ran or
    found cached (``stage``, ``step`` "x/y", ``instruction``, ``cached``, ``seconds``)."""

    step: int = 0  # steps started so far (BuildKit runs independent steps in parallel)
    total: int = 0  # steps in all stages
    instruction: str = ""
    cache_hits: int = 0
    started: float = field(default_factory=time.monotonic)
    steps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True)
class BuildResult:
    image_id: str
    steps: int
    cache_hits: int
    seconds: float
    log: str
    step_times: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class RunResult:
    exit_code: int | None  # None: killed at the timeout
    logs: str
    seconds: float
    files: Mapping[str, bytes] = field(default_factory=dict)  # collected from the container


def _parents(rel: str) -> list[str]:
    """``a/b/c`` -> ``["a", "a/b"]``."""
    parts = rel.split("/")[:-1]
    return ["/".join(parts[:i + 1]) for i in range(len(parts))]


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt for the duration, so cleanup code runs for both."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def context_host() -> str | None:
    """The endpoint of the docker CLI's current context, as the CLI picks it (``DOCKER_CONTEXT``,
    else ``currentContext`` in the docker config); None for the default context.

    Read from the CLI's context store (``$DOCKER_CONFIG/contexts/meta/<sha256 of the name>/
    meta.json``) directly: the SDK's ``ContextAPI`` finds the store only beside an existing
    ``config.json``, which ``docker context create`` does not write."""
    import hashlib

    config_dir = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")
    name = os.environ.get("DOCKER_CONTEXT")
    if not name:
        try:
            name = json.loads((config_dir / "config.json").read_text()).get("currentContext")
        except (OSError, ValueError):
            name = None
    if not name or name == "default":
        return None
    meta = (config_dir / "contexts" / "meta" / hashlib.sha256(name.encode()).hexdigest()
            / "meta.json")
    try:
        endpoint = json.loads(meta.read_text())["Endpoints"]["docker"]
    except (OSError, ValueError, KeyError, TypeError):
        raise EngineError(f"docker context {name!r} does not exist in {config_dir} "
                          "(docker context ls)") from None
    return str(endpoint.get("Host") or "") or None


def _memlock() -> docker.types.Ulimit:
    """As much locked memory as this host allows (unlimited where it may: RDMA registration);
    asking for more than the host's hard limit makes runc refuse to start the container."""
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    value = -1 if hard == resource.RLIM_INFINITY else hard
    return docker.types.Ulimit(name="memlock", soft=value, hard=value)


# ----------------------------------------------------------------------------- BuildKit


CLI_OVERRIDE = "VERL_ENV_DOCKER_CLI"  # a docker executable to build with (probed like the others)
# Tried after every `docker` on PATH: Debian's docker.io CLI, which has a BuildKit client built in.
FALLBACK_CLIS: tuple[str, ...] = ("/usr/bin/docker",)
_PLATFORMS = {"x86_64": "linux/amd64", "amd64": "linux/amd64",
              "aarch64": "linux/arm64", "arm64": "linux/arm64"}
_PROBE_TIMEOUT = 20


# ----------------------------------------------------------------------------- emulation

BINFMT_DIR = "/proc/sys/fs/binfmt_misc"
# QEMU's binfmt_misc handler name per platform architecture (qemu-user-static's names).
_QEMU = {"arm64": "aarch64", "amd64": "x86_64"}
EMULATION_PACKAGES = "qemu-user-static binfmt-support"


def emulation_problem(platform: str, binfmt_dir: str = BINFMT_DIR) -> str | None:
    """Why this machine cannot run ``platform`` binaries under QEMU user emulation, or None.

    What Docker needs: binfmt_misc mounted, the ``qemu-<arch>`` handler registered and enabled,
    with the F (fix-binary) flag, so that the interpreter is opened at registration and works
    inside containers, whose root filesystem does not hold it.
    """
    arch = platform_of(platform).split("/", 1)[1]
    qemu = f"qemu-{_QEMU.get(arch, arch)}"
    install = (f"apt-get install {EMULATION_PACKAGES}, then `mount -t binfmt_misc binfmt_misc "
               f"{binfmt_dir}` (if not mounted) and `update-binfmts --enable {qemu}`")
    if not os.path.exists(os.path.join(binfmt_dir, "status")):
        return f"binfmt_misc is not mounted at {binfmt_dir}: {install}"
    handler = os.path.join(binfmt_dir, qemu)
    try:
        text = Path(handler).read_text()
    except OSError:
        return f"no QEMU binfmt_misc handler {handler} for {platform_of(platform)}: {install}"
    lines = text.splitlines()
    if not lines or lines[0].strip() != "enabled":
        return f"the QEMU handler {handler} is disabled: {install}"
    flags = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("flags:")), "")
    if "F" not in flags:
        shown = flags or "none"
        return (f"the QEMU handler {handler} lacks the F (fix-binary) flag (flags: {shown}), so "
                f"its interpreter is not found inside containers: re-register it with "
                f"qemu-user-static's binfmt file (update-binfmts --import {qemu})")
    return None


@dataclass(frozen=True)
class BuildKitCli:
    """How to start a BuildKit build: ``argv`` + options, with ``env`` added."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    @property
    def kind(self) -> str:
        return "buildx" if "buildx" in self.argv else "builtin"

    def __str__(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env)
        return f"{env} {' '.join(self.argv)}".strip()


_cli_cache: dict[tuple[str, str], BuildKitCli] = {}


def _probe(argv: list[str], env: dict[str, str] | None = None) -> str | None:
    """stdout+stderr of a quick local command (never reaches a daemon), or None if it failed."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=_PROBE_TIMEOUT,
                              env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout + proc.stderr if proc.returncode == 0 else None


def _docker_candidates() -> list[str]:
    """Every distinct ``docker`` executable: the override, those on PATH, then the fallbacks."""
    found: list[str] = []
    override = os.environ.get(CLI_OVERRIDE)
    if override:
        return [shutil.which(override) or override]
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        exe = shutil.which("docker", path=d) if d else None
        if exe:
            found.append(exe)
    found += [f for f in FALLBACK_CLIS if os.access(f, os.X_OK)]
    unique: list[str] = []
    for exe in found:
        if os.path.realpath(exe) not in {os.path.realpath(u) for u in unique}:
            unique.append(exe)
    return unique


def find_buildkit_cli() -> BuildKitCli:
    """The first docker CLI that can drive a BuildKit build: ``buildx`` (any candidate), else a
    CLI with a built-in BuildKit client (``DOCKER_BUILDKIT=1 docker build`` knows ``--secret``;
    a 23+ CLI without buildx refuses even ``--help``). Cached per PATH and override."""
    key = (os.environ.get("PATH", ""), os.environ.get(CLI_OVERRIDE, ""))
    if key in _cli_cache:
        return _cli_cache[key]
    candidates = _docker_candidates()
    chosen: BuildKitCli | None = None
    for exe in candidates:
        if _probe([exe, "buildx", "version"]) is not None:
            chosen = BuildKitCli((exe, "buildx", "build", "--load"))
            break
    if chosen is None:
        for exe in candidates:
            out = _probe([exe, "build", "--help"], {"DOCKER_BUILDKIT": "1"})
            if out and "--secret" in out and "--iidfile" in out:
                chosen = BuildKitCli((exe, "build"), (("DOCKER_BUILDKIT", "1"),))
                break
    if chosen is None:
        tried = ", ".join(candidates) or "none (no `docker` on PATH)"
        where = f" (from {CLI_OVERRIDE})" if os.environ.get(CLI_OVERRIDE) else ""
        raise EngineError(
            "BuildKit is required (the Dockerfile uses RUN --mount, which the classic builder "
            f"cannot parse), but no docker CLI here can drive it; tried{where}: {tried} "
            "(no `docker buildx`, no built-in BuildKit client). Enable it: install the buildx "
            "plugin (Debian/Ubuntu: apt-get install docker-buildx; Docker's packages: "
            "docker-buildx-plugin), or Debian's docker.io CLI (built-in BuildKit client, "
            f"/usr/bin/docker), or set {CLI_OVERRIDE} to a docker CLI that has either.")
    _cli_cache[key] = chosen
    return chosen


def platform_of(arch_or_platform: str) -> str:
    """``x86_64`` -> ``linux/amd64``, ``arm64``/``aarch64`` -> ``linux/arm64``; platforms pass."""
    if "/" in arch_or_platform:
        return arch_or_platform
    try:
        return _PLATFORMS[arch_or_platform]
    except KeyError:
        raise EngineError(f"unknown architecture {arch_or_platform!r} "
                          f"(known: {', '.join(sorted(_PLATFORMS))})") from None


# `--progress=plain` lines: `#5 [runtime 2/13] RUN ...`, `#5 CACHED`, `#5 DONE 1.2s`,
# `#5 ERROR: ...`, `#5 0.532 <output of the step>`; internal vertices (`[internal] load ...`,
# `exporting to image`) are not steps.
_VERTEX = re.compile(r"^#(\d+) \[(?:(?P<stage>[^\]]*?)\s+)?(?P<x>\d+)/(?P<y>\d+)\] (?P<text>.*)$")
_STATE = re.compile(r"^#(\d+) (CACHED|DONE ([\d.]+)s|ERROR:? ?(.*)|CANCELED.*)$")
_OUTPUT = re.compile(r"^#(\d+) \d+\.\d+ (.*)$")


class PlainProgress:
    """Parses BuildKit's ``--progress=plain`` output into a :class:`BuildProgress`."""

    def __init__(self, progress: BuildProgress) -> None:
        self.progress = progress
        self.vertices: dict[str, dict[str, Any]] = {}  # vertex id -> its entry in progress.steps
        self.output: dict[str, deque[str]] = {}  # vertex id -> the tail of its log
        self.stage_totals: dict[str, int] = {}
        self.failed: list[tuple[dict[str, Any] | None, str]] = []
        self.other: deque[str] = deque(maxlen=30)  # lines outside any vertex (final errors)

    def feed(self, line: str) -> None:
        line = line.rstrip("\n")
        p = self.progress
        m = _VERTEX.match(line)
        if m:
            vid = m.group(1)
            if vid not in self.vertices:
                stage = (m.group("stage") or "").strip()
                self.stage_totals[stage] = int(m.group("y"))
                p.total = sum(self.stage_totals.values())
                p.step += 1
                p.instruction = m.group("text")
                entry = {"step": p.step, "stage": stage, "at": f"{m.group('x')}/{m.group('y')}",
                         "instruction": m.group("text")[:100], "cached": False, "seconds": 0.0}
                self.vertices[vid] = entry
                p.steps.append(entry)
            return
        m = _STATE.match(line)
        if m:
            entry = self.vertices.get(m.group(1))
            state = m.group(2)
            if state == "CACHED" and entry is not None and not entry["cached"]:
                entry["cached"] = True
                # a base image is reported CACHED once any build used it: not a hit of ours
                p.cache_hits += not entry["instruction"].startswith("FROM ")
            elif state.startswith("DONE") and entry is not None:
                entry["seconds"] = float(m.group(3))
            elif state.startswith("ERROR"):
                self.failed.append((entry, m.group(4) or ""))
            return
        m = _OUTPUT.match(line)
        if m:
            self.output.setdefault(m.group(1), deque(maxlen=15)).append(m.group(2))
            return
        if line and not line.startswith("#"):
            self.other.append(line)

    def error(self) -> str:
        """The failed step, BuildKit's message and the tail of that step's log."""
        for entry, message in self.failed:
            if entry is None:
                continue
            vid = next(v for v, e in self.vertices.items() if e is entry)
            where = f"{entry['stage']} {entry['at']}".strip()
            tail = "\n".join(self.output.get(vid, ()))
            return (f"build failed at step {where} ({entry['instruction'][:120]}): "
                    f"{message.strip()}\n{tail}")
        detail = "\n".join(line for line in self.other if line.strip()) or "no output"
        return f"build failed before any step ran:\n{detail}"


def _stop_group(proc: subprocess.Popen[str], grace: float = 10) -> None:
    """Stop a build CLI and everything it started (its own process group): the daemon sees the
    session close and cancels the build."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


class Engine:
    """A connected Docker Engine. ``Engine.connect()`` honours DOCKER_HOST like the docker CLI."""

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client

    @classmethod
    def connect(cls) -> Engine:
        """The engine the docker CLI would use: ``DOCKER_HOST``, else the current docker context
        (``DOCKER_CONTEXT``, else the config's ``currentContext``; ``ssh://`` included), else the
        local socket. A login node can so drive a remote build node end to end."""
        host = None if os.environ.get("DOCKER_HOST") else context_host()
        try:
            if host:
                client = docker.DockerClient(base_url=host, timeout=600,
                                             use_ssh_client=host.startswith("ssh://"))
            else:
                client = docker.from_env(timeout=600)
            client.ping()
        except (docker.errors.DockerException, requests.RequestException) as exc:
            where = f"the docker context's {host}" if host else "DOCKER_HOST"
            raise EngineError(f"cannot reach the Docker Engine ({exc.__class__.__name__}: {exc}); "
                              f"is dockerd running and {where} right?") from None
        engine = cls(client)
        engine.host = host
        return engine

    # ----------------------------------------------------------------------- images

    # Where the build CLI sends its requests; None: the SDK's own (see _cli_host). Set it when
    # the engine was connected to a host the environment does not name (a docker context).
    host: str | None = None

    def build(self, context: Path, *, target: str, network: str | None = "host",
              platform: str | None = None, secrets: dict[str, Path] | None = None,
              on_event: Callable[[BuildProgress, str], None] | None = None) -> BuildResult:
        """Build ``context/Dockerfile`` with BuildKit (untagged) on this engine's daemon.

        ``network``: for RUN steps (``host``; None: the daemon's default). ``platform``: the
        target's arch or platform; ``--platform`` is passed only when it differs from the
        daemon's. ``secrets``: BuildKit secrets (id -> file), e.g. the site CA. Raises EngineError
        naming the failed step; on SIGINT/SIGTERM (KeyboardInterrupt, see interrupts_raise) the
        build process group is killed, which cancels the build: nothing is tagged.
        """
        cli = find_buildkit_cli()
        progress = BuildProgress()
        parser = PlainProgress(progress)
        log: deque[str] = deque(maxlen=2000)
        with tempfile.TemporaryDirectory(prefix="verl-env-build-") as tmp:
            iidfile = Path(tmp) / "iid"
            cmd = [*cli.argv, "--progress=plain", "--iidfile", str(iidfile),
                   "--file", str(Path(context) / "Dockerfile")]
            if network:
                cmd += ["--network", network]
            wanted = platform_of(platform) if platform else None
            if wanted and wanted != self._daemon_platform():
                self.require_emulation(wanted, target=target)
                cmd += ["--platform", wanted]
            for sid, src in sorted((secrets or {}).items()):
                if not Path(src).is_file():
                    raise EngineError(f"build secret {sid}: no such file {src}", target=target)
                cmd.append(f"--secret=id={sid},src={Path(src).resolve()}")
            cmd.append(str(context))
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=self._cli_env(cli), text=True,
                                    errors="replace", start_new_session=True)
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    log.append(line)
                    parser.feed(line)
                    if on_event:
                        on_event(progress, line)
                code = proc.wait()
            finally:
                _stop_group(proc)
            if code != 0:
                why = parser.error()
                if "exec format error" in "".join(log).lower():
                    why += (f" (exec format error: a foreign-architecture binary ran without QEMU "
                            f"emulation on the engine's host; install {EMULATION_PACKAGES} there)")
                raise EngineError(why, target=target)
            image_id = iidfile.read_text().strip() if iidfile.is_file() else ""
        if not image_id.startswith("sha256:"):
            raise EngineError(f"build ended without an image ID ({cli} wrote no --iidfile)",
                              target=target)
        return BuildResult(image_id, progress.total, progress.cache_hits, progress.elapsed,
                           "".join(log), tuple(progress.steps))

    def prune_build_cache(self) -> int:
        """Drop the whole BuildKit cache, cache mounts (the uv cache) included; bytes freed."""
        try:
            return int(self.client.api.prune_builds(all=True).get("SpaceReclaimed") or 0)
        except docker.errors.APIError as exc:
            raise EngineError(f"could not prune the build cache: {exc.explanation or exc}"
                              ) from None

    def is_local(self) -> bool:
        """Whether the daemon runs on this machine (a unix socket), so that this machine's
        kernel is the one that runs its containers."""
        # docker-py names a unix socket's base URL http+docker://localhost; an ssh:// engine's
        # is http+docker://ssh, a TCP one's the address itself (possibly another machine).
        return str(getattr(self.client.api, "base_url", "")) == "http+docker://localhost"

    def require_emulation(self, platform: str, *, target: str | None = None) -> None:
        """Before a foreign-platform build or run: raise EngineError naming what to install when
        the kernel cannot run ``platform`` binaries. Only a local daemon's kernel can be checked
        from here; a remote engine host fails its first foreign RUN step with "exec format
        error", which :meth:`build` explains the same way."""
        if not self.is_local():
            return
        why = emulation_problem(platform)
        if why:
            raise EngineError(f"cannot build or run {platform_of(platform)} images on this "
                              f"{self._daemon_platform()} host without QEMU emulation: {why}",
                              target=target)

    def _daemon_platform(self) -> str:
        version = self.client.version()
        return f"{version.get('Os', 'linux')}/{platform_of(version.get('Arch', 'amd64'))[6:]}"

    def _cli_host(self) -> str | None:
        """The daemon the SDK talks to, as a docker CLI ``DOCKER_HOST``; None: leave it to the
        CLI's environment (e.g. ssh://, which the SDK got from DOCKER_HOST too)."""
        if self.host:
            return self.host
        adapter = getattr(self.client.api, "_custom_adapter", None)
        socket_path = getattr(adapter, "socket_path", None)
        if socket_path:
            return f"unix://{socket_path}"
        base = str(getattr(self.client.api, "base_url", ""))
        if base.startswith(("http://", "https://")):
            return "tcp://" + base.split("://", 1)[1]
        return os.environ.get("DOCKER_HOST")

    def _cli_env(self, cli: BuildKitCli) -> dict[str, str]:
        env = {**os.environ, **dict(cli.env)}
        host = self._cli_host()
        if host:
            env["DOCKER_HOST"] = host
            env.pop("DOCKER_CONTEXT", None)  # DOCKER_HOST wins anyway; say so
        return env

    def image(self, ref: str) -> Any:
        try:
            return self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            raise EngineError(f"no such image: {ref}") from None

    def find(self, ref: str) -> str | None:
        """The image ID that ``ref`` names, or None when the engine has no such image."""
        try:
            return str(self.client.images.get(ref).id)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            raise EngineError(f"cannot inspect {ref}: {exc.explanation or exc}") from None

    def identity(self, ref: str) -> str:
        """What a base reference resolves to: its repo digest (``name@sha256:...``) when it
        came from a registry, else its image ID (a local base). Pulled when absent."""
        if "@sha256:" in ref:
            return ref
        try:
            image = self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            try:
                image = self.client.images.pull(ref)
            except (docker.errors.APIError, docker.errors.ImageNotFound) as exc:
                raise EngineError(f"base image {ref} is not in the engine and cannot be pulled "
                                  f"({getattr(exc, 'explanation', None) or exc})") from None
        digests = image.attrs.get("RepoDigests") or []
        return str(digests[0]) if digests else str(image.id)

    def tag_once(self, image_id: str, ref: str) -> None:
        """Apply an immutable name: a no-op when ``ref`` already names ``image_id``, an error
        when it names another image (a content tag never moves)."""
        current = self.find(ref)
        if current == image_id:
            return
        if current is not None:
            raise EngineError(f"{ref} already names image {current[:19]}, not {image_id[:19]}: "
                              "a content tag never moves (remove it by hand if it is stale)")
        self.tag(image_id, ref)

    def tag(self, image_id: str, ref: str) -> None:
        repo, _, tag = ref.rpartition(":") if ":" in ref.split("/")[-1] else (ref, "", "latest")
        if not self.client.api.tag(image_id, repo, tag, force=True):
            raise EngineError(f"could not tag {image_id[:19]} as {ref}")

    def push(self, repository: str, tag: str, *, auth_config: dict[str, str] | None = None
             ) -> Iterator[dict[str, Any]]:
        """The engine's push of ``repository:tag``, as its stream of decoded events (the caller
        scans every event: a push stream never raises for a refused layer). The engine does the
        registry's auth flow (Basic or Bearer) itself with ``auth_config``."""
        try:
            yield from self.client.images.push(repository, tag=tag, stream=True, decode=True,
                                               auth_config=auth_config)
        except (docker.errors.APIError, requests.RequestException) as exc:
            raise EngineError(f"push of {repository}:{tag} broke off: "
                              f"{getattr(exc, 'explanation', None) or exc}") from None

    def remove_candidate(self, image_id: str) -> None:
        """Remove an image only while no tag names it (a candidate nobody released), keeping its
        parent layers (the build cache). A cached rebuild of a released image is left alone."""
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            if not self.client.images.get(image_id).tags:
                self.client.api.remove_image(image_id, noprune=True)

    # ----------------------------------------------------------------------- containers

    def run(self, image: str, command: Sequence[str], *, entrypoint: Sequence[str],
            timeout: float, network: str = "none", files: Mapping[str, bytes] | None = None,
            dirs: Sequence[str] = (), collect: Sequence[str] = (),
            environment: dict[str, str] | None = None, gpus: str | None = None,
            shm_size: str = "2g", role: str = "verify") -> RunResult:
        """Run a container to completion (or kill it at ``timeout``); it is always removed.

        ``entrypoint`` always replaces the image's ENTRYPOINT (and ``command`` its CMD), so a
        vendor image whose entrypoint is a shell or a launcher runs exactly ``command``. Nothing
        of this machine is bind-mounted (the engine may be remote): ``files`` (absolute path in
        the container -> content) and ``dirs`` (empty, world-writable) are copied in through the
        engine before the start, and ``collect`` paths are copied out after the exit, into
        ``RunResult.files`` (a path the container did not write is absent there).
        """
        kwargs: dict[str, Any] = {}
        vendor = VENDORS.get(gpus or "")
        if gpus and vendor is None:
            raise EngineError(f"unknown GPU vendor {gpus!r} (known: {', '.join(VENDORS)})")
        if vendor and vendor.gpu_request:
            kwargs["device_requests"] = [docker.types.DeviceRequest(count=-1,
                                                                    capabilities=[["gpu"]])]
        if vendor and vendor.devices:
            kwargs.update(devices=[f"{d}:{d}" for d in vendor.devices],
                          group_add=list(vendor.groups), security_opt=list(vendor.security))
        return self._run_container(image, command, entrypoint=entrypoint, timeout=timeout,
                                   network=network, files=files or {}, dirs=dirs,
                                   collect=collect, environment=environment or {},
                                   shm_size=shm_size, role=role, **kwargs)

    def host_devices(self, image: str, globs: Sequence[str], *, dev_root: str = "/dev",
                     timeout: float = 120) -> list[str]:
        """Device nodes matching ``globs`` (relative to ``dev_root``) on the ENGINE's host.

        The engine may run on another machine, so this machine's ``/dev`` says nothing: a short
        container of ``image`` (entrypoint ``/bin/sh``, no network) gets the daemon host's
        ``dev_root`` bind-mounted read-only (a path on the daemon's machine, never a local one)
        and lists what matches. Raises EngineError when the probe cannot run.
        """
        script = ('cd /verl-env-hostdev || exit 3; for g in "$@"; do for f in $g; do '
                  '[ -e "$f" ] && echo "$f"; done; done; exit 0')
        result = self._run_container(
            image, ["-c", script, "probe", *globs], entrypoint=["/bin/sh"], timeout=timeout,
            network="none", files={}, dirs=(), collect=(), environment={}, shm_size="64m",
            role="gpu-probe",
            # a Mount, not a Binds entry: a missing source is an error, never created on the host
            mounts=[docker.types.Mount("/verl-env-hostdev", dev_root, type="bind",
                                       read_only=True)])
        if result.exit_code != 0:
            why = "timed out" if result.exit_code is None else f"exit {result.exit_code}"
            raise EngineError(f"could not list {dev_root} on the engine's host with {image[:19]} "
                              f"({why}): {result.logs.strip()[-300:]}")
        return sorted({line.strip() for line in result.logs.splitlines() if line.strip()})

    def daemon_arch(self) -> str:
        """The engine host's CPU architecture as the daemon reports it (``x86_64``, ``aarch64``)."""
        try:
            return str(self.client.info().get("Architecture") or "")
        except (docker.errors.APIError, requests.RequestException) as exc:
            raise EngineError(f"cannot query the Docker Engine: {exc}") from None

    def _run_container(self, image: str, command: Sequence[str], *, entrypoint: Sequence[str],
                       timeout: float, network: str, files: Mapping[str, bytes],
                       dirs: Sequence[str], collect: Sequence[str], environment: dict[str, str],
                       shm_size: str, role: str, **kwargs: Any) -> RunResult:
        name = f"verl-env-{uuid.uuid4().hex[:12]}"
        start = time.monotonic()
        container = None
        try:
            container = self.client.containers.create(
                image, list(command), entrypoint=list(entrypoint), name=name,
                network_mode=network, environment=environment, shm_size=shm_size,
                labels={OWNER_LABEL: role}, ulimits=[_memlock()], **kwargs)
            if files or dirs:
                self._copy_in(container, files, dirs)
            container.start()
            try:
                status = container.wait(timeout=timeout)
                code: int | None = int(status.get("StatusCode", -1))
            except requests.exceptions.RequestException:
                container.kill()
                code = None
            logs = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
            out = {path: data for path in collect
                   if (data := self._copy_out(container, path)) is not None}
            return RunResult(code, logs, time.monotonic() - start, out)
        except docker.errors.ImageNotFound:
            raise EngineError(f"no such image: {image}") from None
        except docker.errors.APIError as exc:
            raise EngineError(f"could not run {image}: {exc.explanation or exc}") from None
        finally:
            if container is not None:
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    container.remove(force=True)

    @staticmethod
    def _copy_in(container: Any, files: Mapping[str, bytes], dirs: Sequence[str]) -> None:
        """One tar through the engine (``put_archive``): parents 0755, files 0644 and the
        ``dirs`` 1777 (the image may run as any user), all owned by root."""
        buf = io.BytesIO()
        made: set[str] = set()
        now = int(time.time())

        def add_dir(path: str, mode: int) -> None:
            if path in made or path in ("", "."):
                return
            made.add(path)
            info = tarfile.TarInfo(path)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, now
            tar.addfile(info)

        with tarfile.open(fileobj=buf, mode="w") as tar:
            for d in dirs:
                rel = d.strip("/")
                for parent in _parents(rel):
                    add_dir(parent, 0o755)
                add_dir(rel, 0o1777)
            for path, data in sorted(files.items()):
                rel = path.strip("/")
                for parent in _parents(rel):
                    add_dir(parent, 0o755)
                info = tarfile.TarInfo(rel)
                info.size, info.mode, info.mtime = len(data), 0o644, now
                tar.addfile(info, io.BytesIO(data))
        if not container.put_archive("/", buf.getvalue()):
            raise EngineError(f"could not copy files into container {container.name}")

    @staticmethod
    def _copy_out(container: Any, path: str) -> bytes | None:
        """The content of one regular file of a (stopped) container, or None when absent."""
        try:
            stream, _stat = container.get_archive(path)
            raw = b"".join(stream)
        except docker.errors.NotFound:
            return None
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            for member in tar:
                if member.isfile():
                    f = tar.extractfile(member)
                    return f.read() if f else None
        return None

    @contextlib.contextmanager
    def export(self, image: str, *, chunk_size: int = 4 << 20) -> Iterator[Iterator[bytes]]:
        """The image's flattened filesystem as ``docker export`` streams it (the engine applies
        the layers and their whiteouts): a container is created (never started; its entrypoint
        overridden, so images without a command work too), its export streamed, and the
        container always removed when the ``with`` block ends, also on interrupts."""
        container = None
        try:
            container = self.client.containers.create(
                image, [], entrypoint=["/.verl-env-export-never-started"], network_mode="none",
                name=f"verl-env-export-{uuid.uuid4().hex[:12]}",
                labels={OWNER_LABEL: "export"})
            yield self.client.api.export(container.id, chunk_size=chunk_size)
        except docker.errors.ImageNotFound:
            raise EngineError(f"no such image: {image}") from None
        except docker.errors.APIError as exc:
            raise EngineError(f"could not export {image}: {exc.explanation or exc}") from None
        except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
            raise EngineError(f"export of {image} broke off: {exc}") from None
        finally:
            if container is not None:
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    container.remove(force=True)

    def leftover_containers(self) -> list[str]:
        return [c.name for c in self.client.containers.list(all=True,
                                                            filters={"label": OWNER_LABEL})]
