"""Faults during ``build-env publish``, on the suite's real ``docker-registry`` and ``dockerd``.

A loopback TCP proxy (:class:`CutProxy`) sits between ``build-env`` (and the engine, which pushes
the image) and the registry. It watches the request lines going up and, once a chosen request
has sent N bytes of its body, fires: it SIGKILLs the registry process (the registry really dies,
mid-blob), or SIGKILLs ``build-env`` itself, or holds the transfer until the test lets it go.
The registry is then started again on the same storage and the same command is run again.

What is checked each time (docs/reliability.md, "The registry dies", "Killed with SIGKILL",
"Two runs at once"): the failed run exits 1 naming the stage; ``publish.json`` is not written,
``publish.incomplete.json`` says what is in the registry by digest and what was not published;
the release tags still name the previous release (a real manifest pushed before the fault);
the re-run completes, and the registry's own access log shows it uploaded no blob the registry
already held after the fault.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from builder.publish import push as publish
from builder.publish import transfer
from builder.gate import verdicts
from builder.engine import Engine
from builder.errors import PublishError
from builder.trust import keys
from tests.conftest import OUTSIDE, installed_build_env
from tests.publish.conftest import REPO, RegistryServer, close_socket, pipe, start_registry
from tests.sif.images import LAYERED_TAG
from tests.trust.conftest import keypair, report, sbom_doc  # noqa: F401

pytestmark = [pytest.mark.fault, pytest.mark.docker, pytest.mark.registry, pytest.mark.heavy]

METHODS = (b"GET ", b"HEAD ", b"POST ", b"PUT ", b"PATCH ", b"DELETE ")
KIB = 1024


# --------------------------------------------------------------------------- the proxy


class CutProxy:
    """A loopback TCP proxy to ``target`` that fires ``action`` once a request whose request line
    satisfies ``trigger`` has sent more than ``after`` bytes upstream (request line and body).
    ``target`` may change (a registry restarted on another port); ``sent`` counts every byte
    sent upstream since the last :meth:`reset`; with ``hold`` set, the triggering request's
    bytes wait until :meth:`release`."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.trigger: Callable[[bytes], bool] | None = None
        self.after = 0
        self.action: Callable[[], None] = lambda: None
        self.hold = False
        self.fired = threading.Event()
        self._released = threading.Event()
        self.sent = 0
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.host = f"127.0.0.1:{self._server.getsockname()[1]}"
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, trigger: Callable[[bytes], bool], after: int, action: Callable[[], None],
            hold: bool = False) -> None:
        self.trigger, self.after, self.action, self.hold = trigger, after, action, hold
        self.fired.clear()
        self._released.clear()

    def disarm(self) -> None:
        self.trigger = None
        self.release()

    def release(self) -> None:
        self._released.set()

    def reset(self) -> None:
        with self._lock:
            self.sent = 0
            self.lines = []

    def stop(self) -> None:
        self._stop.set()
        self._released.set()
        self._server.close()
        for conn in list(self._conns):
            close_socket(conn)

    def _accept(self) -> None:
        self._server.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        host, port = self.target.split(":")
        try:
            upstream = socket.create_connection((host, int(port)), timeout=5)
        except OSError:  # the registry is down: the client sees its connection closed
            close_socket(conn)
            return
        upstream.settimeout(None)
        self._conns += [conn, upstream]
        threading.Thread(target=pipe, args=(upstream, conn), daemon=True).start()
        self._up(conn, upstream)

    def _up(self, src: socket.socket, dst: socket.socket) -> None:
        """Client to registry: follow the request lines, count, fire."""
        current, count = b"", 0
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                starts = [i for m in METHODS for i in _find_all(data, m + b"/v2/")
                          if i == 0 or data[i - 2:i] == b"\r\n"]
                if starts:
                    start = max(starts)
                    current = data[start:].split(b"\r\n", 1)[0]
                    count = len(data) - start
                    with self._lock:
                        self.lines.append(current.decode(errors="replace"))
                else:
                    count += len(data)
                trigger = self.trigger
                if (trigger is not None and not self.fired.is_set() and trigger(current)
                        and count > self.after):
                    self.fired.set()
                    if self.hold:
                        self._released.wait(120)
                    else:
                        self.action()
                        break
                dst.sendall(data)
                with self._lock:
                    self.sent += len(data)
        except OSError:
            pass
        finally:
            close_socket(src)
            close_socket(dst)


def _find_all(data: bytes, needle: bytes) -> Iterator[int]:
    i = data.find(needle)
    while i != -1:
        yield i
        i = data.find(needle, i + 1)


@pytest.fixture
def proxies() -> Iterator[Callable[[str], CutProxy]]:
    made: list[CutProxy] = []

    def make(target: str) -> CutProxy:
        made.append(CutProxy(target))
        return made[-1]

    try:
        yield make
    finally:
        for proxy in made:
            proxy.stop()


@pytest.fixture
def restarted() -> Iterator[list[RegistryServer]]:
    """Registries the tests start again on a killed one's storage: stopped by PID at teardown."""
    started: list[RegistryServer] = []
    try:
        yield started
    finally:
        for server in started:
            server.stop()


# --------------------------------------------------------------------------- helpers


def _kill_registry(reg: RegistryServer, *, once_uploaded: int = 0) -> Callable[[], None]:
    """SIGKILL the registry (its triggering request held meanwhile), once its log shows
    ``once_uploaded`` completed blob uploads (at most 20 s later) and their answers have had a
    second to reach the client."""
    def kill() -> None:
        deadline = time.monotonic() + 20
        while len(_uploaded(reg.log())) < once_uploaded and time.monotonic() < deadline:
            time.sleep(0.05)
        if once_uploaded:
            time.sleep(1.0)
        reg.proc.send_signal(signal.SIGKILL)
        reg.proc.wait(timeout=10)
    return kill


def _restart(reg: RegistryServer, started: list[RegistryServer], proxy: CutProxy) -> tuple[
        RegistryServer, str]:
    """The registry started again on the killed one's storage (a new port behind the same proxy
    address); returns it and the killed one's log (``registry.log`` is started afresh)."""
    assert reg.proc.poll() is not None, "the registry was meant to be dead"
    old_log = reg.log()
    again = start_registry(reg.root)
    started.append(again)
    proxy.target = again.host
    return again, old_log


def _stored_blobs(reg: RegistryServer) -> set[str]:
    """The blobs the registry holds complete (in-progress uploads live elsewhere)."""
    root = reg.root / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256"
    return {"sha256:" + p.parent.name for p in root.glob("*/*/data")}


def _linked_blobs(reg: RegistryServer) -> set[str]:
    """The blobs the registry serves for the repository (``HEAD /v2/REPO/blobs/D`` answers 200):
    a blob is linked only after its data is stored, so a registry killed between the two holds
    data it does not serve, and an engine rightly sends that blob again."""
    root = reg.root / "data" / "docker" / "registry" / "v2" / "repositories" / REPO / "_layers"
    return {"sha256:" + p.parent.name for p in root.glob("sha256/*/link")}


def _partial_uploads(reg: RegistryServer) -> list[Path]:
    uploads = reg.root / "data" / "docker" / "registry" / "v2" / "repositories" / REPO / "_uploads"
    return sorted(uploads.iterdir()) if uploads.is_dir() else []


_UPLOADED = re.compile(r'"PUT /v2/[^ "]*/blobs/uploads/[^ "]*digest=sha256(?:%3A|:)([0-9a-f]{64})'
                       r'[^ "]* HTTP/1\.1" 201 ')


def _uploaded(log: str) -> list[str]:
    """Every blob upload the registry completed, from its access log."""
    return ["sha256:" + m.group(1) for m in _UPLOADED.finditer(log)]


def _tag_digest(reg: RegistryServer, tag: str, accept: str) -> str | None:
    r = requests.get(f"http://{reg.host}/v2/{REPO}/manifests/{tag}", timeout=30,
                     headers={"Accept": accept})
    if r.status_code == 404:
        return None
    assert r.status_code == 200, r.text
    return "sha256:" + hashlib.sha256(r.content).hexdigest()


def _previous_release(reg: RegistryServer, tags: tuple[str, ...]) -> str:
    """What the release tags named before: a small real OCI manifest under each tag."""
    base = f"http://{reg.host}/v2/{REPO}"
    config = b'{"previous":"release"}'
    digest = "sha256:" + hashlib.sha256(config).hexdigest()
    r = requests.post(f"{base}/blobs/uploads/", timeout=30)
    location = requests.compat.urljoin(f"http://{reg.host}/", r.headers["Location"])
    sep = "&" if "?" in location else "?"
    assert requests.put(f"{location}{sep}digest={digest}", data=config,
                        timeout=30).status_code == 201
    manifest = json.dumps({"schemaVersion": 2, "mediaType": publish.OCI_MANIFEST,
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": digest, "size": len(config)},
                           "layers": []}).encode()
    for tag in tags:
        assert requests.put(f"{base}/manifests/{tag}", data=manifest, timeout=30,
                            headers={"Content-Type": publish.OCI_MANIFEST}).status_code == 201
    return "sha256:" + hashlib.sha256(manifest).hexdigest()


def _args(host: str, tmp_path: Path, sif: Path, *extra: str) -> tuple[list[str], dict[str, str]]:
    record = tmp_path / "record.json"
    args = ["publish", "--image", LAYERED_TAG, "--force", "--registry", f"{host}/{REPO}",
            "--tag", "layers", "--record", str(record), "--json", "--sif", str(sif), *extra]
    env = {**os.environ, "HOME": str(tmp_path / "home"),
           "DOCKER_CONFIG": str(tmp_path / "docker-config")}
    env.pop("PYTHONPATH", None)
    return [str(installed_build_env()), *args], env


def _run(host: str, tmp_path: Path, sif: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv, env = _args(host, tmp_path, sif, *extra)
    return subprocess.run(argv, cwd=OUTSIDE, text=True, capture_output=True, env=env,
                          timeout=600)


def _start(host: str, tmp_path: Path, sif: Path, *extra: str) -> subprocess.Popen[str]:
    argv, env = _args(host, tmp_path, sif, *extra)
    return subprocess.Popen(argv, cwd=OUTSIDE, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


def _sif_put(sif: Path) -> Callable[[bytes], bool]:
    hexdigest = hashlib.sha256(sif.read_bytes()).hexdigest().encode()
    return lambda line: line.startswith(b"PUT ") and hexdigest in line


def _layer_patch(line: bytes) -> bool:
    return line.startswith(b"PATCH ") and b"/blobs/uploads/" in line


def _assert_released(reg: RegistryServer, record: dict[str, Any]) -> None:
    """The release tags name exactly what the record says was published."""
    assert record["status"] == "published"
    assert _tag_digest(reg, "layers", publish.MANIFEST_ACCEPT) == record["image_digest"]
    assert _tag_digest(reg, "layers-sif", publish.OCI_MANIFEST) == record["sif"]["digest"]


def _assert_complete_rerun(proc: subprocess.CompletedProcess[str], tmp_path: Path,
                           reg: RegistryServer) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "record.json").read_text())
    assert json.loads(proc.stdout)["image_digest"] == record["image_digest"]
    _assert_released(reg, record)
    assert not publish.incomplete_path(tmp_path / "record.json").exists()
    assert not list(tmp_path.glob(".record*"))  # no temp file of either record
    return record


def _assert_incomplete(tmp_path: Path, stage: str, done: list[str],
                       stages: tuple[str, ...] = ("image push", "SIF upload", "release tags")
                       ) -> dict[str, Any]:
    assert not (tmp_path / "record.json").exists()  # nothing that looks finished
    left = json.loads(publish.incomplete_path(tmp_path / "record.json").read_text())
    assert left["status"] == "incomplete" and left["stage"] == stage
    assert left["stages_done"] == done
    assert left["not_published"] == [s for s in stages if s not in done]
    assert set(left["release_tags"].values()) == {"not moved (names what it named before)"}
    return left


# --------------------------------------------------------------------------- the registry dies


def test_registry_dies_during_image_push(registry: RegistryServer, proxies: Any,
                                         restarted: list[RegistryServer], layered: Any,
                                         layered_sif: Path, tmp_path: Path) -> None:
    """The registry is SIGKILLed while the engine sends an image layer (64 KiB into a layer's
    ``PATCH``, held there until two other blobs are complete), and stays down while the engine
    retries (its own 5 tries, about 50 s, then ``--attempts``): exit 1 naming the image push;
    no release tag moved; then, on the same storage, the same command finishes, uploading only
    the blobs the registry did not hold."""
    previous = _previous_release(registry, ("layers", "layers-sif"))
    proxy = proxies(registry.host)
    proxy.arm(_layer_patch, 64 * KIB, _kill_registry(registry, once_uploaded=3))
    started = time.monotonic()
    proc = _run(proxy.host, tmp_path, layered_sif, "--attempts", "2")
    first_s = time.monotonic() - started
    assert proxy.fired.is_set(), proxy.lines
    assert proc.returncode == 3, proc.stderr  # the registry stayed down: infrastructure
    assert "publish: image push failed: " in proc.stderr, proc.stderr
    assert "no release tag was moved" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    left = _assert_incomplete(tmp_path, "image push", [])
    assert left["published"] == {} and "layers-staging" in left["error"]

    proxy.disarm()
    again, log1 = _restart(registry, restarted, proxy)
    held = _linked_blobs(again)  # what the killed registry serves for the repository
    completed = set(_uploaded(log1))  # the previous release's config and 2+ layers
    assert len(completed) >= 3 and completed <= held, (completed, held)
    assert _tag_digest(again, "layers", publish.OCI_MANIFEST) == previous  # never moved
    assert _tag_digest(again, "layers-sif", publish.OCI_MANIFEST) == previous
    assert _tag_digest(again, "layers-staging", publish.MANIFEST_ACCEPT) is None
    proxy.reset()
    proc = _run(proxy.host, tmp_path, layered_sif, "--attempts", "2")
    record = _assert_complete_rerun(proc, tmp_path, again)
    uploaded = _uploaded(again.log())
    assert uploaded and not set(uploaded) & held, (set(uploaded) & held, completed)
    assert len(uploaded) == len(set(uploaded))
    assert record["sif"]["blob_digest"] in uploaded
    assert _stored_blobs(again) >= set(uploaded) | held
    print(f"first run {first_s:.0f} s; blobs held after the kill {len(held)} "
          f"(completed in the first run: {len(_uploaded(log1))}); uploaded again: "
          f"{len(uploaded)}, {proxy.sent} bytes sent in the re-run")


def test_registry_dies_during_sif_upload(registry: RegistryServer, proxies: Any,
                                         restarted: list[RegistryServer], layered: Any,
                                         layered_sif: Path, tmp_path: Path) -> None:
    """The registry is SIGKILLed 256 KiB into the SIF blob's upload: exit 1 naming the SIF
    upload, the image in the registry by digest only (its tag unmoved); after a restart on the
    same storage, the re-run uploads the SIF blob and nothing else."""
    previous = _previous_release(registry, ("layers", "layers-sif"))
    proxy = proxies(registry.host)
    proxy.arm(_sif_put(layered_sif), 256 * KIB, _kill_registry(registry))
    proc = _run(proxy.host, tmp_path, layered_sif, "--attempts", "2")
    assert proxy.fired.is_set(), proxy.lines
    assert proc.returncode == 3, proc.stderr
    assert "publish: SIF upload failed: " in proc.stderr, proc.stderr
    assert "no release tag was moved" in proc.stderr
    left = _assert_incomplete(tmp_path, "SIF upload", ["image push"])
    image = left["published"]["image"]
    assert set(left["published"]) == {"image"} and image["digest"] in proc.stderr

    proxy.disarm()
    again, _ = _restart(registry, restarted, proxy)
    assert _tag_digest(again, "layers", publish.MANIFEST_ACCEPT) == previous
    assert _tag_digest(again, "layers-sif", publish.OCI_MANIFEST) == previous
    assert _tag_digest(again, "layers-staging", publish.MANIFEST_ACCEPT) == image["digest"]
    held = _stored_blobs(again)
    sif_blob = "sha256:" + hashlib.sha256(layered_sif.read_bytes()).hexdigest()
    assert sif_blob not in held and _partial_uploads(again)  # the cut upload, left aside
    proxy.reset()
    proc = _run(proxy.host, tmp_path, layered_sif, "--attempts", "2")
    record = _assert_complete_rerun(proc, tmp_path, again)
    assert record["image_digest"] == image["digest"]
    log = again.log()
    assert _uploaded(log) == [sif_blob]  # the image's layers and the config: not again
    assert '"PATCH /v2/' not in log
    print(f"re-run sent {proxy.sent} bytes; the SIF is {layered_sif.stat().st_size}")


def test_registry_dies_during_attestations(registry: RegistryServer, proxies: Any,
                                          restarted: list[RegistryServer], layered: Any,
                                          layered_sif: Path, keypair: keys.KeyFiles,
                                          report: Path, sbom_doc: dict[str, Any],
                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """``publish --sign-key``: the registry is SIGKILLed as the first signed statement goes up
    (the first blob upload after the SIF manifest): the error names the attestations stage;
    image and SIF are in the registry by digest, no release tag names them; after a restart the same
    publish attaches the statements, moves the tags and uploads neither image nor SIF again."""
    monkeypatch.setattr(transfer, "RETRY_BASE_S", 0.1)
    own = tmp_path / "report.json"  # the build report, about the layered image
    own.write_text(json.dumps({**json.loads(report.read_text()), "image_id": layered.id}))
    verdict = verdicts.Verdict(layered.id, 0, {"overall": "pass",
                                               "gate": {"scope": "release", "family": "cpu"}})
    previous = _previous_release(registry, ("layers", "layers-sif"))
    proxy = proxies(registry.host)
    sif_manifest_sent: list[bytes] = []

    def first_envelope(line: bytes) -> bool:
        if line.startswith(b"PUT ") and b"/manifests/sha256:" in line:
            sif_manifest_sent.append(line)
        return bool(sif_manifest_sent) and line.startswith(b"PUT ") and b"/blobs/" in line

    proxy.arm(first_envelope, 0, _kill_registry(registry))
    engine = Engine.connect()
    image = engine.image(LAYERED_TAG)
    record_path = tmp_path / "record.json"

    def run() -> dict[str, Any]:
        return publish.publish(engine, image, f"{proxy.host}/{REPO}", tag="layers",
                               sif=layered_sif, target=None, record_path=record_path,
                               attempts=2, sign_key=keypair.private, report=own,
                               verdict=verdict, sbom_doc=sbom_doc)

    with pytest.raises(PublishError, match=r"^publish: attestations failed: ") as err:
        run()
    assert proxy.fired.is_set() and "no release tag was moved" in str(err.value)
    left = _assert_incomplete(tmp_path, "attestations", ["image push", "SIF upload"],
                              ("image push", "SIF upload", "attestations", "release tags"))
    assert set(left["published"]) == {"image", "sif"}

    proxy.disarm()
    again, _ = _restart(registry, restarted, proxy)
    assert _tag_digest(again, "layers", publish.MANIFEST_ACCEPT) == previous
    assert _tag_digest(again, "layers-sif", publish.OCI_MANIFEST) == previous
    held = _stored_blobs(again)
    assert left["published"]["sif"]["blob_digest"] in held
    record = run()
    assert json.loads(record_path.read_text())["published_at"] == record["published_at"]
    _assert_released(again, record)
    assert record["image_digest"] == left["published"]["image"]["digest"]
    assert {"image", "sif"} <= set(record["attestations"])
    assert not publish.incomplete_path(record_path).exists()
    uploaded = _uploaded(again.log())
    assert uploaded and not set(uploaded) & held, set(uploaded) & held  # only the envelopes


# --------------------------------------------------------------------------- killed with SIGKILL


def test_publish_sigkilled_during_sif_upload(registry: RegistryServer, proxies: Any,
                                             layered: Any, layered_sif: Path,
                                             tmp_path: Path) -> None:
    """``build-env publish`` SIGKILLed 256 KiB into the SIF upload: it leaves
    ``record.incomplete.json`` (stage "SIF upload", its pid) and an abandoned upload session in
    the registry; the same command then cleans the temp file a kill inside a record write
    leaves (planted here: that window is too short to hit), ignores the abandoned upload and
    completes, sending only the SIF blob."""
    proxy = proxies(registry.host)
    proc = _start(proxy.host, tmp_path, layered_sif)

    def kill_build_env() -> None:
        os.kill(proc.pid, signal.SIGKILL)

    proxy.arm(_sif_put(layered_sif), 256 * KIB, kill_build_env)
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL and proxy.fired.is_set()
    left = _assert_incomplete(tmp_path, "SIF upload", ["image push"])
    assert left["pid"] == proc.pid and left["error"] is None
    assert _partial_uploads(registry)
    (tmp_path / ".record.json.k1ll3d_").write_text('{"schema": "verl-env/publish-rec')
    proxy.disarm()
    mark = len(registry.log())
    again = _run(proxy.host, tmp_path, layered_sif)
    _assert_complete_rerun(again, tmp_path, registry)
    sif_blob = "sha256:" + hashlib.sha256(layered_sif.read_bytes()).hexdigest()
    assert _uploaded(registry.log()[mark:]) == [sif_blob]


# --------------------------------------------------------------------------- two runs at once


def test_two_publishes_of_one_record_at_once(registry: RegistryServer, proxies: Any,
                                             layered: Any, layered_sif: Path,
                                             tmp_path: Path) -> None:
    """The first publish is held in the middle of its SIF upload; a second one of the same
    image to the same record says it waits for the first (its pid), waits, then publishes
    without uploading any blob again; the record is whole and names what the tags name."""
    proxy = proxies(registry.host)
    proxy.arm(_sif_put(layered_sif), 64 * KIB, lambda: None, hold=True)
    first = _start(proxy.host, tmp_path, layered_sif)
    try:
        assert proxy.fired.wait(120), proxy.lines
        second = _start(proxy.host, tmp_path, layered_sif)
        waited: list[str] = []
        reader = threading.Thread(target=lambda: waited.extend(second.stderr or []),
                                  daemon=True)
        reader.start()
        deadline = time.monotonic() + 60
        while not any("waiting for" in line for line in waited):
            assert time.monotonic() < deadline and second.poll() is None, waited
            time.sleep(0.2)
        assert f"waiting for pid {first.pid}: publish of" in "".join(waited)
    finally:
        proxy.release()
    out1, err1 = first.communicate(timeout=300)
    out2, _ = second.communicate(timeout=300)
    reader.join(10)
    assert first.returncode == 0, err1
    assert second.returncode == 0, "".join(waited)
    record = json.loads((tmp_path / "record.json").read_text())
    printed = json.loads(out2)
    assert printed.pop("record") == str(tmp_path / "record.json") and printed == record
    _assert_released(registry, record)
    assert json.loads(out1)["image_digest"] == record["image_digest"]
    uploaded = _uploaded(registry.log())
    assert len(uploaded) == len(set(uploaded)), uploaded  # no blob went up twice
    assert not publish.incomplete_path(tmp_path / "record.json").exists()
