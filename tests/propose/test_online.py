"""`propose --online` against a package index on this machine (the PEP 691 JSON simple API and
PEP 658 metadata files, served over HTTP): the candidate releases' metadata and wheel names are
fetched, yanked releases are no candidates, and no wheel is ever downloaded."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from builder.resolve.metadata import IndexClient, Snapshot
from builder.propose.online import refresh_candidates
from builder.propose.proposal import propose
from builder.matrix.spec import load_matrix

DATA = Path(__file__).parent / "data"
# name -> version -> (requires_dist, requires_python, wheel tags, yanked)
INDEX: dict[str, dict[str, tuple[list[str], str, list[str], bool]]] = {
    "verl": {"0.9.1": (["transformers<5.11,>=5.5.3", "tensordict<=0.10.0"], ">=3.10",
                       ["py3-none-any"], False)},
    "vllm": {"0.24.0": (["torch==2.11.0", "transformers>=5.5.3"], ">=3.10",
                        ["cp38-abi3-manylinux_2_31_x86_64"], False),
             "0.31.0": (["torch==2.11.0", "transformers>=5.5.3"], ">=3.10",
                        ["cp38-abi3-manylinux_2_31_x86_64"], False),
             "0.32.0": (["torch==2.11.0"], ">=3.10", ["cp38-abi3-manylinux_2_31_x86_64"], True)},
    "torch": {"2.11.0": (['cuda-toolkit[cudart]==13.0.2; platform_system == "Linux"'], ">=3.10",
                         ["cp312-cp312-manylinux_2_28_x86_64"], False)},
    "transformers": {"5.9.0": ([], ">=3.10", ["py3-none-any"], False),
                     "5.10.4": ([], ">=3.10", ["py3-none-any"], False)},
    "ray": {"2.60.0": ([], ">=3.10", ["cp312-cp312-manylinux2014_x86_64"], False),
            "2.61.0": ([], ">=3.10", ["cp312-cp312-manylinux_2_39_x86_64"], False)},
    "tensordict": {"0.10.0": ([], ">=3.9", ["cp312-cp312-manylinux_2_28_x86_64"], False)},
}


class _Index(BaseHTTPRequestHandler):
    requests: ClassVar[list[str]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        type(self).requests.append(self.path)
        parts = self.path.strip("/").split("/")
        if parts[0] == "simple" and len(parts) == 2 and parts[1] in INDEX:
            name = parts[1]
            files = [{"filename": f"{name}-{v}-{tag}.whl", "hashes": {},
                      "url": f"http://{self.headers['Host']}/files/{name}-{v}-{tag}.whl",
                      "requires-python": rp, "core-metadata": True, "yanked": yanked}
                     for v, (_, rp, tags, yanked) in INDEX[name].items() for tag in tags]
            self._send(json.dumps({"name": name, "files": files,
                                   "versions": list(INDEX[name])}).encode(),
                       "application/vnd.pypi.simple.v1+json")
        elif parts[0] == "files" and self.path.endswith(".whl.metadata"):
            name, version = parts[1].split("-")[:2]
            reqs, rp, _, _ = INDEX[name][version]
            text = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" \
                   f"Requires-Python: {rp}\n" + "".join(f"Requires-Dist: {r}\n" for r in reqs)
            self._send(text.encode(), "text/plain")
        else:
            self.send_error(404)

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def index() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Index.requests = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


def test_online_refresh_fetches_metadata_and_wheel_names_only(index: str) -> None:
    target = load_matrix(DATA / "matrix.yaml").target("gpu")
    snapshot = Snapshot()
    missing = refresh_candidates(snapshot, [target], IndexClient(index))
    assert missing == []
    assert snapshot.versions["vllm"] == ["0.24.0", "0.31.0"]  # 0.32.0's files are all yanked
    assert snapshot.release("ray", "2.61.0").wheels == (
        "ray-2.61.0-cp312-cp312-manylinux_2_39_x86_64.whl",)
    assert snapshot.fetched
    # metadata files and project pages only: never a wheel
    assert not [r for r in _Index.requests if r.endswith(".whl")]
    assert any(r.endswith(".whl.metadata") for r in _Index.requests)
    p = propose(target, snapshot)
    new = {pin.name: pin.new for pin in p.pins}
    assert new["vllm"] == "0.31.0" and new["transformers"] == "5.10.4"
    ray = next(pin for pin in p.pins if pin.name == "ray")
    assert ray.new == "2.60.0" and "ray 2.61.0 has no wheel for x86_64" in ray.reason
