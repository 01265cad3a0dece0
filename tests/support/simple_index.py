"""A local package index for doctor's index check: answers ``/simple/pip/`` (200) and nothing
else (404), and records every path asked for. Its URL carries credentials, so a test can see
that they never reach a message."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator


class _Index(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        self.send_response(200 if self.path == "/simple/pip/" else 404)
        self.end_headers()
        self.wfile.write(b"<html></html>")

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve_index() -> Iterator[str]:
    """``http://user:secret@127.0.0.1:PORT/simple`` while the block runs."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    server.paths = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://user:secret@127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
