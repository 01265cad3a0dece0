"""Fixtures for the publish tests: a real OCI registry (Debian ``docker-registry``) on a free
loopback port with its own directory, optionally with htpasswd basic auth or read-only storage,
and a fault-injecting TCP proxy in front of it. Everything started here is stopped by PID at
teardown, also when a test fails."""

from __future__ import annotations

import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.sif.conftest import docker_client, layered, layered_sif, need_tools  # noqa: F401

USER = "verl"
PASSWORD = "s3cret-Pa55-do-not-print"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RegistryServer:
    host: str  # 127.0.0.1:PORT
    root: Path
    proc: subprocess.Popen[bytes]
    user: str | None = None
    password: str | None = None

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


def start_registry(root: Path, *, auth: bool = False, readonly: bool = False) -> RegistryServer:
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
    (root / "config.yml").write_text("\n".join(lines) + "\n")
    log = open(root / "registry.log", "wb")
    proc = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = RegistryServer(f"127.0.0.1:{port}", root, proc, USER if auth else None,
                            PASSWORD if auth else None)
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

    def make(**kw: Any) -> RegistryServer:
        server = start_registry(tmp_path / f"registry{len(started)}", **kw)
        started.append(server)
        return server

    try:
        yield make
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def registry(registry_factory: Callable[..., RegistryServer]) -> RegistryServer:
    return registry_factory()


@pytest.fixture
def auth_registry(registry_factory: Callable[..., RegistryServer]) -> RegistryServer:
    return registry_factory(auth=True)


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
        self._spawn(self._pipe, upstream, conn)
        self._pipe(conn, upstream)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

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
