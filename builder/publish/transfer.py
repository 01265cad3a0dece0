"""The registry side of a publish that every kind shares: the client with its credentials
(:func:`connect`), retries with backoff on transient errors (:func:`retrying`), the access check
(:func:`preflight`), the image pushed through the engine and read back by digest
(:func:`push_image`, :func:`read_back`), and the release tags moved last (:func:`release_tags`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

from builder.engine import ContainerEngine, ImageInfo
from builder.errors import PublishError, PublishInfraError
from builder.engine.credentials import resolve_credentials
from builder.registry.api import TIMEOUT_S, Client, Transient, parse_reference

MANIFEST_ACCEPT = ("application/vnd.docker.distribution.manifest.v2+json, "
                   "application/vnd.oci.image.manifest.v1+json")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
RETRY_BASE_S = 1.0
PREFLIGHT_ATTEMPTS = 2
PREFLIGHT_TIMEOUT_S = 10.0
# what the engine (Go's net/http) says when the registry went away or answered 50x mid-push;
# "server closed idle connection" is a kept-alive connection the dead registry closed
_TRANSIENT = re.compile(r"\b(50[0-4])\b|connection reset|broken pipe|unexpected EOF|\bEOF\b|"
                        r"timeout|temporarily unavailable|connection refused|"
                        r"closed idle connection|use of closed network connection", re.IGNORECASE)
_AUTH = re.compile(r"unauthorized|authentication required|denied|no basic auth", re.IGNORECASE)
T = TypeVar("T")


# --------------------------------------------------------------------------- registry access


def connect(text: str, *, insecure: bool = False, timeout: float = TIMEOUT_S
            ) -> tuple[Client, str]:
    """The registry client with its credentials resolved, and where they came from."""
    host, repo, scheme = parse_reference(text, insecure=insecure)
    creds = resolve_credentials(host)
    return Client(host, repo, scheme, creds, timeout), creds.source if creds else "none"


def retrying(action: Callable[[], T], what: str, attempts: int) -> T:
    """Run ``action``; on :class:`Transient` errors retry with exponential backoff."""
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Transient as exc:
            if attempt == attempts:
                raise PublishInfraError(f"{what}: still failing after {attempts} attempts: "
                                        f"{exc}") from None
            time.sleep(min(RETRY_BASE_S * 2 ** (attempt - 1), 30.0))
    raise AssertionError("unreachable")


def check_access(reg: Client, attempts: int) -> None:
    """``GET /v2/`` with the credentials, then push access to the repository: a clear error
    before anything is uploaded."""
    retrying(reg.check_api, f"{reg.host}: API check", attempts)
    retrying(reg.check_push, f"{reg.host}: push access check", attempts)


def preflight(registry_text: str, *, insecure: bool = False,
              attempts: int = PREFLIGHT_ATTEMPTS) -> None:
    """Before a build with ``--push``: the registry is reachable and the credentials found for
    it are accepted for pushing to its repository. Raises :class:`PublishError` in seconds."""
    reg, _ = connect(registry_text, insecure=insecure, timeout=PREFLIGHT_TIMEOUT_S)
    check_access(reg, attempts)


def manifest_digest(reg: Client, reference: str, attempts: int,
                    accept: str = MANIFEST_ACCEPT) -> tuple[str, dict[str, Any]]:
    """Read a manifest back: its digest (sha256 of the bytes served, checked against the
    ``Docker-Content-Digest`` header) and its JSON."""
    return retrying(lambda: reg.manifest(reference, accept),
                    f"read back {reg.repo}:{reference}", attempts)


def read_back(reg: Client, reference: str, pushed: str, attempts: int, *,
              accept: str = MANIFEST_ACCEPT, where: str, pushed_by: str) -> dict[str, Any]:
    """The manifest ``reference`` names, read back: it must be the one pushed (``pushed``, the
    digest ``pushed_by`` reported), else :class:`PublishError`. Returns its JSON."""
    served_digest, served = manifest_digest(reg, reference, attempts, accept=accept)
    if served_digest != pushed:
        raise PublishError(f"{where}: the registry serves {served_digest}, {pushed_by} {pushed}")
    return served


# --------------------------------------------------------------------------- the image


def push_image(engine: ContainerEngine, image: ImageInfo, reg: Client, tag: str,
               attempts: int) -> str:
    """Tag ``HOST/REPO:TAG`` and push; returns the digest the engine reported. The engine gets
    the credentials as ``auth_config`` and negotiates Basic or Bearer auth itself."""
    ref = f"{reg.host}/{reg.repo}"
    engine.tag(image.id, f"{ref}:{tag}")
    auth = reg.creds.auth_config() if reg.creds else None

    def once() -> str:
        digest = None
        for event in engine.push(ref, tag, auth_config=auth):
            if "error" in event or "errorDetail" in event:
                message = (event.get("errorDetail") or {}).get("message") or event.get("error")
                message = str(message).strip()
                if _AUTH.search(message):
                    raise PublishError(f"push of {ref}:{tag} refused: {message}")
                if _TRANSIENT.search(message):
                    raise Transient(message)
                hint = (" (the registry refuses writes: read-only?)"
                        if re.search(r"\b405\b|unsupported", message, re.IGNORECASE) else "")
                raise PublishError(f"push of {ref}:{tag} failed: {message}{hint}")
            digest = (event.get("aux") or {}).get("Digest") or digest
        if not digest:
            raise PublishError(f"push of {ref}:{tag} ended without a digest")
        return str(digest)

    return retrying(once, f"push {ref}:{tag}", attempts)


def release_tags(reg: Client, moves: list[tuple[str, str, str]], attempts: int,
                 moved: list[str] | None = None) -> list[str]:
    """Point each ``(tag, digest, accept)`` at the manifest already in the registry under that
    digest (its bytes as served, re-``PUT`` under the tag), in order, each read back by tag.
    Returns the tags moved (also appended to ``moved`` as they move); on an error,
    :class:`PublishError` says which were."""
    moved = [] if moved is None else moved
    for tag, digest, accept in moves:
        try:
            _move_tag(reg, tag, digest, accept, attempts)
        except PublishError as exc:
            done = ", ".join(moved) or "none"
            raise exc.__class__(f"{exc.args[0]} (tags moved before this: {done})") from None
        moved.append(tag)
    return moved


def _move_tag(reg: Client, tag: str, digest: str, accept: str, attempts: int) -> None:
    def fetch() -> tuple[str, bytes, str] | None:
        return reg.fetch_manifest(digest, accept)

    got = retrying(fetch, f"read back {reg.repo}@{digest}", attempts)
    assert got is not None
    _, data, media = got

    def put() -> str:
        return reg.put_manifest(tag, data, media or accept)

    retrying(put, f"move tag {reg.host}/{reg.repo}:{tag}", attempts)
    served, _ = manifest_digest(reg, tag, attempts, accept=accept)
    if served != digest:
        raise PublishError(f"{reg.host}/{reg.repo}:{tag} names {served} after it was moved to "
                           f"{digest}")



def staging_tag(tag: str) -> str:
    """The tag the engine pushes the image under (the engine pushes only tags); the release tag
    is moved to the same manifest last, when everything else is in."""
    return f"{tag}-staging"
