"""The connection to a Docker daemon: ``DOCKER_HOST``, else the docker CLI's current context,
else the local socket; and :class:`Daemon`, the connected SDK client with what every part of
the Docker engine asks of it (its address, whether it answers, whether it runs here, its data
root). A :class:`Daemon` is an :class:`~builder.engine.protocol.EngineHealth`, so the parts
hand it to :mod:`builder.engine.faults`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import docker
import docker.errors
import requests

from builder.engine.faults import EngineUnreachable, free_space
from builder.engine.results import HostFacts
from builder.errors import EngineError


def context_host() -> str | None:
    """The endpoint of the docker CLI's current context, as the CLI picks it (``DOCKER_CONTEXT``,
    else ``currentContext`` in the docker config); None for the default context.

    Read from the CLI's context store (``$DOCKER_CONFIG/contexts/meta/<sha256 of the name>/
    meta.json``) directly: the SDK's ``ContextAPI`` finds the store only beside an existing
    ``config.json``, which ``docker context create`` does not write."""
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


class Daemon:
    """A connected Docker daemon. ``host``: the address it was reached at when the environment
    does not name it (a docker context); the build CLI is sent there too."""

    def __init__(self, client: docker.DockerClient, host: str | None = None) -> None:
        self.client = client
        self.host = host

    @classmethod
    def connect(cls) -> Daemon:
        """The daemon the docker CLI would use: ``DOCKER_HOST``, else the current docker context
        (``DOCKER_CONTEXT``, else the config's ``currentContext``; ``ssh://`` included), else the
        local socket."""
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
            raise EngineUnreachable(f"cannot reach the Docker Engine ({exc.__class__.__name__}: "
                                    f"{exc}); is dockerd running and {where} right?",
                                    stage="engine") from None
        return cls(client, host)

    @property
    def where(self) -> str:
        """``the Docker Engine at unix:///var/run/docker.sock`` (for messages)."""
        return f"the Docker Engine at {self.cli_host() or 'the default socket'}"

    def alive(self, timeout: float = 5) -> bool:
        """Whether the engine answers a ping within ``timeout`` seconds (never raises)."""
        api = self.client.api
        try:
            return bool(api._result(api._get(api._url("/_ping"), timeout=timeout)) == "OK")
        except Exception:  # noqa: BLE001 - any failure means it does not answer
            return False

    def is_local(self) -> bool:
        """Whether the daemon runs on this machine (a unix socket), so that this machine's
        kernel is the one that runs its containers."""
        # docker-py names a unix socket's base URL http+docker://localhost; an ssh:// engine's
        # is http+docker://ssh, a TCP one's the address itself (possibly another machine).
        return str(getattr(self.client.api, "base_url", "")) == "http+docker://localhost"

    def data_root(self) -> str:
        """The daemon's ``DockerRootDir`` (a path on its host); "" when it does not say."""
        return str(self.client.info().get("DockerRootDir") or "")

    def host_facts(self) -> HostFacts:
        """The engine's version, data root (and the space free there, for a local engine),
        registered runtimes, CDI devices and default builder."""
        info = self.client.info()
        api = self.client.api
        ping = api._get(api._url("/_ping"), timeout=10)
        root = str(info.get("DockerRootDir") or "")
        devices = tuple(str(d.get("ID")) for d in info.get("DiscoveredDevices") or ()
                        if isinstance(d, dict) and d.get("Source") == "cdi" and d.get("ID"))
        return HostFacts(version=str(info.get("ServerVersion") or "unknown"), data_root=root,
                         free_bytes=free_space(self, root),
                         runtimes=tuple(sorted(info.get("Runtimes") or {})),
                         cdi_devices=devices,
                         cdi_spec_dirs=tuple(str(d) for d in info.get("CDISpecDirs") or ()),
                         builder_version=ping.headers.get("Builder-Version"),
                         local=self.is_local())

    def idle_build_cache(self) -> int:
        """Bytes of BuildKit cache no build holds now (``docker builder prune`` frees them)."""
        return sum(int(r.get("Size") or 0)
                   for r in self.client.df().get("BuildCache") or [] if not r.get("InUse"))

    def cli_host(self) -> str | None:
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
