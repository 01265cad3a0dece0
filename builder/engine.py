"""The only module that talks to the Docker Engine (through the ``docker`` SDK).

Build events are scanned one by one: progress (``Step N/M``), cache hits and errors are surfaced,
never swallowed. Containers started here are always removed, also on SIGINT/SIGTERM (see
:func:`interrupts_raise`).
"""

from __future__ import annotations

import contextlib
import io
import re
import resource
import signal
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from builder.errors import EngineError

_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)")
# Every container this tool starts carries this label, so leftovers are findable.
OWNER_LABEL = "org.verl-env.owner"


@dataclass
class BuildProgress:
    step: int = 0
    total: int = 0
    instruction: str = ""
    cache_hits: int = 0
    started: float = field(default_factory=time.monotonic)
    steps: list[dict[str, Any]] = field(default_factory=list)  # per step: seconds, cached

    def begin(self, step: int, total: int, instruction: str) -> None:
        now = time.monotonic()
        if self.steps:
            self.steps[-1]["seconds"] = round(now - self.steps[-1].pop("_t0"), 2)
        self.step, self.total, self.instruction = step, total, instruction
        self.steps.append({"step": step, "instruction": instruction[:100], "cached": False,
                           "_t0": now})

    def end(self) -> None:
        if self.steps and "_t0" in self.steps[-1]:
            self.steps[-1]["seconds"] = round(time.monotonic() - self.steps[-1].pop("_t0"), 2)

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


def _memlock() -> docker.types.Ulimit:
    """As much locked memory as this host allows (unlimited where it may: RDMA registration);
    asking for more than the host's hard limit makes runc refuse to start the container."""
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    value = -1 if hard == resource.RLIM_INFINITY else hard
    return docker.types.Ulimit(name="memlock", soft=value, hard=value)


class Engine:
    """A connected Docker Engine. ``Engine.connect()`` honours DOCKER_HOST like the docker CLI."""

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client

    @classmethod
    def connect(cls) -> Engine:
        try:
            client = docker.from_env(timeout=600)
            client.ping()
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise EngineError(f"cannot reach the Docker Engine ({exc.__class__.__name__}: {exc}); "
                              "is dockerd running and DOCKER_HOST right?") from None
        return cls(client)

    # ----------------------------------------------------------------------- images

    def build(self, context: Path, *, target: str, network: str | None = "host",
              on_event: Callable[[BuildProgress, str], None] | None = None) -> BuildResult:
        """Build ``context/Dockerfile`` (untagged). Raises EngineError naming the failed step."""
        progress = BuildProgress()
        log: list[str] = []
        image_id = None
        stream = self.client.api.build(path=str(context), rm=True, forcerm=True, decode=True,
                                       network_mode=network, pull=False)
        try:
            for event in stream:
                if "error" in event or "errorDetail" in event:
                    detail = event.get("errorDetail", {}).get("message") or event.get("error")
                    raise EngineError(
                        f"build failed at step {progress.step}/{progress.total} "
                        f"({progress.instruction[:120]}): {str(detail).strip()}\n"
                        + "".join(log[-15:]), target=target)
                text = event.get("stream", "")
                if "aux" in event and "ID" in event["aux"]:
                    image_id = event["aux"]["ID"]
                if not text:
                    continue
                log.append(text)
                m = _STEP.match(text.strip())
                if m:
                    progress.begin(int(m.group(1)), int(m.group(2)), m.group(3))
                elif text.strip() == "---> Using cache":
                    progress.cache_hits += 1
                    progress.steps[-1]["cached"] = True
                if on_event:
                    on_event(progress, text)
        finally:
            close = getattr(stream, "close", None)
            if close:
                close()  # on interrupt: drops the connection, and dockerd cancels the build
        if image_id is None:
            match = re.search(r"Successfully built ([0-9a-f]{12,})", "".join(log))
            if not match:
                raise EngineError("build ended without an image ID", target=target)
            image_id = self.client.images.get(match.group(1)).id
        progress.end()
        return BuildResult(image_id, progress.total, progress.cache_hits, progress.elapsed,
                           "".join(log), tuple(progress.steps))

    def image(self, ref: str) -> Any:
        try:
            return self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            raise EngineError(f"no such image: {ref}") from None

    def tag(self, image_id: str, ref: str) -> None:
        repo, _, tag = ref.rpartition(":") if ":" in ref.split("/")[-1] else (ref, "", "latest")
        if not self.client.api.tag(image_id, repo, tag, force=True):
            raise EngineError(f"could not tag {image_id[:19]} as {ref}")

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
        if gpus == "nvidia":
            kwargs["device_requests"] = [docker.types.DeviceRequest(count=-1,
                                                                    capabilities=[["gpu"]])]
        elif gpus == "amd":
            kwargs.update(devices=["/dev/kfd:/dev/kfd", "/dev/dri:/dev/dri"], group_add=["video"],
                          security_opt=["seccomp=unconfined"])
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

    def leftover_containers(self) -> list[str]:
        return [c.name for c in self.client.containers.list(all=True,
                                                            filters={"label": OWNER_LABEL})]
