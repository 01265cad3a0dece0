"""Registry credentials as the Docker client finds them, first match wins:

1. ``VERL_ENV_REGISTRY_USER``/``VERL_ENV_REGISTRY_PASSWORD``;
2. the Docker config (``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json``):
   ``credHelpers[host]``, else ``credsStore`` (both through ``docker-credential-<name> get``:
   the server address on stdin, ``{"Username": ..., "Secret": ...}`` on stdout), else the
   ``auths`` entry (``auth`` = base64 ``user:password``, or ``username``/``password``, or an
   ``identitytoken``). Keys name a registry as ``docker.auth`` reads them (a URL's host; the
   Hub's hosts as one); ``docker.auth.decode_auth`` reads ``auth``. The helpers are run here,
   with a timeout and their output captured (docker's ``credentials.Store`` has neither).

No secret ever appears in an exception or ``repr``: errors name the host and the file only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker.auth

from builder.errors import PublishError

USER_ENV, PASSWORD_ENV = "VERL_ENV_REGISTRY_USER", "VERL_ENV_REGISTRY_PASSWORD"
DOCKER_HUB_KEY = "https://index.docker.io/v1/"
DOCKER_HUB_HOSTS = ("docker.io", "index.docker.io", "registry-1.docker.io")
HELPER_TIMEOUT_S = 30


# --------------------------------------------------------------------------- credentials


@dataclass(frozen=True)
class Credentials:
    """A user and a secret (a password, or an identity/refresh token when ``identity``)."""

    user: str
    secret: str = field(repr=False)
    source: str  # environment, docker-config, credential-helper:<name>
    identity: bool = False

    def __repr__(self) -> str:
        return f"Credentials(user={self.user!r}, source={self.source!r})"

    def auth_config(self) -> dict[str, str]:
        """What the Docker Engine's push takes (``X-Registry-Auth``)."""
        if self.identity:
            return {"identitytoken": self.secret}
        return {"username": self.user, "password": self.secret}


def docker_config_path() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


def config_keys(host: str) -> list[str]:
    """The names a credential helper is asked for ``host`` under (as ``docker login`` stores
    them): the bare host, then its URL; Docker Hub's under its index URL."""
    if host in DOCKER_HUB_HOSTS:
        return [DOCKER_HUB_KEY, "docker.io"]
    return [host, f"https://{host}"]


def index_name(key: str) -> str:
    """The registry a Docker config key names, as ``docker.auth`` compares them: scheme and
    path stripped, ``index.docker.io`` (and the Hub's other hosts) as ``docker.io``."""
    name = docker.auth.resolve_index_name(key)
    return docker.auth.INDEX_NAME if name in DOCKER_HUB_HOSTS else name


def _for_host(table: dict[str, Any], host: str) -> list[tuple[str, Any]]:
    """The entries of a Docker config table (``auths``, ``credHelpers``) for ``host``: under
    its exact key first, then under any key that names the same registry."""
    return sorted(((k, v) for k, v in table.items() if k == host or index_name(k) ==
                   index_name(host)), key=lambda kv: kv[0] != host)


def _load_config(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PublishError(f"{path}: not readable as JSON ({exc.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise PublishError(f"{path}: not a JSON object")
    return data


def credential_helper(name: str, host: str, origin: str) -> Credentials | None:
    """``docker-credential-<name> get`` for ``host``; None when it knows no credentials."""
    exe = shutil.which(f"docker-credential-{name}")
    if exe is None:
        raise PublishError(f"{origin} names the credential helper {name!r}, but "
                           f"docker-credential-{name} is not on PATH")
    for key in config_keys(host):
        try:
            proc = subprocess.run([exe, "get"], input=key, capture_output=True, text=True,
                                  timeout=HELPER_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PublishError(f"credential helper docker-credential-{name} failed for {host}: "
                               f"{exc.__class__.__name__}") from None
        if proc.returncode != 0:
            # "credentials not found in native keychain" is the protocol's "no entry"
            if "not found" in (proc.stdout + proc.stderr).lower():
                continue
            raise PublishError(f"credential helper docker-credential-{name} failed for {host} "
                               f"(exit {proc.returncode})")
        try:
            out = json.loads(proc.stdout)
            user, secret = str(out.get("Username") or ""), str(out.get("Secret") or "")
        except (ValueError, AttributeError):
            raise PublishError(f"credential helper docker-credential-{name} answered something "
                               f"that is not its JSON for {host}") from None
        if secret:
            identity = user == "<token>"
            return Credentials(user, secret, f"credential-helper:{name}", identity)
    return None


def _from_auths(entry: dict[str, Any], path: Path, key: str) -> Credentials | None:
    if entry.get("identitytoken"):
        return Credentials(str(entry.get("username") or "<token>"), str(entry["identitytoken"]),
                           "docker-config", identity=True)
    if entry.get("auth"):
        try:
            user, password = docker.auth.decode_auth(entry["auth"])
        except (ValueError, UnicodeDecodeError):
            raise PublishError(f"{path}: auths.{key}.auth is not base64 user:password") from None
        if user and password:
            return Credentials(user, password, "docker-config")
    if entry.get("username") and entry.get("password"):
        return Credentials(str(entry["username"]), str(entry["password"]), "docker-config")
    return None


def resolve_credentials(host: str) -> Credentials | None:
    """Credentials for ``host`` (see the module doc for the order), or None (anonymous)."""
    user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
    if user and password:
        return Credentials(user, password, "environment")
    path = docker_config_path()
    config = _load_config(path)
    for key, helper in _for_host(config.get("credHelpers") or {}, host):
        if helper:
            return credential_helper(str(helper), host, f"{path} credHelpers.{key}")
    if config.get("credsStore"):
        found = credential_helper(str(config["credsStore"]), host, f"{path} credsStore")
        if found is not None:
            return found
    for key, entry in _for_host(config.get("auths") or {}, host):
        if isinstance(entry, dict) and (creds := _from_auths(entry, path, key)):
            return creds
    return None
