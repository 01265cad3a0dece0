"""The OCI distribution API, spoken directly with ``requests``: credentials, auth, the few
calls ``publish`` needs, and image indexes as data (:class:`Platform`, :func:`index_document`,
:func:`index_entries`: one name for the builds of a stack on several platforms).

Credentials: :func:`builder.engine.credentials.resolve_credentials` (the environment, then
the Docker client's config and credential helpers).

Auth (:class:`Client`): a request goes out without credentials; on ``401`` the
``WWW-Authenticate`` challenge decides. ``Basic``: the request is repeated with the credentials.
``Bearer realm=...,service=...,scope=...``: a token is fetched from the realm (``GET`` with basic
credentials, or anonymously; an identity token is exchanged with the OAuth2 ``POST``
``grant_type=refresh_token``), its ``token``/``access_token`` is cached per scope and sent as
``Authorization: Bearer``. This is what Docker Hub, GHCR, GitLab, Harbor, Quay, NGC and
``distribution`` with ``auth: token`` expect.

No secret (password, identity token, bearer token) ever appears in an exception, ``repr`` or log
line of this module: errors name the host, the user and the HTTP status only.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import re
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from builder.engine.credentials import (DOCKER_HUB_HOSTS, PASSWORD_ENV, USER_ENV, Credentials,
                                        docker_config_path)
from builder.errors import PublishError

TIMEOUT_S = 60
TOKEN_MARGIN_S = 15  # a bearer token is renewed this long before it expires


class Transient(Exception):
    """A registry error worth retrying (5xx, connection reset...)."""


# what ``requests`` raises when the registry (or its token service) went away: before its
# answer, or in the middle of its body
GONE = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)


# --------------------------------------------------------------------------- address


def is_loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    name = name.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def parse_reference(text: str, *, insecure: bool = False) -> tuple[str, str, str]:
    """``HOST[:PORT]/REPO`` -> (host, repo, scheme); Docker Hub's API host for ``docker.io``."""
    host, sep, repo = text.partition("/")
    if not sep or not repo or not re.fullmatch(r"[a-z0-9]+(?:[._/-][a-z0-9]+)*", repo):
        raise PublishError(f"--registry must be HOST[:PORT]/REPO (lower-case repository), "
                           f"got {text!r}")
    if "." not in host and ":" not in host and host != "localhost":
        raise PublishError(f"--registry {text!r}: {host!r} is not a registry host name "
                           f"(write docker.io/{text} for Docker Hub)")
    scheme = "http" if insecure or is_loopback(host) else "https"
    return host, repo, scheme


def api_host(host: str) -> str:
    return "registry-1.docker.io" if host in DOCKER_HUB_HOSTS else host


# --------------------------------------------------------------------------- challenges


_PARAM = re.compile(r'(\w+)=(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))')


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="...",service="..."`` -> ("bearer", {"realm": ..., ...})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3)
              for m in _PARAM.finditer(rest)}
    return scheme.lower(), params


def _registry_errors(r: requests.Response) -> str:
    """The registry's own error codes/messages (never the request's headers)."""
    try:
        errors = r.json().get("errors") or []
        text = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)
    except (ValueError, AttributeError):
        text = ""
    return f" ({text})" if text else ""


# --------------------------------------------------------------------------- the client


@dataclass
class Client:
    """One repository on one registry, with credentials; auth is negotiated on demand."""

    host: str  # as the user wrote it (the engine's name for it)
    repo: str
    scheme: str
    creds: Credentials | None = None
    timeout: float = TIMEOUT_S  # seconds per connect/read (not per transfer)
    _auth: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)  # scope -> header
    _expires: dict[str, float] = field(default_factory=dict, repr=False)  # scope -> monotonic

    def __repr__(self) -> str:
        user = self.creds.user if self.creds else None
        return f"Client({self.host}/{self.repo}, {self.scheme}, user={user!r})"

    @property
    def scope(self) -> str:
        return f"repository:{self.repo}:pull,push"

    def url(self, path: str) -> str:
        return f"{self.scheme}://{api_host(self.host)}/v2/{path}"

    def _who(self) -> str:
        return f"user {self.creds.user!r}" if self.creds and not self.creds.identity else (
            "the identity token" if self.creds else "anonymous")

    def _missing(self) -> PublishError:
        return PublishError(f"{self.host}: the registry requires authentication; set "
                            f"{USER_ENV}/{PASSWORD_ENV}, `docker login {self.host}`, or add it "
                            f"to {docker_config_path()}")

    def _refused(self, what: str) -> PublishError:
        if self.creds is None:
            return self._missing()
        return PublishError(f"{self.host}: authentication failed for {self._who()} "
                            f"({what}; wrong password?)")

    # ------------------------------------------------------------------ tokens

    def _token(self, params: dict[str, str], scope: str) -> tuple[str, float]:
        """A bearer token for ``scope`` and how many seconds it lives (``expires_in``, 60 when
        not given, as the token spec says)."""
        realm = params.get("realm")
        if not realm or urllib.parse.urlsplit(realm).scheme not in ("http", "https"):
            raise PublishError(f"{self.host}: Bearer challenge without a usable realm")
        query = {k: v for k, v in (("service", params.get("service")), ("scope", scope)) if v}
        realm_host = urllib.parse.urlsplit(realm).netloc
        try:
            if self.creds and self.creds.identity:
                r = requests.post(realm, timeout=self.timeout, data={
                    **query, "grant_type": "refresh_token", "client_id": "verl-env",
                    "refresh_token": self.creds.secret})
            else:
                if self.creds:
                    query["account"] = self.creds.user
                auth = (self.creds.user, self.creds.secret) if self.creds else None
                r = requests.get(realm, params=query, auth=auth, timeout=self.timeout)
        except GONE as exc:
            raise Transient(f"token service {realm_host}: {exc.__class__.__name__}") from None
        except requests.RequestException as exc:  # never its text: it may quote a header
            raise PublishError(f"{self.host}: token request to {realm_host} failed: "
                               f"{exc.__class__.__name__}") from None
        if r.status_code >= 500:
            raise Transient(f"token service {realm_host}: HTTP {r.status_code}")
        if r.status_code in (401, 403):
            raise self._refused(f"token service {realm_host} answered HTTP {r.status_code}")
        if r.status_code != 200:
            raise PublishError(f"{self.host}: token service {realm_host} answered HTTP "
                               f"{r.status_code}")
        try:
            body = r.json()
            token = body.get("token") or body.get("access_token")
            lifetime = float(body.get("expires_in") or 60)
        except (ValueError, AttributeError, TypeError):
            token, lifetime = None, 60.0
        if not token or not isinstance(token, str):
            raise PublishError(f"{self.host}: token service {realm_host} answered without a "
                               f"token")
        return token, lifetime

    def _authorize(self, r: requests.Response, scope: str) -> dict[str, str]:
        """The Authorization header that answers ``r``'s challenge (a bearer token's expiry is
        noted: :meth:`request` drops it shortly before, so that a large upload never starts with
        a token about to be refused)."""
        scheme, params = parse_challenge(r.headers.get("WWW-Authenticate", ""))
        if scheme == "basic":
            if self.creds is None:
                raise self._missing()
            if self.creds.identity:
                raise PublishError(f"{self.host}: the registry wants a password (Basic), the "
                                   f"credentials found are an identity token")
            raw = f"{self.creds.user}:{self.creds.secret}".encode()
            return {"Authorization": "Basic " + base64.b64encode(raw).decode()}
        if scheme == "bearer":
            token, lifetime = self._token(params, scope or params.get("scope", ""))
            self._expires[scope] = time.monotonic() + max(lifetime - TOKEN_MARGIN_S, 1.0)
            return {"Authorization": "Bearer " + token}
        raise PublishError(f"{self.host}: HTTP 401 with an auth scheme this tool does not "
                           f"speak ({scheme or 'none'})")

    # ------------------------------------------------------------------ requests

    def request(self, method: str, path: str, *, scope: str | None = None,
                url: str | None = None, body: bytes | Path | None = None,
                headers: dict[str, str] | None = None, ok_401: bool = False,
                negotiate: bool = True) -> requests.Response:
        """One API call, negotiating auth on a 401 (unless not ``negotiate``). 5xx and
        connection errors raise :class:`Transient`; a 401 that survives fresh credentials raises
        :class:`PublishError` (or is returned when ``ok_401``)."""
        scope = self.scope if scope is None else scope
        target = url or self.url(path)
        if time.monotonic() > self._expires.get(scope, float("inf")):
            self._auth.pop(scope, None)
            self._expires.pop(scope, None)
        fresh = False
        for _ in range(3):
            r = self._send(method, target, body, {**(headers or {}), **self._auth.get(scope, {})})
            if r.status_code != 401 or not negotiate:
                return r
            if fresh:
                if ok_401:
                    return r
                raise self._refused(f"{method} {self._short(target)} answered HTTP 401 with "
                                    f"fresh credentials{_registry_errors(r)}")
            self._auth[scope] = self._authorize(r, scope)
            fresh = True
        raise AssertionError("unreachable")

    def _short(self, url: str) -> str:
        return urllib.parse.urlsplit(url).path

    def _send(self, method: str, url: str, body: bytes | Path | None,
              headers: dict[str, str]) -> requests.Response:
        try:
            if isinstance(body, Path):
                with open(body, "rb") as f:
                    headers = {**headers, "Content-Length": str(body.stat().st_size)}
                    r = requests.request(method, url, data=f, headers=headers,
                                              timeout=self.timeout)
            else:
                r = requests.request(method, url, data=body, headers=headers,
                                          timeout=self.timeout)
        except GONE as exc:
            raise Transient(f"{method} {self._short(url)}: {exc.__class__.__name__}") from None
        except requests.RequestException as exc:  # never its text: it may quote a header
            raise PublishError(f"{self.host}: {method} {self._short(url)} failed: "
                               f"{exc.__class__.__name__}") from None
        if r.status_code >= 500:
            raise Transient(f"{method} {self._short(url)}: HTTP {r.status_code}")
        return r

    # ------------------------------------------------------------------ the API

    def check_api(self) -> None:
        """``GET /v2/``: the registry answers and accepts our credentials (or none)."""
        r = self.request("GET", "", scope="")
        if r.status_code != 200:
            raise PublishError(f"{self.host}: /v2/ answered HTTP {r.status_code}; not a "
                               f"registry?")

    def check_push(self) -> None:
        """Push access to the repository: start a blob upload and cancel it. This is the one
        check every registry answers truthfully (a token service may hand out a token with
        fewer rights than asked for, and ``/v2/`` says nothing about one repository)."""
        r = self.request("POST", f"{self.repo}/blobs/uploads/", ok_401=True)
        if r.status_code == 401 and self.creds is None:
            raise self._missing()
        if r.status_code in (401, 403):
            raise PublishError(f"{self.host}: {self._who()} may not push to {self.repo} "
                               f"(HTTP {r.status_code}{_registry_errors(r)})")
        if r.status_code == 404:
            raise PublishError(f"{self.host}: no repository {self.repo} to push to (HTTP 404"
                               f"{_registry_errors(r)}; create it first on this registry?)")
        if r.status_code == 405:
            raise PublishError(f"{self.host}: the registry refuses writes to {self.repo} "
                               f"(HTTP {r.status_code}{_registry_errors(r)}; read-only?)")
        if r.status_code != 202:
            raise PublishError(f"{self.host}: starting an upload to {self.repo} answered HTTP "
                               f"{r.status_code}{_registry_errors(r)}")
        location = r.headers.get("Location")
        if location:  # cancel it, if the token we hold allows (distribution wants "delete")
            try:
                self.request("DELETE", "", url=self._absolute(location), negotiate=False)
            except (Transient, PublishError):
                pass  # an abandoned upload session expires on its own

    def _absolute(self, location: str) -> str:
        return urllib.parse.urljoin(f"{self.scheme}://{api_host(self.host)}/", location)

    def _served_digest(self, r: requests.Response, reference: str) -> str:
        """The digest of the manifest bytes served, checked against ``Docker-Content-Digest``."""
        digest = "sha256:" + hashlib.sha256(r.content).hexdigest()
        header = r.headers.get("Docker-Content-Digest")
        if header and header != digest:
            raise PublishError(f"{self.repo}:{reference}: registry digest {header} differs "
                               f"from the manifest it served ({digest})")
        return digest

    def manifest(self, reference: str, accept: str) -> tuple[str, dict[str, Any]]:
        """A manifest's digest (sha256 of the bytes served, checked against
        ``Docker-Content-Digest``) and its JSON."""
        r = self.request("GET", f"{self.repo}/manifests/{reference}", headers={"Accept": accept})
        if r.status_code != 200:
            raise PublishError(f"{self.host}/{self.repo}:{reference}: manifest read-back "
                               f"answered HTTP {r.status_code}")
        return self._served_digest(r, reference), r.json()

    def has_blob(self, digest: str) -> bool:
        r = self.request("HEAD", f"{self.repo}/blobs/{digest}")
        return r.status_code == 200

    def put_blob(self, data: bytes | Path, digest: str) -> None:
        """Monolithic upload: ``POST`` an upload session, ``PUT`` the bytes with the digest."""
        if self.has_blob(digest):
            return
        r = self.request("POST", f"{self.repo}/blobs/uploads/")
        if r.status_code != 202 or not r.headers.get("Location"):
            raise PublishError(f"{self.host}/{self.repo}: starting a blob upload answered HTTP "
                               f"{r.status_code}{_registry_errors(r)}")
        parts = urllib.parse.urlsplit(self._absolute(r.headers["Location"]))
        query = urllib.parse.urlencode(
            urllib.parse.parse_qsl(parts.query) + [("digest", digest)])
        put = urllib.parse.urlunsplit(parts._replace(query=query))
        r = self.request("PUT", "", url=put, body=data,
                         headers={"Content-Type": "application/octet-stream"})
        if r.status_code != 201:
            raise PublishError(f"{self.host}/{self.repo}: blob upload of {digest} answered HTTP "
                               f"{r.status_code}{_registry_errors(r)}")

    def put_manifest(self, reference: str, data: bytes, media_type: str) -> str:
        r = self.request("PUT", f"{self.repo}/manifests/{reference}", body=data,
                         headers={"Content-Type": media_type})
        if r.status_code != 201:
            raise PublishError(f"{self.host}/{self.repo}:{reference}: manifest upload answered "
                               f"HTTP {r.status_code}{_registry_errors(r)}")
        return "sha256:" + hashlib.sha256(data).hexdigest()

    # ------------------------------------------------------------------ OCI 1.1 referrers

    def fetch_manifest(self, reference: str, accept: str, *, missing_ok: bool = False
                       ) -> tuple[str, bytes, str] | None:
        """A manifest's raw bytes as served: (digest of those bytes, bytes, media type). The
        digest is checked against ``Docker-Content-Digest`` and, for a digest reference, against
        the reference itself. None on 404 when ``missing_ok``."""
        r = self.request("GET", f"{self.repo}/manifests/{reference}", headers={"Accept": accept})
        if r.status_code == 404 and missing_ok:
            return None
        if r.status_code != 200:
            raise PublishError(f"{self.host}/{self.repo}:{reference}: manifest read answered HTTP "
                               f"{r.status_code}{_registry_errors(r)}")
        digest = self._served_digest(r, reference)
        if reference.startswith("sha256:") and reference != digest:
            raise PublishError(f"{self.repo}@{reference}: the registry served other bytes "
                               f"({digest})")
        media = r.headers.get("Content-Type", "").split(";")[0].strip()
        return digest, r.content, media

    def blob(self, digest: str, *, limit: int = 64 << 20) -> bytes:
        """A (small) blob's bytes, checked against its digest."""
        r = self.request("GET", f"{self.repo}/blobs/{digest}")
        if r.status_code != 200:
            raise PublishError(f"{self.host}/{self.repo}: blob {digest} answered HTTP "
                               f"{r.status_code}{_registry_errors(r)}")
        if len(r.content) > limit:
            raise PublishError(f"{self.host}/{self.repo}: blob {digest} is larger than "
                               f"{limit} bytes")
        if "sha256:" + hashlib.sha256(r.content).hexdigest() != digest:
            raise PublishError(f"{self.host}/{self.repo}: blob {digest} served other bytes")
        return r.content

    def push_referrer(self, data: bytes, media_type: str) -> tuple[str, bool]:
        """``PUT`` a manifest that has a ``subject`` by its digest. Returns the digest and
        whether the registry answered ``OCI-Subject`` (it indexes referrers itself; without the
        header the client keeps the ``sha256-<hex>`` fallback index)."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        r = self.request("PUT", f"{self.repo}/manifests/{digest}", body=data,
                         headers={"Content-Type": media_type})
        if r.status_code != 201:
            raise PublishError(f"{self.host}/{self.repo}@{digest}: referrer upload answered "
                               f"HTTP {r.status_code}{_registry_errors(r)}")
        return digest, bool(r.headers.get("OCI-Subject"))

    def referrers(self, digest: str, artifact_type: str | None = None
                  ) -> list[dict[str, Any]] | None:
        """``GET /v2/<name>/referrers/<digest>``: the descriptors of the manifests whose
        ``subject`` is ``digest`` (filtered by ``artifact_type`` here too: the filter is
        optional for registries). None when the registry has no referrers API (404 without an
        OCI index, as distribution 2.8 answers)."""
        path = f"{self.repo}/referrers/{digest}"
        if artifact_type:
            path += "?" + urllib.parse.urlencode({"artifactType": artifact_type})
        r = self.request("GET", path, headers={"Accept": OCI_INDEX})
        if r.status_code in (404, 405, 400):
            return None
        if r.status_code != 200:
            raise PublishError(f"{self.host}/{self.repo}: referrers of {digest} answered HTTP "
                               f"{r.status_code}{_registry_errors(r)}")
        try:
            index = r.json()
            manifests = index["manifests"]
        except (ValueError, KeyError, TypeError):
            return None  # not an index: treat as no API
        found = [d for d in manifests or [] if isinstance(d, dict)]
        return [d for d in found if not artifact_type or d.get("artifactType") == artifact_type]

    def fallback_index(self, digest: str) -> tuple[str, dict[str, Any]] | None:
        """The OCI 1.1 tag-schema fallback: the index under tag ``sha256-<hex>`` (its digest and
        JSON), or None when there is none."""
        got = self.fetch_manifest(fallback_tag(digest), OCI_INDEX, missing_ok=True)
        if got is None:
            return None
        try:
            index = json.loads(got[1])
        except ValueError:
            raise PublishError(f"{self.host}/{self.repo}:{fallback_tag(digest)}: not JSON"
                               ) from None
        if not isinstance(index, dict) or not isinstance(index.get("manifests"), list):
            raise PublishError(f"{self.host}/{self.repo}:{fallback_tag(digest)}: not an OCI "
                               "index")
        return got[0], index

    def add_to_fallback_index(self, subject: str, descriptor: dict[str, Any],
                              replaces: Any = None) -> str:
        """Read-modify-write of the index under ``sha256-<hex>`` of ``subject``: ``descriptor``
        added (an entry with its digest, or one for which ``replaces(entry)`` is true, is
        dropped first). The referrer must already be in this repository (distribution refuses
        an index whose child it does not hold). One publisher at a time. Returns the tag."""
        tag = fallback_tag(subject)
        current = self.fallback_index(subject)
        entries = list(current[1]["manifests"]) if current else []
        entries = [e for e in entries if isinstance(e, dict)
                   and e.get("digest") != descriptor["digest"]
                   and not (replaces and replaces(e))]
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [*entries, descriptor]}
        self.put_manifest(tag, json.dumps(index, separators=(",", ":")).encode(), OCI_INDEX)
        return tag


OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def fallback_tag(digest: str) -> str:
    """``sha256:<hex>`` -> ``sha256-<hex>`` (the referrers tag schema)."""
    alg, _, value = digest.partition(":")
    if not value or not re.fullmatch(r"[a-z0-9]+", alg) or not re.fullmatch(r"[a-f0-9]+", value):
        raise PublishError(f"not a digest: {digest!r}")
    return f"{alg}-{value}"


# --------------------------------------------------------------------------- image indexes
#
# An image index as pure data: the platform an image config declares, the index document that
# names one manifest per platform, and reading one back. An entry is the descriptor of a
# platform's manifest as the registry serves it (media type, digest and size of the raw bytes)
# with ``platform`` (``os``, ``architecture`` and, where the image config declares one,
# ``variant``) and the target it was built for as the annotation ``org.verl-env.target``. What a
# client picks (``docker pull``, enroot/pyxis, apptainer) is the entry whose platform matches the
# node's, so the platform comes from the image's own config, never from a name.

DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
TARGET_ANNOTATION = "org.verl-env.target"
CREATED_ANNOTATION = "org.opencontainers.image.created"


@dataclass(frozen=True)
class Platform:
    """``os/architecture[/variant]`` as the OCI image spec names them (``linux/arm64/v8``)."""

    os: str
    architecture: str
    variant: str = ""

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)

    def to_dict(self) -> dict[str, str]:
        out = {"architecture": self.architecture, "os": self.os}
        if self.variant:
            out["variant"] = self.variant
        return out

    def same_machine(self, other: Platform) -> bool:
        """The same os and architecture: two entries a client could not tell apart (an arm64
        image without a variant and one with ``v8`` run on the same node)."""
        return (self.os, self.architecture) == (other.os, other.architecture)

    @classmethod
    def from_config(cls, config: Any) -> Platform | None:
        """The platform an image config (OCI or Docker) declares; None without one."""
        if not isinstance(config, dict):
            return None
        arch = config.get("architecture") or config.get("Architecture")
        os_ = config.get("os") or config.get("Os") or "linux"
        variant = config.get("variant") or config.get("Variant") or ""
        if not isinstance(arch, str) or not arch:
            return None
        return cls(str(os_), arch, str(variant))

    @classmethod
    def from_descriptor(cls, descriptor: dict[str, Any]) -> Platform | None:
        return cls.from_config(descriptor.get("platform"))


@dataclass(frozen=True)
class IndexEntry:
    """One platform's manifest in an index."""

    platform: Platform
    media_type: str
    digest: str
    size: int
    target: str | None = None

    def descriptor(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest,
                               "size": self.size, "platform": self.platform.to_dict()}
        if self.target:
            out["annotations"] = {TARGET_ANNOTATION: self.target}
        return out


def index_document(entries: list[IndexEntry], created: str) -> bytes:
    """The OCI image index naming ``entries`` (one per machine: :class:`ValueError` when two
    share an os and architecture), as the bytes pushed."""
    for i, a in enumerate(entries):
        for b in entries[i + 1:]:
            if a.platform.same_machine(b.platform):
                raise ValueError(f"two images for {a.platform.os}/{a.platform.architecture}: "
                                 f"{a.target or a.digest} and {b.target or b.digest}")
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX,
             "manifests": [e.descriptor() for e in entries],
             "annotations": {CREATED_ANNOTATION: created}}
    return json.dumps(index, separators=(",", ":"), sort_keys=True).encode()


def index_entries(index: Any) -> list[IndexEntry]:
    """The platform entries of an index read back (entries without a platform, such as an
    attestation manifest a builder adds, are left out). :class:`ValueError` when ``index`` is
    not an index."""
    if not isinstance(index, dict) or not isinstance(index.get("manifests"), list):
        raise ValueError("not an image index (no manifests list)")
    out = []
    for d in index["manifests"]:
        if not isinstance(d, dict):
            continue
        platform = Platform.from_descriptor(d)
        if platform is None or platform.os == "unknown":
            continue
        target = (d.get("annotations") or {}).get(TARGET_ANNOTATION)
        out.append(IndexEntry(platform, str(d.get("mediaType") or ""), str(d.get("digest") or ""),
                         int(d.get("size") or 0), target if isinstance(target, str) else None))
    return out


def is_index(media_type: str, body: Any) -> bool:
    """Whether a manifest served with ``media_type`` (or, without one, ``body``'s own
    ``mediaType``) is an image index or a Docker manifest list."""
    if media_type in INDEX_TYPES:
        return True
    return (not media_type and isinstance(body, dict)
            and body.get("mediaType") in INDEX_TYPES)
