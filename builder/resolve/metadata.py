"""Package metadata for the compatibility check: a committed snapshot, refreshed on demand.

The snapshot (``metadata/pypi-snapshot.json`` beside the matrix) holds, for every pinned
``name==version``: ``requires_python``, ``requires_dist`` and the sdist sha256 (for packages built
from source), plus the list of released versions of every dependency that two pinned packages
both constrain (so the check can tell when two ranges leave no release at all).

``--online`` refreshes it from the package index's JSON simple API (PEP 691) with ``requests``. The
index is the one this machine's tools are configured with (``VERL_ENV_INDEX_URL``,
``UV_DEFAULT_INDEX``, ``UV_INDEX_URL``, ``PIP_INDEX_URL``, else pip's own default); no host name is
written here.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import re
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (InvalidSdistFilename, InvalidWheelFilename, canonicalize_name,
                             parse_sdist_filename, parse_wheel_filename)
from packaging.version import InvalidVersion, Version

from builder.files import atomic_write_text
from builder.errors import BuildEnvError, NetworkError

if TYPE_CHECKING:
    import email.message

    import requests

SNAPSHOT_SCHEMA = "verl-env/pypi-snapshot/v1"
# How long one network call may wait for an answer (connect, or between two reads) before it
# fails with one line naming the URL: git, the package index, uv (its HTTP timeout). Env
# VERL_ENV_NETWORK_TIMEOUT (seconds) for a slow link.
NETWORK_TIMEOUT = 60.0
INDEX_WAY_OUT = ("the site's index: --index-url URL, index_url in build-env.toml or "
                 "VERL_ENV_INDEX_URL; the recorded snapshot needs no index: leave out --online")


def network_timeout() -> float:
    """``VERL_ENV_NETWORK_TIMEOUT`` seconds (unset or empty: the default); anything but a
    finite number > 0 is refused (exit 2, naming the variable), never silently replaced."""
    value = os.environ.get("VERL_ENV_NETWORK_TIMEOUT", "").strip()
    if not value:
        return NETWORK_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise BuildEnvError(f"VERL_ENV_NETWORK_TIMEOUT={value!r}: expected a number of seconds "
                            f"> 0 (unset: {NETWORK_TIMEOUT:g})")
    return seconds


class MetadataError(BuildEnvError):
    stage = "metadata"


# ``extra == "name"`` (or the reverse) in a requirement's marker
_EXTRA_MARK = re.compile(r"""extra\s*==\s*["']([^"']+)["']|["']([^"']+)["']\s*==\s*extra""")


@dataclass(frozen=True)
class Release:
    name: str
    version: str
    requires_python: str | None
    requires_dist: tuple[str, ...]
    sdist_sha256: str | None = None
    has_wheel: bool = True
    # the release's wheel file names (their tags tell the platforms), recorded by `propose
    # --online`; empty when unknown (``has_wheel`` still says whether there is any wheel)
    wheels: tuple[str, ...] = ()
    # the release's Provides-Extra, recorded by `check --online` since issue 37; empty when the
    # snapshot predates it (:meth:`extras` then reads the extras its Requires-Dist names)
    provides_extra: tuple[str, ...] = ()

    def extras(self) -> tuple[frozenset[str], bool]:
        """The extras the release declares (normalised, PEP 685) and whether that is its
        recorded ``Provides-Extra`` (exact) or only the extras its ``Requires-Dist`` markers
        name (an extra that adds no requirement is then not seen)."""
        if self.provides_extra:
            return frozenset(canonicalize_name(e) for e in self.provides_extra), True
        named = {canonicalize_name(a or b) for line in self.requires_dist
                 for a, b in _EXTRA_MARK.findall(line.partition(";")[2])}
        return frozenset(named), False

    def requirements(self) -> list[Requirement]:
        """The release's ``Requires-Dist`` parsed; a malformed line (metadata upstream) is left
        out: nothing could be checked against it anyway."""
        return [r for r in map(parse_requirement, self.requires_dist) if r is not None]



@functools.lru_cache(maxsize=None)
def parse_requirement(line: str) -> Requirement | None:
    """``Requirement(line)``, or None for a malformed line; parsed once per process (a ``check``
    of the shipped matrix reads the same few thousand lines tens of thousands of times). The
    result is shared: callers read it, never change it."""
    try:
        return Requirement(line)
    except InvalidRequirement:
        return None

@dataclass
class Snapshot:
    releases: dict[str, Release] = field(default_factory=dict)  # "name==version" -> Release
    versions: dict[str, list[str]] = field(default_factory=dict)  # name -> released versions
    fetched: str = ""

    def release(self, name: str, version: str) -> Release | None:
        return self.releases.get(f"{canonicalize_name(name)}=={version}")

    def to_json(self) -> str:
        data = {
            "schema": SNAPSHOT_SCHEMA,
            "fetched": self.fetched,
            "releases": {k: {"requires_python": r.requires_python,
                             "requires_dist": list(r.requires_dist),
                             "sdist_sha256": r.sdist_sha256,
                             "has_wheel": r.has_wheel,
                             **({"wheels": list(r.wheels)} if r.wheels else {}),
                             **({"provides_extra": list(r.provides_extra)}
                                if r.provides_extra else {})}
                         for k, r in sorted(self.releases.items())},
            "versions": {k: v for k, v in sorted(self.versions.items())},
        }
        return json.dumps(data, indent=1, sort_keys=True) + "\n"


def snapshot_path(matrix_path: Path) -> Path:
    return matrix_path.parent / "metadata" / "pypi-snapshot.json"


def load_snapshot(path: Path) -> Snapshot:
    if not path.exists():
        return Snapshot()
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise MetadataError(f"{path}: unreadable metadata snapshot ({exc})") from None
    if data.get("schema") != SNAPSHOT_SCHEMA:
        raise MetadataError(f"{path}: unknown snapshot schema {data.get('schema')!r}")
    releases = {}
    for key, r in data.get("releases", {}).items():
        name, version = key.split("==", 1)
        releases[key] = Release(name, version, r.get("requires_python"),
                                tuple(r.get("requires_dist") or ()), r.get("sdist_sha256"),
                                r.get("has_wheel", True), tuple(r.get("wheels") or ()),
                                tuple(r.get("provides_extra") or ()))
    return Snapshot(releases, dict(data.get("versions", {})), data.get("fetched", ""))


def save_snapshot(snapshot: Snapshot, path: Path) -> None:
    atomic_write_text(path, snapshot.to_json())


# --------------------------------------------------------------------------- online refresh

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def redact(url: str) -> str:
    """``url`` without its user and password (an index URL may carry a token)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def index_simple_url() -> str:
    """The index's simple API root, from configuration (never written into this repo)."""
    for var in ("VERL_ENV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        if os.environ.get(var):
            return os.environ[var].rstrip("/")
    return _pip_index_url()


def _pip_index_url() -> str:
    """pip's configured index, else the default pip documents in its own ``--help`` (pip's
    public interface: no private imports, and no index host written into this repository)."""
    py = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    config = subprocess.run([*py, "config", "list"], capture_output=True, text=True)
    for line in config.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.split(".")[-1] == "index-url" and value.strip("'\" "):
            return value.strip("'\" ").rstrip("/")
    helptext = subprocess.run([*py, "install", "--help"], capture_output=True, text=True).stdout
    match = re.search(r"\(default\s+(\S+?)\)", " ".join(helptext.split()))
    if not match:
        raise MetadataError("cannot tell the package index: set VERL_ENV_INDEX_URL")
    return match.group(1).rstrip("/")


class _RangeFile(io.RawIOBase):
    """A seekable read-only view of a remote file through HTTP Range requests (64 KiB blocks),
    so ``zipfile`` can read one wheel's METADATA without downloading the whole wheel."""

    BLOCK = 1 << 16

    def __init__(self, session: requests.Session, url: str, size: int) -> None:
        self.session, self.url, self.size, self.pos = session, url, size, 0
        self.blocks: dict[int, bytes] = {}

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def _block(self, n: int) -> bytes:
        if n not in self.blocks:
            lo, hi = n * self.BLOCK, min(self.size, (n + 1) * self.BLOCK) - 1
            import requests  # lazy: only a client of the index needs it (see IndexClient)
            try:
                resp = self.session.get(self.url, headers={"Range": f"bytes={lo}-{hi}"},
                                        timeout=network_timeout())
            except requests.RequestException as exc:
                raise NetworkError(self.url, _reason(exc), way_out=INDEX_WAY_OUT) from None
            if resp.status_code != 206:
                raise MetadataError(f"index does not serve byte ranges ({resp.status_code})")
            self.blocks[n] = resp.content
        return self.blocks[n]

    def readinto(self, buf: Any) -> int:
        want = min(len(buf), self.size - self.pos)
        out = bytearray()
        while len(out) < want:
            n, off = divmod(self.pos + len(out), self.BLOCK)
            out += self._block(n)[off: off + want - len(out)]
        buf[: len(out)] = out
        self.pos += len(out)
        return len(out)


def _reason(exc: requests.RequestException) -> str:
    """One line for a failed request: its kind, and for a timeout the bound."""
    import requests  # lazy: only a client of the index needs it (see IndexClient)
    if isinstance(exc, requests.Timeout):
        return f"no answer within {network_timeout():g} s ({exc.__class__.__name__})"
    return f"unreachable ({exc.__class__.__name__})"


def _ok(resp: requests.Response, url: str) -> requests.Response:
    """``resp`` unless the index refused the request (401, 403, 4xx other than 404)."""
    if resp.status_code >= 400 and resp.status_code != 404:
        raise NetworkError(url, f"HTTP {resp.status_code}", way_out=INDEX_WAY_OUT)
    return resp


def _head_size(session: requests.Session, url: str) -> int:
    import requests  # lazy: only a client of the index needs it (see IndexClient)
    try:
        resp = session.head(url, timeout=network_timeout(), allow_redirects=True)
    except requests.RequestException as exc:
        raise NetworkError(url, _reason(exc), way_out=INDEX_WAY_OUT) from None
    if "content-length" not in resp.headers:
        raise NetworkError(url, f"HTTP {resp.status_code} without a size",
                           way_out=INDEX_WAY_OUT)
    return int(resp.headers["content-length"])


class IndexClient:
    """Release metadata from the index's JSON simple API (PEP 691), with retries.

    Requires-Dist comes from the wheel's METADATA: the PEP 658 ``.metadata`` file when the index
    serves it, else read out of the wheel through HTTP ranges (a few hundred KiB of a 500 MB wheel).
    """

    def __init__(self, simple_url: str | None = None, session: requests.Session | None = None,
                 retries: int = 3) -> None:
        # requests is imported by the first client, not with this module: `build-env check`
        # (offline) and every other command reading a snapshot never start it
        import requests
        self.simple = (simple_url or index_simple_url()).rstrip("/")
        self.session = session or requests.Session()
        self.retries = retries
        self._projects: dict[str, dict[str, Any]] = {}

    def _get(self, url: str, **kw: Any) -> requests.Response:
        """One GET, retried on a connection failure or a 5xx; every try bounded by
        :func:`network_timeout`. A failure is one :class:`NetworkError` naming the URL."""
        import requests  # lazy: see __init__
        delay = 1.0
        for attempt in range(self.retries):
            try:
                resp = self.session.get(url, timeout=network_timeout(), **kw)
            except requests.RequestException as exc:
                if attempt + 1 == self.retries:
                    raise NetworkError(url, _reason(exc), way_out=INDEX_WAY_OUT) from None
            else:
                if resp.status_code < 500:
                    return _ok(resp, url)
                if attempt + 1 == self.retries:
                    raise NetworkError(url, f"HTTP {resp.status_code} after {self.retries} tries",
                                       way_out=INDEX_WAY_OUT)
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def project(self, name: str) -> dict[str, Any]:
        name = canonicalize_name(name)
        if name not in self._projects:
            resp = self._get(f"{self.simple}/{name}/", headers={"Accept": SIMPLE_JSON})
            if resp.status_code == 404:
                raise MetadataError(f"{name} is not on the index")
            try:
                self._projects[name] = resp.json()
            except ValueError:
                raise NetworkError(resp.url or self.simple, "not a PEP 691 JSON simple API "
                                   "answer", way_out=INDEX_WAY_OUT) from None
        return self._projects[name]

    def versions(self, name: str) -> list[str]:
        data = self.project(name)
        listed = data.get("versions") or sorted({_file_version(f["filename"]) for f in
                                                  data["files"]} - {None})
        return sorted(listed, key=_sort_key)

    def release(self, name: str, version: str) -> Release:
        files = [f for f in self.project(name)["files"]
                 if _file_version(f["filename"]) == version and not f.get("yanked")]
        if not files:
            raise MetadataError(f"{name}=={version} is not on the index")
        wheels = [f for f in files if f["filename"].endswith(".whl")]
        sdist = next((f for f in files if not f["filename"].endswith(".whl")), None)
        requires_python = next((f.get("requires-python") for f in files
                                if f.get("requires-python")), None)
        if wheels:
            meta = self._wheel_metadata(wheels[0])
        else:  # sdist only (flash-attn): PKG-INFO is good enough for Requires-Python
            meta = self._sdist_metadata(sdist) if sdist else _core_metadata("")
        return Release(canonicalize_name(name), version,
                       requires_python or meta.get("Requires-Python"),
                       tuple(meta.get_all("Requires-Dist") or ()),
                       sdist["hashes"].get("sha256") if sdist else None, bool(wheels),
                       provides_extra=tuple(meta.get_all("Provides-Extra") or ()))

    def _wheel_metadata(self, f: dict[str, Any]) -> email.message.Message:
        if f.get("core-metadata") or f.get("data-dist-info-metadata"):
            resp = self._get(f["url"] + ".metadata")
            if resp.status_code == 200:
                return _core_metadata(resp.text)
        size = int(f.get("size") or _head_size(self.session, f["url"]))
        with zipfile.ZipFile(io.BufferedReader(_RangeFile(self.session, f["url"], size),
                                               buffer_size=1 << 16)) as zf:
            member = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            return _core_metadata(zf.read(member).decode("utf-8", "replace"))

    def _sdist_metadata(self, f: dict[str, Any]) -> email.message.Message:
        resp = self._get(f["url"])
        with tarfile.open(fileobj=io.BytesIO(resp.content)) as tf:
            member = next(m for m in tf.getmembers() if m.name.count("/") == 1
                          and m.name.endswith("/PKG-INFO"))
            data = tf.extractfile(member).read().decode("utf-8", "replace")  # type: ignore[union-attr]
        return _core_metadata(data)


def _core_metadata(text: str) -> email.message.Message:
    """A release's core metadata (a wheel's METADATA, an sdist's PKG-INFO) as its headers."""
    import email.parser  # lazy: only a refresh reads metadata files, not every command
    return email.parser.Parser().parsestr(text)


def _file_version(filename: str) -> str | None:
    try:
        if filename.endswith(".whl"):
            return str(parse_wheel_filename(filename)[1])
        return str(parse_sdist_filename(filename)[1])
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None


def _sort_key(v: str) -> Any:
    try:
        return (0, Version(v))
    except InvalidVersion:
        return (1, v)


def local_release(name: str, version: str, find_links: Iterable[str]) -> Release | None:
    """Metadata of a wheel kept in a local find-links directory (a site's own CPU torch build)."""
    for d in find_links:
        for wheel in sorted(Path(d).glob("*.whl")) if Path(d).is_dir() else ():
            try:
                wname, wver, _, _ = parse_wheel_filename(wheel.name)
            except (InvalidWheelFilename, InvalidVersion):
                continue
            if wname == canonicalize_name(name) and str(wver) == version:
                with zipfile.ZipFile(wheel) as zf:
                    member = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
                    meta = _core_metadata(zf.read(member).decode())
                return Release(wname, version, meta.get("Requires-Python"),
                               tuple(meta.get_all("Requires-Dist") or ()), None, True,
                               provides_extra=tuple(meta.get_all("Provides-Extra") or ()))
    return None


def refresh(snapshot: Snapshot, pins: Iterable[tuple[str, str]], client: IndexClient,
            find_links: Iterable[str] = (), local: Iterable[str] = ()) -> Snapshot:
    """Fetch every pinned release (local find-links wheels first), then the version lists of
    dependencies that two pinned packages both constrain. Packages named in ``local`` are built
    from a local source and may be absent from the index (then they are left out)."""
    find_links, local = tuple(find_links), {canonicalize_name(n) for n in local}
    for name, version in sorted(set(pins)):
        try:
            rel = local_release(name, version, find_links) or client.release(name, version)
        except MetadataError:
            if canonicalize_name(name) in local:
                continue
            raise
        snapshot.releases[f"{canonicalize_name(name)}=={version}"] = rel
    counts: dict[str, int] = {}
    for name, version in set(pins):
        rel = snapshot.release(name, version)
        for dep in {canonicalize_name(r.name) for r in rel.requirements()} if rel else ():
            counts[dep] = counts.get(dep, 0) + 1
    for dep, n in sorted(counts.items()):
        if n >= 2:
            snapshot.versions[dep] = client.versions(dep)
    snapshot.fetched = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return snapshot
