"""The site's index is the only index (issue 29, item 3): `check --online`, `lock` and `propose
--online` ask the index a site names (``VERL_ENV_INDEX_URL``, ``--index-url``, ``index_url`` in
build-env.toml) and never the default one; an index that fails is one line naming its URL
(credentials redacted) and the way out, exit 3.

A real PEP 691 index on this machine serves a few tiny wheels built here (uv and the metadata
client both read it) and counts its requests; beside it a stand-in for the default index (every
variable uv and pip read an index from points at it) records and refuses every request."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import REPO

# name -> version -> Requires-Dist: tiny stand-ins for the pins every target has, and for the
# installer every lock pins (UV_IN_IMAGE); beta is what only the resolution brings in
PACKAGES = {"verl": {"0.9.1": ["beta>=2"]}, "beta": {"2.0": [], "2.1": []},
            "ray": {"2.60.0": []}, "transformers": {"5.9.0": []}, "tensordict": {"0.10.0": []},
            "torch": {"2.11.0": []}, "uv": {"0.13.9": []}}
MATRIX = """schema: 1
targets:
  tiny:
    description: a target of tiny wheels from the site's own index
    accelerator: cpu
    arch: x86_64
    python: "3.12"
    base: {image: "example/debian:bookworm", glibc: "2.36"}
    packages: {verl: "0.9.1", ray: "2.60.0", transformers: "5.9.0", tensordict: "0.10.0",
               torch: "2.11.0"}
"""
SECRET = "s3cret-token"


def _wheel(name: str, version: str, requires: list[str]) -> tuple[str, bytes]:
    """A pure-python wheel with one module: (file name, bytes)."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}_mod.py": b"X = 1\n",
             f"{dist}/METADATA": (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                  "Requires-Python: >=3.8\n"
                                  + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n"}
    record = "".join(
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()}"
        f",{len(d)}\n" for p, d in files.items()) + f"{dist}/RECORD,,\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for p, d in {**files, f"{dist}/RECORD": record.encode()}.items():
            zf.writestr(p, d)
    return f"{name}-{version}-py3-none-any.whl", buf.getvalue()


class _Server:
    """An HTTP server on a free port of this machine, in a thread, recording request paths."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.requests: list[str] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.requests = self.requests  # type: ignore[attr-defined]
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Index(BaseHTTPRequestHandler):
    wheels: dict[str, tuple[str, str, bytes]] = {}  # file name -> (project, version, bytes)

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.requests.append(self.path)  # type: ignore[attr-defined]
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) == 2 and parts[0] == "simple" and parts[1] in PACKAGES:
            host = self.headers["Host"]
            files = [{"filename": f, "url": f"http://{host}/files/{f}",
                      "hashes": {"sha256": hashlib.sha256(data).hexdigest()},
                      "requires-python": ">=3.8", "core-metadata": True, "size": len(data)}
                     for f, (proj, _, data) in sorted(self.wheels.items()) if proj == parts[1]]
            body = json.dumps({"meta": {"api-version": "1.1"}, "name": parts[1],
                               "files": files, "versions": list(PACKAGES[parts[1]])}).encode()
            self._send(body, "application/vnd.pypi.simple.v1+json")
        elif len(parts) == 2 and parts[0] == "files" and parts[1] in self.wheels:
            self._send(self.wheels[parts[1]][2], "application/octet-stream")
        elif (len(parts) == 2 and parts[0] == "files" and parts[1].endswith(".metadata")
              and parts[1][:-len(".metadata")] in self.wheels):
            _, version, data = self.wheels[parts[1][:-len(".metadata")]]
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                meta = next(zf.read(n) for n in zf.namelist() if n.endswith("/METADATA"))
            self._send(meta, "text/plain")
        else:
            self.send_error(404)

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Refusing(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.requests.append(self.path)  # type: ignore[attr-defined]
        self.send_error(403, "the default index must not be asked")

    do_HEAD = do_GET


@pytest.fixture
def servers() -> Iterator[tuple[_Server, _Server]]:
    _Index.wheels = {}
    for name, versions in PACKAGES.items():
        for version, requires in versions.items():
            fname, data = _wheel(name, version, requires)
            _Index.wheels[fname] = (name, version, data)
    index, default = _Server(_Index), _Server(_Refusing)
    try:
        yield index, default
    finally:
        index.close()
        default.close()


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    (root / "metadata").mkdir(parents=True)
    (root / "matrix.yaml").write_text(MATRIX)
    (root / "metadata" / "pypi-snapshot.json").write_text(
        json.dumps({"schema": "verl-env/pypi-snapshot/v1", "releases": {}, "versions": {}}))
    return root


def _env(tmp: Path, index: str | None, default: _Server) -> dict[str, str]:
    """The environment of a user whose tools point at the default index (the refusing stand-in),
    with the site's index in VERL_ENV_INDEX_URL when ``index`` is given."""
    refuse = f"http://127.0.0.1:{default.port}/simple"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("UV_", "PIP_", "VERL_ENV_"))}
    env.update(PYTHONPATH=str(REPO), UV_DEFAULT_INDEX=refuse, UV_INDEX_URL=refuse,
               PIP_INDEX_URL=refuse, UV_CACHE_DIR=str(tmp / "uv-cache"),
               VERL_ENV_NETWORK_TIMEOUT="5")
    if index:
        env["VERL_ENV_INDEX_URL"] = index
    return env


def _run(site: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", *args], cwd=site, env=env,
                          capture_output=True, text=True, timeout=300)


def test_check_lock_and_propose_ask_only_the_sites_index(
        site: Path, tmp_path: Path, servers: tuple[_Server, _Server]) -> None:
    index, default = servers
    url = f"http://user:{SECRET}@127.0.0.1:{index.port}/simple"
    env = _env(tmp_path, url, default)
    proc = _run(site, env, "check", "--online")
    assert proc.returncode == 0, proc.stderr
    assert any(r.startswith("/simple/verl") for r in index.requests)
    snap = json.loads((site / "metadata" / "pypi-snapshot.json").read_text())
    assert "verl==0.9.1" in snap["releases"]
    seen = len(index.requests)
    proc = _run(site, env, "lock")
    assert proc.returncode == 0, proc.stderr
    lock = (site / "locks" / "tiny.txt").read_text()
    for pin in ("verl==0.9.1", "beta==2.1", "torch==2.11.0", "uv==0.13.9"):
        assert pin in lock
    assert len(index.requests) > seen, "lock resolved without asking the site's index"
    assert SECRET not in lock
    proc = _run(site, env, "check", "--locked")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _run(site, env, "propose", "--target", "tiny", "--online")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert default.requests == [], f"the default index was asked: {default.requests}"


def test_index_url_flag_and_site_config_are_the_sites_index(
        site: Path, tmp_path: Path, servers: tuple[_Server, _Server]) -> None:
    index, default = servers
    url = f"http://127.0.0.1:{index.port}/simple"
    env = _env(tmp_path, None, default)
    proc = _run(site, env, "check", "--online", "--index-url", url)
    assert proc.returncode == 0, proc.stderr
    (site / "build-env.toml").write_text(f'index_url = "{url}"\n')
    proc = _run(site, env, "lock")
    assert proc.returncode == 0, proc.stderr
    assert "verl==0.9.1" in (site / "locks" / "tiny.txt").read_text()
    assert default.requests == [], f"the default index was asked: {default.requests}"


@pytest.mark.parametrize("command", [["check", "--online"], ["lock"]])
def test_an_index_that_refuses_is_one_line_naming_it(
        site: Path, tmp_path: Path, servers: tuple[_Server, _Server], command: list[str]
        ) -> None:
    index, default = servers
    if command == ["lock"]:  # a snapshot first, from the working index
        ok = _run(site, _env(tmp_path, f"http://127.0.0.1:{index.port}/simple", default),
                  "check", "--online")
        assert ok.returncode == 0, ok.stderr
    bad = f"http://user:{SECRET}@127.0.0.1:{default.port}/simple"
    proc = _run(site, _env(tmp_path, bad, default), *command)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"127.0.0.1:{default.port}" in errors[0] and "--index-url" in errors[0], errors[0]
    assert SECRET not in proc.stderr + proc.stdout
    assert not (site / "locks" / "tiny.txt").exists()
