"""Write a build context: the rendering decided (:mod:`builder.render.context`), its Dockerfile,
then the files, into a directory replaced atomically, and only when it is absent, empty or a
context written earlier (no partial directory is left behind on error).

The context holds the Dockerfile, the lock split into install layers, the baked manifest, the
self-test package, the source builds' code and the local and prebuilt wheels the lock references.
The site CA bundle is never copied into it: it goes to the build as a BuildKit secret
(``BuildContext.secrets``), mounted only into the steps that fetch packages.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.resolve import prebuilt as prebuilt_wheels
from builder import shipped
from builder.errors import RenderError
from builder.files import (NotOurDirectory, check_replaceable, naming, replace_generated_dir,
                           sha256_file)
from builder.resolve.metadata import Snapshot
from builder.render.context import RenderContext, compute
from builder.render.dockerfile import render_dockerfile
from builder.render.stages import source_name, source_packages
from builder.resolve.sources import IGNORED, Pin, fetch_git, tree_sha256
from builder.matrix.spec import Target

PREBUILT_DIR = "/tmp/verl-env/prebuilt"


@dataclass(frozen=True)
class BuildContext:
    path: Path
    dockerfile: str
    labels: dict[str, str]
    manifest: dict[str, Any]
    lock_hash: str
    # BuildKit secrets the Dockerfile mounts: id -> file on this host (``--secret id=..,src=..``)
    secrets: dict[str, Path] = field(default_factory=dict)
    # what was left out, not fetched (``fetch=False``): the context is for reading only
    unfetched: tuple[str, ...] = ()


def site_index_secrets(index_url: str) -> dict[str, Path]:
    """The site's package index as the two BuildKit secrets the templates mount into every step
    that fetches packages (pip's and uv's system config files). They live in a private
    temporary directory (0700, files 0600) removed when this process exits; the URL (and a
    token in it) never reaches the context, a layer, a label or the log."""
    secret_dir = Path(tempfile.mkdtemp(prefix="verl-env-index-"))
    atexit.register(shutil.rmtree, secret_dir, True)
    os.chmod(secret_dir, 0o700)
    files = {"site-index-pip": ("pip.conf", f"[global]\nindex-url = {index_url}\n"),
             "site-index-uv": ("uv.toml", f"[[index]]\nurl = {json.dumps(index_url)}\n"
                                          "default = true\n")}
    out = {}
    for sid, (name, text) in files.items():
        path = secret_dir / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        out[sid] = path
    return out


# A build context carries this file: only a directory holding it (or an unmarked rendering by an
# earlier version: nothing at its top level but these names) is ever replaced by a new render.
CONTEXT_MARKER = ".verl-env-context"
CONTEXT_MARKER_TEXT = "a build context written by build-env render; replaced on the next render\n"
LEGACY_CONTEXT_NAMES = frozenset({"Dockerfile", "lock.txt", "manifest.json", "base.json", "layers",
                                  "source", "wheels", "selftest"})


def _check_output(out: Path, target: Target) -> None:
    """Refuse, before any work, an output that is not absent, empty or an earlier context."""
    try:
        check_replaceable(out.resolve(), CONTEXT_MARKER, LEGACY_CONTEXT_NAMES)
    except NotOurDirectory as exc:
        raise RenderError(str(exc), target=target.name) from None


def copy_sources(target: Target, dest: Path, pins: dict[str, Pin], *, fetch: bool = True
                 ) -> list[str]:
    """Every source build's code (for an sdist: its hashed requirement) into ``dest`` (the
    context's ``source/``), each checked against its pin: a git ref fetched on this host must
    still be the recorded commit (a moved ref is refused), a directory must hash as it did, an
    archive (local, or fetched from its URL) must have its sha256. ``fetch=False``: git and URL
    sources are left out (a context to read, not to build): their names are returned."""
    left = []
    for p in source_packages(target):
        pin = pins[p.name]
        if p.source is None:
            (dest / f"{p.name}.txt").write_text(
                f"{p.name}=={p.version} --hash={pin.value}\n")
            continue
        out = dest / source_name(p)
        if p.source.kind == "git":
            if fetch:
                fetch_git(target, p, pin.value, out)
            else:
                left.append(p.name)
            continue
        src = Path(p.source.location)
        if p.source.kind == "path" and src.is_dir():
            shutil.copytree(src, out, symlinks=True, ignore=shutil.ignore_patterns(*IGNORED))
            if tree_sha256(out) != pin.value:
                raise RenderError(f"{p.name}: {src} changed while it was copied",
                                  target=target.name)
            continue
        if p.source.kind == "path":
            shutil.copyfile(src, out)
        elif not fetch:
            left.append(p.name)
            continue
        else:
            try:
                with urllib.request.urlopen(p.source.location, timeout=120) as r, \
                        open(out, "wb") as f:
                    shutil.copyfileobj(r, f)
            except OSError as exc:
                raise RenderError(f"{p.name}: cannot fetch {p.source.location}: {exc}",
                                  target=target.name) from None
        got = sha256_file(out)
        if got != pin.value:
            raise RenderError(f"{p.name}: {p.source.location} has sha256 {got.split(':', 1)[1]}, "
                              f"expected {pin.value.split(':', 1)[1]}", target=target.name)
    return left


def render_context(target: Target, lock_text: str, snapshot: Snapshot, out: Path, *,
                   lock_file: Path | None = None, ca_bundle: Path | None = None,
                   templates: Path | None = None,
                   base_record: dict[str, Any] | None = None,
                   fetch_sources: bool = True, fetch_prebuilt: bool = True,
                   index_url: str | None = None) -> BuildContext:
    """Write the whole build context into ``out`` (replaced atomically; no partial directory is
    left behind on error). ``base_record``: the vendor base's record (builder.resolve.vendor); what the
    base already holds is left out of the layers, and the record travels in the context.
    ``fetch_sources=False``: git and URL sources are not fetched, ``fetch_prebuilt=False``: nor
    are prebuilt wheels from a URL (the Dockerfile, which names their pins, is the same; the
    context is for reading, not building: ``BuildContext.unfetched`` names what it lacks).
    ``index_url``: the site's own package index (default: ``VERL_ENV_INDEX_URL``, which
    ``--index-url`` and the site config set), handed to the build as secrets."""
    _check_output(out, target)
    index_url = index_url or os.environ.get("VERL_ENV_INDEX_URL") or None
    ctx = compute(target, lock_text, snapshot, lock_file=lock_file, ca_bundle=ca_bundle,
                  base_record=base_record, index_url=index_url)
    given, out = out, out.resolve()
    with naming(given):  # an unwritable --output names itself, not the staging directory
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        unfetched = []
        if ctx.source_builds:
            (tmp / "source").mkdir()
            unfetched = copy_sources(ctx.target, tmp / "source", ctx.pins, fetch=fetch_sources)
        dockerfile = render_dockerfile(ctx, templates)
        unfetched += _write_files(ctx, dockerfile, tmp, fetch_prebuilt)
        with naming(given):
            replace_generated_dir(tmp, out, CONTEXT_MARKER, LEGACY_CONTEXT_NAMES)
    except NotOurDirectory as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RenderError(str(exc), target=target.name) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    secrets = {"site-ca": ca_bundle.resolve()} if ca_bundle else {}
    if index_url:
        secrets.update(site_index_secrets(index_url))
    return BuildContext(out, dockerfile, ctx.labels, ctx.manifest, ctx.lock_hash, secrets,
                        tuple(unfetched))


def _write_files(ctx: RenderContext, dockerfile: str, tmp: Path, fetch_prebuilt: bool
                 ) -> list[str]:
    """Everything but the sources into ``tmp``, with fixed modes (stable context hashes) and
    the marker last. Returns the prebuilt wheels left out (``fetch_prebuilt=False``)."""
    (tmp / "Dockerfile").write_text(dockerfile)
    (tmp / "lock.txt").write_text(ctx.lock_text)
    (tmp / "manifest.json").write_text(json.dumps(ctx.manifest, indent=2, sort_keys=True) + "\n")
    if ctx.base_record is not None:  # part of the content tag
        (tmp / "base.json").write_text(json.dumps(ctx.base_record, indent=2, sort_keys=True)
                                       + "\n")
    (tmp / "layers").mkdir()
    left = _write_prebuilt(ctx, tmp, fetch_prebuilt) if ctx.chosen else []
    (tmp / "layers" / "00-tools.txt").write_text(
        "# verl-env tools: the installer\n" + "".join(p.render() for p in ctx.tools))
    for layer in ctx.layers:
        (tmp / "layers" / layer.filename).write_text(layer.render())
    if ctx.build_tools is not None:
        (tmp / "layers" / "build-tools.txt").write_text(ctx.build_tools)
    if ctx.local_wheels:
        (tmp / "wheels").mkdir()
        for w in ctx.local_wheels:
            shutil.copyfile(w, tmp / "wheels" / w.name)
    shipped.copy_selftest(tmp / "selftest")
    if ctx.bytecode is not None:  # the bytecode stage's script (base.bytecode_image)
        (tmp / "bytecode").mkdir()
        (tmp / "bytecode" / "compile.py").write_bytes(shipped.native_bytecode_script())
    for path in sorted(tmp.rglob("*")):  # fixed mtimes/modes: stable context hashes
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    (tmp / CONTEXT_MARKER).write_text(CONTEXT_MARKER_TEXT)
    os.chmod(tmp / CONTEXT_MARKER, 0o644)
    return left


def _write_prebuilt(ctx: RenderContext, tmp: Path, fetch: bool) -> list[str]:
    """The prebuilt wheels `lock` chose, and their layer; ``fetch=False``: a wheel behind a URL
    is left out (its name returned)."""
    (tmp / "prebuilt").mkdir()
    lines, left = [], []
    for name, entry in sorted(ctx.chosen.items()):
        if not fetch and "://" in entry["url"]:
            left.append(name)
        else:
            prebuilt_wheels.fetch(ctx.target, entry, tmp / "prebuilt")
        lines.append(f"{name} @ file://{PREBUILT_DIR}/{entry['filename']} "
                     f"--hash=sha256:{entry['sha256']}\n")
    (tmp / "layers" / "prebuilt.txt").write_text(
        "# verl-env prebuilt wheels chosen by `build-env lock` (locks/T.prebuilt.json)\n"
        + "".join(lines))
    return left
