"""Fixtures for the publish tests: a real OCI registry (Debian ``docker-registry``) on a free
loopback port with its own directory, optionally with htpasswd basic auth, with ``auth: token``
(Bearer tokens from :class:`TokenIssuer`, a small token service written here), or read-only
storage, and a fault-injecting TCP proxy in front of it. Everything started here is stopped by
PID (or shut down, for the in-process issuer) at teardown, also when a test fails."""

from __future__ import annotations

import base64
import datetime
import http.server
import json
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import run_build_env
from tests.sif.images import LAYERED_TAG
from tests.sif.conftest import docker_client, layered, layered_sif, need_tools  # noqa: F401

USER = "verl"
PASSWORD = "s3cret-Pa55-do-not-print"
REFRESH_TOKEN = "refresh-Tok3n-do-not-print"  # an identity token, as `docker login` may store
SERVICE = "verl-env-test-registry"
ISSUER = "verl-env-test-issuer"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenIssuer:
    """The token service of distribution's ``auth: token``: ``GET /token?service=&scope=`` with
    basic credentials (or none) answers an RS256 JWT whose header carries the ``x5c`` chain (one
    self-signed certificate, which is also the registry's ``rootcertbundle``). distribution 2.8
    checks ``iss`` == its ``issuer``, ``aud`` == its ``service``, ``exp``/``nbf`` (60 s leeway),
    the chain against the bundle, the signature, then the ``access`` claims against the request.
    Anonymous callers get a token with no access (as public registries do); a wrong password gets
    401. ``POST /token`` is the OAuth2 form (``grant_type=refresh_token``) that clients holding
    an identity token use; it accepts :data:`REFRESH_TOKEN`. Every token issued and every
    request seen is kept for the tests' assertions."""

    def __init__(self, root: Path) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID

        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(hours=1))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))
        root.mkdir(parents=True, exist_ok=True)
        self.bundle = root / "token-ca.pem"
        self.bundle.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self._der = self.cert.public_bytes(serialization.Encoding.DER)
        self.tokens: list[str] = []
        self.requests: list[dict[str, Any]] = []
        issuer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                issuer._handle(self)

            def do_POST(self) -> None:  # noqa: N802
                issuer._handle_oauth(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def sign(self, claims: dict[str, Any]) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(self._der).decode()]}
        signing_input = ".".join(_b64url(json.dumps(part, separators=(",", ":")).encode())
                                 for part in (header, claims))
        signature = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{_b64url(signature)}"

    def _handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(h.path)
        query = urllib.parse.parse_qs(url.query)
        user = None
        header = h.headers.get("Authorization", "")
        seen = {"path": url.path, "service": query.get("service", [None])[0],
                "scope": query.get("scope", []), "basic": header.startswith("Basic ")}
        self.requests.append(seen)
        if header.startswith("Basic "):
            given = base64.b64decode(header[6:]).decode(errors="replace")
            if given != f"{USER}:{PASSWORD}":
                h.send_response(401)
                h.send_header("Content-Type", "application/json")
                h.end_headers()
                h.wfile.write(b'{"details":"invalid username or password"}')
                return
            user = USER
        self._issue(h, url.path, seen["service"], query.get("scope", []), user, "token")

    def _handle_oauth(self, h: http.server.BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        form = urllib.parse.parse_qs(h.rfile.read(length).decode())
        scopes = [x for s in form.get("scope", []) for x in s.split(" ") if x]
        seen = {"path": url.path, "service": form.get("service", [None])[0], "scope": scopes,
                "basic": False, "oauth": form.get("grant_type", [None])[0]}
        self.requests.append(seen)
        if (seen["oauth"] != "refresh_token"
                or form.get("refresh_token", [None])[0] != REFRESH_TOKEN):
            h.send_response(401)
            h.end_headers()
            return
        self._issue(h, url.path, seen["service"], scopes, USER, "access_token")

    def _issue(self, h: http.server.BaseHTTPRequestHandler, path: str, service: str | None,
               scopes: list[str], user: str | None, field: str) -> None:
        if path != "/token" or service != SERVICE:
            h.send_response(400)
            h.end_headers()
            return
        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            if user and kind == "repository":
                access.append({"type": kind, "name": name,
                               "actions": [a for a in actions.split(",") if a]})
        now = int(time.time())
        token = self.sign({"iss": ISSUER, "sub": user or "", "aud": SERVICE, "exp": now + 300,
                           "nbf": now - 5, "iat": now, "jti": uuid.uuid4().hex,
                           "access": access})
        self.tokens.append(token)
        body = json.dumps({field: token, "expires_in": 300,
                           "issued_at": datetime.datetime.now(datetime.timezone.utc).isoformat()})
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        h.wfile.write(body.encode())

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)


@dataclass
class RegistryServer:
    host: str  # 127.0.0.1:PORT
    root: Path
    proc: subprocess.Popen[bytes]
    user: str | None = None
    password: str | None = None
    issuer: TokenIssuer | None = None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        return (self.root / "registry.log").read_text(errors="replace")


def start_registry(root: Path, *, auth: bool = False, readonly: bool = False,
                   token: TokenIssuer | None = None) -> RegistryServer:
    """``docker-registry serve`` on 127.0.0.1:<free port>; ready when /v2/ answers."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    lines = ["version: 0.1", "log:", "  level: info", "storage:", "  filesystem:",
             f"    rootdirectory: {root / 'data'}", "  delete:", "    enabled: true"]
    if readonly:
        lines += ["  maintenance:", "    readonly:", "      enabled: true"]
    lines += ["http:", f"  addr: 127.0.0.1:{port}"]
    if auth:
        htpasswd = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], check=True,
                                  capture_output=True, text=True).stdout
        (root / "htpasswd").write_text(htpasswd)
        lines += ["auth:", "  htpasswd:", "    realm: verl-env-test",
                  f"    path: {root / 'htpasswd'}"]
    if token is not None:
        lines += ["auth:", "  token:", f"    realm: {token.realm}", f"    service: {SERVICE}",
                  f"    issuer: {ISSUER}", f"    rootcertbundle: {token.bundle}"]
    (root / "config.yml").write_text("\n".join(lines) + "\n")
    log = open(root / "registry.log", "wb")
    proc = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    authed = auth or token is not None
    server = RegistryServer(f"127.0.0.1:{port}", root, proc, USER if authed else None,
                            PASSWORD if authed else None, token)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            if requests.get(f"http://{server.host}/v2/", timeout=1).status_code in (200, 401):
                return server
        except requests.ConnectionError:
            pass
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"docker-registry did not start:\n{server.log()[-2000:]}")


@pytest.fixture
def registry_factory(tmp_path: Path) -> Iterator[Callable[..., RegistryServer]]:
    """Start registries on demand; all are stopped at teardown."""
    for tool, pkg in (("docker-registry", "docker-registry"), ("htpasswd", "apache2-utils")):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (apt-get install {pkg})")
    started: list[RegistryServer] = []
    issuers: list[TokenIssuer] = []

    def make(*, token: bool = False, **kw: Any) -> RegistryServer:
        root = tmp_path / f"registry{len(started)}"
        if token:
            issuers.append(TokenIssuer(root))
        server = start_registry(root, token=issuers[-1] if token else None, **kw)
        started.append(server)
        return server

    try:
        yield make
    finally:
        for server in started:
            server.stop()
        for issuer in issuers:
            issuer.stop()


@pytest.fixture
def registry(registry_factory: Callable[..., RegistryServer]) -> RegistryServer:
    return registry_factory()


@pytest.fixture(scope="session")
def cpu_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """One registry for the session's pushes of the CPU fixture image, each test to its own
    repository: the first push uploads its layers (the engine compresses 2 GB: about 80
    CPU-seconds), a later one mounts them from that repository, as a site's registry that
    already holds the stack does."""
    for tool, pkg in (("docker-registry", "docker-registry"), ("htpasswd", "apache2-utils")):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (apt-get install {pkg})")
    server = start_registry(tmp_path_factory.mktemp("cpu-registry"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def auth_registry(registry_factory: Callable[..., RegistryServer]) -> RegistryServer:
    return registry_factory(auth=True)


@pytest.fixture
def token_registry(registry_factory: Callable[..., RegistryServer]) -> RegistryServer:
    """``docker-registry`` with ``auth: token``; its issuer is ``.issuer``."""
    pytest.importorskip("cryptography", reason="the test token issuer signs with cryptography")
    return registry_factory(token=True)


# --------------------------------------------------------------------------- fault injection


@dataclass
class FlakyProxy:
    """A TCP proxy to a registry that answers the first ``failures`` requests whose request line
    matches ``pattern`` with HTTP 503 (or resets the connection), then relays everything."""

    target: str
    pattern: str
    failures: int
    mode: str = "503"
    host: str = ""
    injected: list[str] = field(default_factory=list)
    _server: socket.socket | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> FlakyProxy:
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self._server.settimeout(0.2)
        self.host = f"127.0.0.1:{self._server.getsockname()[1]}"
        self._spawn(self._accept)
        return self

    def _spawn(self, fn: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self) -> None:
        assert self._server is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self._spawn(self._handle, conn)

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(30)
        try:
            first = conn.recv(65536)
        except OSError:
            conn.close()
            return
        line = first.split(b"\r\n", 1)[0].decode(errors="replace")
        if self.failures > 0 and self.pattern in line:
            self.failures -= 1
            self.injected.append(line)
            if self.mode == "reset":
                linger_zero = struct.pack("ii", 1, 0)  # close() sends RST
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger_zero)
            else:
                conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                             b"Connection: close\r\n\r\n")
            conn.close()
            return
        host, port = self.target.split(":")
        upstream = socket.create_connection((host, int(port)))
        upstream.sendall(first)
        self._spawn(pipe, upstream, conn)
        pipe(conn, upstream)

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.close()


@pytest.fixture
def flaky_proxy() -> Iterator[Callable[..., FlakyProxy]]:
    proxies: list[FlakyProxy] = []

    def make(target: str, pattern: str, failures: int, mode: str = "503") -> FlakyProxy:
        proxy = FlakyProxy(target, pattern, failures, mode).start()
        proxies.append(proxy)
        return proxy

    try:
        yield make
    finally:
        for proxy in proxies:
            proxy.stop()


REPO = "verl-env/test"


def publish_cli(reg: str, tmp_path: Path, *extra: str, env: dict[str, str] | None = None,
                sif: Path | None = None) -> tuple[Any, Path]:
    record = tmp_path / "record.json"
    args = ["publish", "--image", LAYERED_TAG, "--force", "--registry", f"{reg}/{REPO}",
            "--tag", "layers", "--record", str(record), "--json", *extra]
    if sif is not None:
        args += ["--sif", str(sif)]
    # HOME and DOCKER_CONFIG point into the test dir: nothing may be written to a real config
    base = {"HOME": str(tmp_path / "home"), "DOCKER_CONFIG": str(tmp_path / "docker-config")}
    return run_build_env(*args, env={**base, **(env or {})}, timeout=600), record


def close_socket(s: socket.socket) -> None:
    """Shut both directions of ``s`` down (the peer sees EOF at once) and close it."""
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


def pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until either end closes; then close both (a test proxy's half)."""
    try:
        while True:
            data = src.recv(1 << 16)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        close_socket(src)
        close_socket(dst)
