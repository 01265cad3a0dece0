"""Containers: run one to completion, list the engine host's devices, export an image's
filesystem. Nothing of this machine is bind-mounted (the engine may be remote): files travel
through the engine (``put_archive``/``get_archive``). Every container is removed, also on
SIGINT/SIGTERM, and carries :data:`OWNER_LABEL`, so that leftovers are findable."""

from __future__ import annotations

import contextlib
import io
import os
import resource
import socket
import tarfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import docker
import docker.errors
import requests
import urllib3.exceptions

from builder.engine.client import Daemon
from builder.engine.faults import connection_lost, engine_down
from builder.engine.results import RunResult
from builder.errors import EngineError
from builder.matrix.families import VENDORS

# Every container this tool starts carries this label, so leftovers are findable.
OWNER_LABEL = "org.verl-env.owner"
# ... and these: which host and process started it, so that a later run can tell a container
# whose run died with the engine (or was killed) from one a running build-env still needs.
HOST_LABEL, PID_LABEL = "org.verl-env.run-host", "org.verl-env.run-pid"
_ROLES = {"verify": "the gate's self-test container", "gpu-probe": "the GPU probe container"}


def _run_labels(role: str) -> dict[str, str]:
    return {OWNER_LABEL: role, HOST_LABEL: socket.gethostname(), PID_LABEL: str(os.getpid())}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _parents(rel: str) -> list[str]:
    """``a/b/c`` -> ``["a", "a/b"]``."""
    parts = rel.split("/")[:-1]
    return ["/".join(parts[:i + 1]) for i in range(len(parts))]


def _memlock() -> docker.types.Ulimit:
    """As much locked memory as this host allows (unlimited where it may: RDMA registration);
    asking for more than the host's hard limit makes runc refuse to start the container."""
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    value = -1 if hard == resource.RLIM_INFINITY else hard
    return docker.types.Ulimit(name="memlock", soft=value, hard=value)


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


class Containers:
    """Containers on the connected daemon (a part of :class:`builder.engine.Engine`)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.client = daemon.client

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

    def _run_container(self, image: str, command: Sequence[str], *, entrypoint: Sequence[str],
                       timeout: float, network: str, files: Mapping[str, bytes],
                       dirs: Sequence[str], collect: Sequence[str], environment: dict[str, str],
                       shm_size: str, role: str, **kwargs: Any) -> RunResult:
        name = f"verl-env-{uuid.uuid4().hex[:12]}"
        start = time.monotonic()
        container = None
        what = f"{_ROLES.get(role, f'the {role} container')} {name} (image {image[:19]})"
        try:
            container = self.client.containers.create(
                image, list(command), entrypoint=list(entrypoint), name=name,
                network_mode=network, environment=environment, shm_size=shm_size,
                labels=_run_labels(role), ulimits=[_memlock()], **kwargs)
            if files or dirs:
                _copy_in(container, files, dirs)
            container.start()
            try:
                status = container.wait(timeout=timeout)
                code: int | None = int(status.get("StatusCode", -1))
            except requests.exceptions.RequestException:
                # over a unix socket a read timeout is a ConnectionError too: ask the engine
                if not self.daemon.alive():
                    raise
                container.kill()
                code = None
            logs = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
            out = {path: data for path in collect
                   if (data := _copy_out(container, path)) is not None}
            return RunResult(code, logs, time.monotonic() - start, out)
        except docker.errors.ImageNotFound:
            raise EngineError(f"no such image: {image}") from None
        except docker.errors.APIError as exc:
            raise EngineError(f"could not run {image}: {exc.explanation or exc}") from None
        except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
            if connection_lost(exc) and not self.daemon.alive():
                left = (f"The container {name} stays in the engine; the next build removes it."
                        if container is not None else "")
                raise engine_down(self.daemon, stage="engine", what=what, left=left) from None
            raise
        finally:
            if container is not None:
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError,
                                         requests.RequestException,
                                         urllib3.exceptions.HTTPError):
                    container.remove(force=True)

    @contextlib.contextmanager
    def export(self, image: str, *, chunk_size: int = 4 << 20) -> Iterator[Iterator[bytes]]:
        """The image's flattened filesystem as ``docker export`` streams it (the engine applies
        the layers and their whiteouts): a container is created (never started; its entrypoint
        overridden, so images without a command work too), its export streamed, and the
        container always removed when the ``with`` block ends, also on interrupts."""
        container = None
        # a run killed during its export (SIGKILL: no cleanup ran) left its never-started
        # container, which holds nothing: the next export removes it
        self.remove_orphans(role="export")
        try:
            container = self.client.containers.create(
                image, [], entrypoint=["/.verl-env-export-never-started"], network_mode="none",
                name=f"verl-env-export-{uuid.uuid4().hex[:12]}",
                labels=_run_labels("export"))
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

    def remove_orphans(self, role: str | None = None) -> list[str]:
        """Remove the stopped containers that a run of this tool on this host left behind when
        it died (its process is gone: killed, or the engine died under it and was restarted);
        a container a live run still uses is never touched. ``role``: only those of this role
        (``export``, ``verify``, ...). Returns their names."""
        removed = []
        here = socket.gethostname()
        for c in self.client.containers.list(all=True, filters={"label": PID_LABEL}):
            labels = c.labels or {}
            pid = labels.get(PID_LABEL, "")
            if (labels.get(HOST_LABEL) != here or not pid.isdigit() or _pid_alive(int(pid))
                    or c.status not in ("created", "exited", "dead")
                    or (role is not None and labels.get(OWNER_LABEL) != role)):
                continue
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                c.remove(force=True)
                removed.append(c.name)
        return removed
