"""Prebuilt first (builder/resolve/prebuilt.py): a source-built package that names hashed prebuilt wheels
is installed from a fitting one and built from source only on a miss; the choice and its reason
are in the lock's record, the image's manifest and labels, and `build-env list`."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.resolve import prebuilt
from builder.cli import main
from builder.errors import RenderError
from builder.resolve.lock import lock_path, stale_reason
from builder.resolve.metadata import load_snapshot
from builder.render import render_context
from builder.matrix.spec import load_matrix
from tests.core.test_source_shape import make_site

PKG = "simplejson"
LINE = '      simplejson: {version: "4.3.0", build: source}'


def _wheel(d: Path, tag: str) -> Path:
    """A real (small) wheel file of simplejson 4.3.0 with the given tags."""
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"simplejson-4.3.0-{tag}.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("simplejson/__init__.py", "")
        z.writestr("simplejson-4.3.0.dist-info/METADATA",
                   "Metadata-Version: 2.1\nName: simplejson\nVersion: 4.3.0\n")
    return path


def _site(root: Path, entries: str) -> Path:
    matrix = make_site(root)
    text = matrix.read_text()
    assert LINE in text
    matrix.write_text(text.replace(LINE, LINE[:-1] + f", prebuilt: {entries}}}"))
    return matrix


def _lock(matrix: Path, name: str = "cuda-shaped") -> dict:
    """What `build-env lock` records for the prebuilt wheels (without resolving the rest)."""
    from builder.resolve import sources

    t = load_matrix(matrix).target(name)
    lock = lock_path(matrix, t)
    sources.write_record(lock, sources.pin_git(t, lock))
    record = prebuilt.lock_prebuilt(t)
    prebuilt.write_record(lock, record)
    return record


def _render(matrix: Path, out: Path, name: str = "cuda-shaped"):
    m = load_matrix(matrix)
    t = m.target(name)
    lock = lock_path(m.path, t)
    return render_context(t, lock.read_text(), load_snapshot(
        m.path.parent / "metadata" / "pypi-snapshot.json"), out, lock_file=lock)


def test_a_fitting_wheel_in_a_wheelhouse_replaces_the_source_build(tmp_path: Path,
                                                                   capsys) -> None:
    _wheel(tmp_path / "wh", "cp312-cp312-linux_x86_64")  # another python: not it
    good = _wheel(tmp_path / "wh", "py3-none-any")
    sha = hashlib.sha256(good.read_bytes()).hexdigest()
    matrix = _site(tmp_path / "site", f"[{{wheelhouse: {tmp_path / 'wh'}}}]")
    record = _lock(matrix)
    assert record[PKG]["choice"] == "wheel" and record[PKG]["sha256"] == sha
    assert "py3-none-any.whl from the wheelhouse" in record[PKG]["why"]
    ctx = _render(matrix, tmp_path / "ctx")
    df = ctx.dockerfile
    assert "AS source-simplejson" not in df  # no source build on a hit
    assert "AS source-verl-env-cuda-ext" in df  # the others still build
    assert "--mount=type=bind,source=prebuilt,target=/tmp/verl-env/prebuilt" in df
    assert (ctx.path / "layers" / "prebuilt.txt").read_text().splitlines()[1] == (
        f"{PKG} @ file:///tmp/verl-env/prebuilt/{good.name} --hash=sha256:{sha}")
    assert (ctx.path / "prebuilt" / good.name).read_bytes() == good.read_bytes()
    # the lock pins simplejson too (the index has wheels): no layer installs that one instead
    layers = [f for f in (ctx.path / "layers").glob("[0-9]*.txt")]
    assert layers and not any(f"\n{PKG}==" in f.read_text() for f in layers)
    assert ctx.manifest["prebuilt"][PKG]["choice"] == "wheel"
    assert PKG not in ctx.manifest["source_builds"]
    assert ctx.labels[f"org.verl-env.prebuilt.{PKG}"] == f"{good.name} sha256:{sha}"
    assert main(["list", "--matrix", str(matrix)]) == 0
    out = capsys.readouterr().out
    assert f"cuda-shaped: {PKG}: prebuilt wheel {good.name} (prebuilt[0]:" in out
    assert main(["list", "--json", "--matrix", str(matrix)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["targets"]["cuda-shaped"]["prebuilt_choice"][PKG]["choice"] == "wheel"


def test_what_fits() -> None:
    from builder.matrix.spec import Package

    t = load_matrix(make_site_matrix()).target("cuda-shaped")  # python 3.11, x86_64, glibc 2.36
    p = Package("flash-attn", "2.8.3", build="source")
    assert prebuilt.fits("flash_attn-2.8.3+cu130torch2.11-cp311-cp311-linux_x86_64.whl", p, t) \
        is None
    assert prebuilt.fits("flash_attn-2.8.3-cp311-cp311-manylinux_2_28_x86_64.whl", p, t) is None
    assert "glibc 2.36" in prebuilt.fits(
        "flash_attn-2.8.3-cp311-cp311-manylinux_2_39_x86_64.whl", p, t)
    assert "not flash-attn 2.8.3" in prebuilt.fits(
        "flash_attn-2.8.2-cp311-cp311-linux_x86_64.whl", p, t)
    assert prebuilt.fits("flash_attn-2.8.3-cp311-cp311-linux_aarch64.whl", p, t)
    assert prebuilt.fits("flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl", p, t)


def make_site_matrix() -> Path:
    return Path(__file__).resolve().parents[1] / "fixtures" / "cuda" / "matrix.yaml"


def test_a_miss_is_built_from_source_and_says_why(tmp_path: Path) -> None:
    _wheel(tmp_path / "wh", "cp312-cp312-manylinux_2_28_x86_64")
    other = _wheel(tmp_path / "other", "py3-none-any")
    entries = (f"[{{url: 'file://{other}', sha256: '{'0' * 64}', python: '3.12', "
               f"arch: aarch64}}, {{wheelhouse: {tmp_path / 'wh'}}}]")
    matrix = _site(tmp_path / "site", entries)
    record = _lock(matrix)
    assert record[PKG]["choice"] == "source"
    why = record[PKG]["why"]
    assert "prebuilt[0] is for python 3.12 on aarch64" in why
    assert "no wheel of simplejson 4.3.0 for cp311 on x86_64 among 1" in why
    assert "cp312-cp312-manylinux_2_28_x86_64" in why
    ctx = _render(matrix, tmp_path / "ctx")
    assert "AS source-simplejson" in ctx.dockerfile
    assert "prebuilt.txt" not in ctx.dockerfile
    assert ctx.manifest["prebuilt"][PKG] == {"choice": "source", "why": why}
    assert ctx.labels[f"org.verl-env.prebuilt.{PKG}"] == "none fits: built from source"


@pytest.fixture()
def index(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A PEP 503 simple index on loopback serving one wheel with its #sha256."""
    root = tmp_path / "index"
    wheel = _wheel(root / "files", "py3-none-any")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (root / "simple" / PKG).mkdir(parents=True)
    (root / "simple" / PKG / "index.html").write_text(
        f'<html><body><a href="../../files/{wheel.name}#sha256={sha}">{wheel.name}</a>'
        "</body></html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", wheel
    finally:
        server.shutdown()
        server.server_close()


def test_a_pep503_index_is_a_wheelhouse(tmp_path: Path, index: tuple[str, Path]) -> None:
    url, wheel = index
    matrix = _site(tmp_path / "site", f"[{{wheelhouse: '{url}'}}]")
    record = _lock(matrix)
    assert record[PKG]["choice"] == "wheel" and record[PKG]["url"].endswith(wheel.name)
    assert record[PKG]["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    ctx = _render(matrix, tmp_path / "ctx")
    assert (ctx.path / "prebuilt" / wheel.name).read_bytes() == wheel.read_bytes()


def test_a_wheel_that_changed_since_lock_is_refused(tmp_path: Path) -> None:
    good = _wheel(tmp_path / "wh", "py3-none-any")
    matrix = _site(tmp_path / "site", f"[{{wheelhouse: {tmp_path / 'wh'}}}]")
    _lock(matrix)
    good.write_bytes(good.read_bytes() + b"\0")
    with pytest.raises(RenderError, match="has sha256 .*, the lock recorded"):
        _render(matrix, tmp_path / "ctx")
    assert not (tmp_path / "ctx").exists()


def test_changed_prebuilt_entries_make_the_lock_stale(tmp_path: Path) -> None:
    _wheel(tmp_path / "wh", "py3-none-any")
    matrix = _site(tmp_path / "site", f"[{{wheelhouse: {tmp_path / 'wh'}}}]")
    _lock(matrix)
    m = load_matrix(matrix)
    t = m.target("cuda-shaped")
    snap = load_snapshot(m.path.parent / "metadata" / "pypi-snapshot.json")
    assert stale_reason(t, snap, lock_path(m.path, t)) is None
    (tmp_path / "wh2").mkdir()
    matrix.write_text(matrix.read_text().replace(str(tmp_path / "wh"), str(tmp_path / "wh2")))
    t = load_matrix(matrix).target("cuda-shaped")
    reason = stale_reason(t, snap, lock_path(m.path, t))
    assert reason and "prebuilt-or-source" in reason and PKG in reason


@pytest.mark.parametrize("entries,needle", [
    ("[{url: 'https://x/a.whl', sha256: 'ab'}]", "needs its python"),
    ("[{url: 'https://x/a.tar.gz', sha256: '" + "a" * 64 + "', python: '3.11', arch: x86_64}]",
     "the URL of a .whl file"),
    ("[{wheelhouse: /x, url: 'https://x/a.whl'}]", "expected {url"),
])
def test_bad_prebuilt_entries_are_matrix_errors(tmp_path: Path, capsys, entries: str,
                                                needle: str) -> None:
    matrix = _site(tmp_path / "site", entries)
    assert main(["check", "--matrix", str(matrix)]) == 2
    err = capsys.readouterr().err
    assert "matrix.yaml:30:" in err and f"packages.{PKG}.prebuilt" in err and needle in err
