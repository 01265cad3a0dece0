"""Render a target into a complete, deterministic Docker build context (pure apart from file I/O).

Same inputs give byte-identical output: templates render with ``StrictUndefined``, every mapping
is sorted, nothing records the time or the host. The context holds the Dockerfile, the lock split
into install layers, the baked manifest, the self-test package and local wheels the lock
references. The site CA bundle is never copied into the context: it goes to the build as a BuildKit
secret (``BuildContext.secrets``), mounted only into the steps that fetch packages.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from builder import __version__
from builder import vendor as vendor_base
from builder.errors import RenderError
from builder.families import family
from builder.files import (NotOurDirectory, check_replaceable, replace_generated_dir,
                           sha256_file)
from builder.layers import Layer, split_layers
from builder.lock import LockedPackage, build_lock_path, parse_lock
from builder.metadata import Snapshot
from builder.spec import Package, Target

LABEL_NS = "org.verl-env"
MANIFEST_SCHEMA = "verl-env/manifest/v1"
# Build dependencies of the source-build stage, per accelerator family (compilers stay there).
APT_BUILD = ("build-essential", "git")


@dataclass(frozen=True)
class BuildContext:
    path: Path
    dockerfile: str
    labels: dict[str, str]
    manifest: dict[str, Any]
    lock_hash: str
    # BuildKit secrets the Dockerfile mounts: id -> file on this host (``--secret id=..,src=..``)
    secrets: dict[str, Path] = field(default_factory=dict)


def _env(templates: Path | None = None) -> jinja2.Environment:
    """Templates from the package (``builder/templates``, shipped in the wheel); a site's
    ``--templates DIR`` is searched first, falling back to the shipped ones per file."""
    loaders: list[jinja2.BaseLoader] = []
    if templates is not None:
        if not (templates / "Dockerfile.j2").is_file() and not (templates / "_macros.j2").is_file():
            raise RenderError(f"--templates {templates}: holds neither Dockerfile.j2 nor _macros.j2")
        loaders.append(jinja2.FileSystemLoader(str(templates)))
    loaders.append(jinja2.PackageLoader("builder", "templates"))
    return jinja2.Environment(loader=jinja2.ChoiceLoader(loaders),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              autoescape=False)


def sha256_text(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def manifest(target: Target, matrix_hash: str, lock_hash: str,
             base_record: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the image must hold; the self-test asserts it (schema in docs/architecture.md).
    A vendor base adds the ``base`` section (builder.vendor.manifest_section)."""
    pins = {p.name: p.version for p in target.enabled_packages}
    provided = {p.name: p.version for p in target.provided}
    imports = {p.name: p.module for p in (*target.enabled_packages, *target.provided)
               if p.name in {"verl", "vllm", "sglang", "torch", "ray", "transformers",
                             "tensordict", "flash-attn", "hydra-core"}}
    return {
        "schema": MANIFEST_SCHEMA, "target": target.name, "accelerator": target.accelerator,
        "arch": target.arch, "python": target.python, "cuda": target.cuda, "rocm": target.rocm,
        "pins": dict(sorted(pins.items())), "provided": dict(sorted(provided.items())),
        "imports": dict(sorted(imports.items())),
        "source_builds": sorted(p.name for p in target.enabled_packages if p.build == "source"),
        "matrix_hash": matrix_hash, "lock_hash": lock_hash, "override": target.override,
        **({"base": vendor_base.manifest_section(target, base_record)} if base_record else {}),
    }


def labels(target: Target, matrix_hash: str, lock_hash: str, ca_hash: str | None
           ) -> dict[str, str]:
    """OCI labels: every pin, provided package, the matrix and lock hashes."""
    out = {
        "org.opencontainers.image.title": f"verl-env {target.name}",
        "org.opencontainers.image.description": target.description or target.name,
        f"{LABEL_NS}.target": target.name, f"{LABEL_NS}.accelerator": target.accelerator,
        f"{LABEL_NS}.arch": target.arch, f"{LABEL_NS}.python": target.python,
        f"{LABEL_NS}.base": target.base.ref, f"{LABEL_NS}.matrix-hash": matrix_hash,
        f"{LABEL_NS}.lock-hash": lock_hash, f"{LABEL_NS}.override": str(target.override).lower(),
        f"{LABEL_NS}.builder": __version__,
    }
    if target.cuda:
        out[f"{LABEL_NS}.cuda"] = target.cuda
    if target.rocm:
        out[f"{LABEL_NS}.rocm"] = target.rocm
    for p in target.enabled_packages:
        out[f"{LABEL_NS}.pin.{p.name}"] = p.version + (" (source)" if p.build == "source" else "")
    for p in target.provided:
        out[f"{LABEL_NS}.provided.{p.name}"] = p.version
    if ca_hash:
        out[f"{LABEL_NS}.site-ca"] = ca_hash
    return dict(sorted(out.items()))


def _source_requirements(target: Target, snapshot: Snapshot, locked: dict[str, LockedPackage]
                         ) -> tuple[str, bool]:
    """requirements.txt for ``pip wheel`` in the source stage; hashed unless a git or local
    source (a local source is copied into the context, and so hashed by the content tag)."""
    lines, hashed = [], True
    for p in target.enabled_packages:
        if p.build != "source":
            continue
        if p.source and p.source.kind == "git":
            lines.append(f"{p.name} @ {p.source.location}\n")
            hashed = False
            continue
        if p.source:
            lines.append(f"{p.name} @ file://{SOURCE_DIR}/{_source_name(p)}\n")
            hashed = False
            continue
        rel = snapshot.release(p.name, p.version)
        if rel is None or not rel.sdist_sha256:
            raise RenderError(f"{p.name} {p.version}: build: source needs an sdist on the index "
                              "(none in the metadata snapshot) or a `source: git+https://...@TAG`",
                              target=target.name)
        lines.append(f"{p.name}=={p.version} --hash=sha256:{rel.sdist_sha256}\n")
    return "".join(lines), hashed


SOURCE_DIR = "/tmp/verl-env/source"
# GPU architectures compiled into source-built CUDA extensions, per target arch: A100/H100/B200/
# RTX-Blackwell on x86_64, GH200/GB200 on aarch64. flash-attn reads its own FLASH_ATTN_CUDA_ARCHS;
# torch's cpp_extension (any other extension) reads TORCH_CUDA_ARCH_LIST ("9.0;10.0"): both are set.
CUDA_ARCHS = {"x86_64": "80;90;100;120", "aarch64": "90;100"}


def _source_name(p: Package) -> str:
    """The name of a package's local source in the context: a directory, or the archive's name."""
    assert p.source is not None
    if p.source.kind == "path" and Path(p.source.location).is_dir():
        return p.name
    location = p.source.location.rstrip("/")
    suffix = next((s for s in (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip", ".tar")
                   if location.endswith(s)), "")
    if not suffix:
        raise RenderError(f"{p.name}: source {location} is neither a directory nor an archive "
                          "(.tar.gz, .tgz, .tar.bz2, .tar.xz, .zip, .tar)")
    return p.name + suffix


def copy_sources(target: Target, dest: Path) -> None:
    """Local directories, archives (sha256-checked when given) and URL archives (always
    sha256-checked) of the target's source builds, into ``dest`` (the context's ``source/``)."""
    import urllib.request

    for p in target.enabled_packages:
        if p.build != "source" or p.source is None or p.source.kind == "git":
            continue
        out = dest / _source_name(p)
        src = Path(p.source.location)
        if p.source.kind == "path" and src.is_dir():
            shutil.copytree(src, out, symlinks=True, ignore=shutil.ignore_patterns(
                ".git", "__pycache__", "*.pyc", "build", "dist", "*.egg-info", "*.so"))
            continue
        if p.source.kind == "path":
            shutil.copyfile(src, out)
        else:
            try:
                with urllib.request.urlopen(p.source.location, timeout=120) as r, \
                        open(out, "wb") as f:
                    shutil.copyfileobj(r, f)
            except OSError as exc:
                raise RenderError(f"{p.name}: cannot fetch {p.source.location}: {exc}",
                                  target=target.name) from None
        if p.source.sha256 and _file_sha256(out) != p.source.sha256:
            raise RenderError(f"{p.name}: {p.source.location} has sha256 {_file_sha256(out)}, "
                              f"the matrix says {p.source.sha256}", target=target.name)


def _local_wheels(target: Target, locked: dict[str, LockedPackage]) -> list[Path]:
    """Wheels in the target's find-links directories that the lock pins (site builds)."""
    found = []
    for d in target.find_links:
        for wheel in sorted(Path(d).glob("*.whl")) if Path(d).is_dir() else ():
            digest = "sha256:" + _file_sha256(wheel)
            if any(digest in p.hashes for p in locked.values()):
                found.append(wheel)
    return found


def _file_sha256(path: Path) -> str:
    return sha256_file(path).split(":", 1)[1]


def render_dockerfile(target: Target, layers: list[Layer], *, matrix_hash: str, lock_hash: str,
                      ca_bundle: bool, ca_hash: str | None, wheels: bool,
                      source_hashed: bool, templates: Path | None = None,
                      venv_replaced: tuple[str, ...] = (),
                      base_record: dict[str, Any] | None = None) -> str:
    source_builds = [p for p in target.enabled_packages if p.build == "source"]
    vendor = None
    if base_record is not None:
        if source_builds:
            raise RenderError("source builds on a vendor base are not supported (the source "
                              "stage builds against a venv of its own)", target=target.name)
        vendor = {"python": vendor_base.interpreter(base_record), "tools": vendor_base.TOOLS_DIR,
                  "kind": base_record.get("kind"), "inspected": bool(base_record.get("inspected")),
                  "externally_managed": bool(base_record.get("externally_managed")),
                  "provided": sorted(f"{p.name} {p.version}" for p in target.provided)}
    fam = family(target.accelerator)
    try:
        return _env(templates).get_template("Dockerfile.j2").render(
            target=target, layers=layers, matrix_hash=matrix_hash, lock_hash=lock_hash,
            base_ref=target.base.ref, source_base=target.base.source_image or target.base.ref,
            python_bin=f"python{target.python}", apt=sorted(target.apt),
            apt_build=sorted({*target.apt, *APT_BUILD, f"python{target.python}-dev"}),
            ca_bundle=ca_bundle, wheels=wheels,
            find_links=["/tmp/verl-env/wheels"] if wheels else [],
            source_builds=source_builds, source_hashed=source_hashed,
            cuda_archs=CUDA_ARCHS.get(target.arch, CUDA_ARCHS["x86_64"]),
            torch_cuda_archs=";".join(f"{a[:-1]}.{a[-1]}" for a in CUDA_ARCHS.get(
                target.arch, CUDA_ARCHS["x86_64"]).split(";")) if target.cuda else None,
            venv_replaced=venv_replaced, vendor=vendor,
            image_env=dict(fam.image_env) if fam else {},
            labels=labels(target, matrix_hash, lock_hash, ca_hash))
    except jinja2.TemplateError as exc:
        raise RenderError(f"template error: {exc}", target=target.name) from None


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


def render_context(target: Target, lock_text: str, snapshot: Snapshot, out: Path, *,
                   lock_file: Path | None = None, ca_bundle: Path | None = None,
                   templates: Path | None = None,
                   base_record: dict[str, Any] | None = None) -> BuildContext:
    """Write the whole build context into ``out`` (replaced atomically; no partial directory is
    left behind on error). ``base_record``: the vendor base's record (builder.vendor); what the
    base already holds is left out of the layers, and the record travels in the context."""
    _check_output(out, target)
    if base_record is None and target.base.vendor:
        if lock_file is None:
            raise RenderError("a vendor base needs its base record (builder.vendor)",
                              target=target.name)
        base_record = vendor_base.load_record(target, lock_file)
    locked = parse_lock(lock_text)
    lock_hash = sha256_text(lock_text)
    matrix_hash = target.entry_hash
    engine = target.engine.name if target.engine and target.engine in target.packages else None
    source_names = {p.name for p in target.enabled_packages if p.build == "source"}
    tools = [locked.pop("uv")] if "uv" in locked else []
    if not tools:
        raise RenderError("the lock has no uv pin: regenerate it with `build-env lock`",
                          target=target.name)
    layers = split_layers(locked, engine=engine,
                          exclude=source_names | vendor_base.already_there(locked, base_record))
    source_txt, source_hashed = _source_requirements(target, snapshot, locked)
    build_lock = build_lock_path(lock_file) if lock_file else None
    if source_names and (build_lock is None or not build_lock.exists()):
        raise RenderError(f"no build-tools lock beside {lock_file}: run `build-env lock`",
                          target=target.name)
    wheels = _local_wheels(target, locked)
    if ca_bundle and not ca_bundle.is_file():
        raise RenderError(f"--ca-bundle {ca_bundle}: no such file", target=target.name)
    ca_hash = "sha256:" + _file_sha256(ca_bundle) if ca_bundle else None
    dockerfile = render_dockerfile(target, layers, matrix_hash=matrix_hash, lock_hash=lock_hash,
                                   ca_bundle=ca_bundle is not None, ca_hash=ca_hash,
                                   wheels=bool(wheels), source_hashed=source_hashed,
                                   templates=templates,
                                   venv_replaced=tuple(sorted(
                                       {"pip", "setuptools", "wheel"} & set(locked))),
                                   base_record=base_record)
    man = manifest(target, matrix_hash, lock_hash, base_record)

    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (tmp / "Dockerfile").write_text(dockerfile)
        (tmp / "lock.txt").write_text(lock_text)
        (tmp / "manifest.json").write_text(json.dumps(man, indent=2, sort_keys=True) + "\n")
        if base_record is not None:  # part of the content tag
            (tmp / "base.json").write_text(json.dumps(base_record, indent=2, sort_keys=True)
                                           + "\n")
        (tmp / "layers").mkdir()
        (tmp / "layers" / "00-tools.txt").write_text(
            "# verl-env tools: the installer\n" + "".join(p.render() for p in tools))
        for layer in layers:
            (tmp / "layers" / layer.filename).write_text(layer.render())
        if source_names:
            (tmp / "source").mkdir()
            (tmp / "source" / "requirements.txt").write_text(source_txt)
            copy_sources(target, tmp / "source")
            assert build_lock is not None
            (tmp / "layers" / "build-tools.txt").write_text(build_lock.read_text())
        if wheels:
            (tmp / "wheels").mkdir()
            for w in wheels:
                shutil.copyfile(w, tmp / "wheels" / w.name)
        selftest = Path(str(resources.files("builder") / "selftest"))
        shutil.copytree(selftest, tmp / "selftest",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for path in sorted(tmp.rglob("*")):  # fixed mtimes/modes: stable context hashes
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        (tmp / CONTEXT_MARKER).write_text(CONTEXT_MARKER_TEXT)
        os.chmod(tmp / CONTEXT_MARKER, 0o644)
        replace_generated_dir(tmp, out, CONTEXT_MARKER, LEGACY_CONTEXT_NAMES)
    except NotOurDirectory as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RenderError(str(exc), target=target.name) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return BuildContext(out, dockerfile, labels(target, matrix_hash, lock_hash, ca_hash), man,
                        lock_hash, {"site-ca": ca_bundle.resolve()} if ca_bundle else {})

