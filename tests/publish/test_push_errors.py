"""How an error the engine reports during a push is classed (pure logic, a stand-in engine that
replays the engine's own error events): a registry that went away is infrastructure (retried,
then exit 3), a refusal is the user's (exit 1, no retry). The real registry killed mid-push is
tests/publish/test_faults.py::test_registry_dies_during_image_push; these are the messages the
engine printed there and in the other fault runs. The registry API client's own reads: a
registry, or its token service, that dies in the middle of an answer's body (a real socket, cut
after the headers and part of a chunk) is as transient as one that refuses the connection."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from builder.engine import ImageInfo
from builder.errors import PublishError, PublishInfraError
from builder.publish import transfer
from builder.registry.api import Client, Transient


class _Engine:
    """Yields one error event per push, as docker's push stream does."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.pushes = 0

    def tag(self, image_id: str, ref: str) -> None:
        pass

    def push(self, ref: str, tag: str, auth_config: Any = None) -> Iterator[dict[str, Any]]:
        self.pushes += 1
        yield {"status": "Preparing", "id": "abc"}
        yield {"errorDetail": {"message": self.message}, "error": self.message}


def _push(message: str, monkeypatch: pytest.MonkeyPatch) -> tuple[_Engine, BaseException]:
    monkeypatch.setattr(transfer.time, "sleep", lambda s: None)
    engine = _Engine(message)
    reg = Client("127.0.0.1:5000", "verl-env/test", "http")
    with pytest.raises(PublishError) as caught:
        transfer.push_image(engine, ImageInfo(id="sha256:" + "0" * 64), reg,  # type: ignore[arg-type]
                            "staging", attempts=3)
    return engine, caught.value


@pytest.mark.parametrize("message", [
    'Get "http://127.0.0.1:38471/v2/": http: server closed idle connection',
    'Patch "http://127.0.0.1:38471/v2/verl-env/test/blobs/uploads/x": read tcp '
    '127.0.0.1:1->127.0.0.1:2: use of closed network connection',
    'Put "http://127.0.0.1:5000/v2/x": dial tcp 127.0.0.1:5000: connect: connection refused',
    "write tcp 127.0.0.1:1->127.0.0.1:2: write: connection reset by peer",
    "received unexpected HTTP status: 503 Service Unavailable",
    'Patch "http://127.0.0.1:5000/v2/x": EOF',
])
def test_a_registry_that_went_away_is_retried_then_infrastructure(
        message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    engine, error = _push(message, monkeypatch)
    assert engine.pushes == 3
    assert isinstance(error, PublishInfraError), error
    assert "still failing after 3 attempts" in str(error) and message in str(error)


@pytest.mark.parametrize("message, hint", [
    ("unauthorized: authentication required", "refused"),
    ("denied: requested access to the resource is denied", "refused"),
    ("unknown: unsupported", "read-only?"),
    ("manifest invalid: manifest invalid", "failed"),
])
def test_a_refusal_is_not_retried_and_is_the_users(message: str, hint: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    engine, error = _push(message, monkeypatch)
    assert engine.pushes == 1
    assert not isinstance(error, PublishInfraError), error
    assert hint in str(error) and message in str(error)


def _cut_server(answer: bytes) -> tuple[str, threading.Thread]:
    """A loopback server that answers one request with ``answer`` and closes the connection."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with server:
            conn, _ = server.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"127.0.0.1:{server.getsockname()[1]}", thread


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n{\"partial\": ",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1024\r\n\r\n{\"partial\": ",
    b"",
], ids=["chunk-cut", "body-short", "closed-before-answer"])
def test_a_registry_that_dies_mid_answer_is_transient(answer: bytes) -> None:
    host, thread = _cut_server(answer)
    reg = Client(host, "verl-env/test", "http", timeout=10)
    with pytest.raises(Transient) as caught:
        reg.request("GET", "", scope="")
    thread.join(10)
    assert "GET /v2/" in str(caught.value), caught.value


def test_a_token_service_that_dies_mid_answer_is_transient() -> None:
    """The registry's 401 sends the client to a token service that cuts its answer."""
    token_host, token_thread = _cut_server(
        b"HTTP/1.1 200 OK\r\nContent-Length: 1024\r\n\r\n{\"token\": ")
    challenge = (f'Bearer realm="http://{token_host}/token",service="verl-env-test"'.encode())
    host, thread = _cut_server(b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: " + challenge
                               + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    reg = Client(host, "verl-env/test", "http", timeout=10)
    with pytest.raises(Transient) as caught:
        reg.request("GET", "")
    thread.join(10)
    token_thread.join(10)
    assert f"token service {token_host}" in str(caught.value), caught.value
