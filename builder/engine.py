"""The only module that talks to the Docker Engine (through the ``docker`` SDK).

Build events are scanned one by one: progress (``Step N/M``), cache hits and errors are surfaced,
never swallowed. Containers started here are always removed, also on SIGINT/SIGTERM (see
:func:`interrupts_raise`).
"""

from __future__ import annotations

import contextlib
import re
import resource
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests
import urllib3.exceptions

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

    def run(self, image: str, command: list[str], *, timeout: float, network: str = "none",
            mounts: dict[str, dict[str, str]] | None = None, environment: dict[str, str] | None = None,
            gpus: str | None = None, shm_size: str = "2g") -> RunResult:
        """Run a container to completion (or kill it at ``timeout``); it is always removed."""
        kwargs: dict[str, Any] = {}
        if gpus == "nvidia":
            kwargs["device_requests"] = [docker.types.DeviceRequest(count=-1,
                                                                    capabilities=[["gpu"]])]
        elif gpus == "amd":
            kwargs.update(devices=["/dev/kfd:/dev/kfd", "/dev/dri:/dev/dri"], group_add=["video"],
                          security_opt=["seccomp=unconfined"])
        name = f"verl-env-{uuid.uuid4().hex[:12]}"
        start = time.monotonic()
        container = None
        try:
            container = self.client.containers.create(
                image, command, name=name, network_mode=network, volumes=mounts or {},
                environment=environment or {}, shm_size=shm_size, labels={OWNER_LABEL: "verify"},
                ulimits=[_memlock()], **kwargs)
            container.start()
            try:
                status = container.wait(timeout=timeout)
                code: int | None = int(status.get("StatusCode", -1))
            except requests.exceptions.ConnectionError:
                container.kill()
                code = None
            logs = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
            return RunResult(code, logs, time.monotonic() - start)
        except docker.errors.ImageNotFound:
            raise EngineError(f"no such image: {image}") from None
        except docker.errors.APIError as exc:
            raise EngineError(f"could not run {image}: {exc.explanation or exc}") from None
        finally:
            if container is not None:
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    container.remove(force=True)

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
