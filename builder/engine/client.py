"""The connection to a Docker Engine: ``DOCKER_HOST``, else the docker CLI's current context,
else the local socket; and :class:`Engine`, the one object the rest of ``builder`` holds.

Its parts live beside it: :mod:`.buildkit` (builds), :mod:`.containers` (run, export, device
listing), :mod:`.images` (inspect as :class:`~builder.engine.images.ImageInfo`, tag, push) and
:mod:`.platforms` (architectures, emulation).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import docker
import docker.errors
import requests

from builder.engine.buildkit import BuildMixin
from builder.engine.containers import ContainersMixin
from builder.engine.images import ImagesMixin
from builder.errors import EngineError


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


class Engine(BuildMixin, ImagesMixin, ContainersMixin):
    """A connected Docker Engine. ``Engine.connect()`` honours DOCKER_HOST like the docker CLI.
    Connect once per run and hand the engine down (the pipeline does)."""

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

    @property
    def where(self) -> str:
        """``the Docker Engine at unix:///var/run/docker.sock`` (for messages)."""
        return f"the Docker Engine at {self._cli_host() or 'the default socket'}"

    def alive(self, timeout: float = 5) -> bool:
        """Whether the engine answers a ping within ``timeout`` seconds (never raises)."""
        api = self.client.api
        try:
            return api._result(api._get(api._url("/_ping"), timeout=timeout)) == "OK"
        except Exception:  # noqa: BLE001 - any failure means it does not answer
            return False

