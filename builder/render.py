"""Render a target into a complete, deterministic Docker build context (pure apart from file I/O).

Same inputs give byte-identical output: templates render with ``StrictUndefined``, every mapping
is sorted, nothing records the time or the host. The context holds the Dockerfile, the lock split
into install layers, the baked manifest, the self-test package and local wheels the lock
references. The site CA bundle is never copied into the context: it goes to the build as a BuildKit
secret (``BuildContext.secrets``), mounted only into the steps that fetch packages.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from builder import __version__
from builder import prebuilt as prebuilt_wheels
from builder import shipped
from builder import vendor as vendor_base
from builder.errors import RenderError
from builder.families import family
from builder.files import (NotOurDirectory, check_replaceable, replace_generated_dir,
                           sha256_file)
from builder.layers import Layer, split_layers
from builder.lock import LockedPackage, build_lock_path, parse_lock
from builder.metadata import Snapshot
from builder.sources import (ARCHIVE_SUFFIXES, IGNORED, Pin, archive_suffix, describe,
                             fetch_git, refuse_problems, split_git, tree_sha256)
from builder.sources import load_record as load_source_record
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


def _env(templates: Path | None = None) -> jinja2.Environment:
    """Templates from ``dockerfiles/`` (shipped in the wheel: :mod:`builder.shipped`); a site's
    ``--templates DIR`` is searched first, falling back to the shipped ones per file."""
    loaders: list[jinja2.BaseLoader] = []
    if templates is not None:
        if not (templates / "Dockerfile.j2").is_file() and not (templates / "_macros.j2").is_file():
            raise RenderError(f"--templates {templates}: holds neither Dockerfile.j2 nor _macros.j2")
        loaders.append(jinja2.FileSystemLoader(str(templates)))
    loaders.append(jinja2.FileSystemLoader(str(shipped.dockerfiles_dir())))
    return jinja2.Environment(loader=jinja2.ChoiceLoader(loaders),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              autoescape=False)


def sha256_text(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def manifest(target: Target, matrix_hash: str, lock_hash: str,
             base_record: dict[str, Any] | None = None,
             sources: dict[str, Pin] | None = None,
             decided: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """What the image must hold; the self-test asserts it (schema in docs/architecture.md).
    ``gpus``: the GPU architectures the image must run on (the coverage phase holds every ELF
    shared object to them). A vendor base adds the ``base`` section
    (builder.vendor.manifest_section); ``source_pins`` says what each source build was built
    from (git commit, tree or archive sha256, sdist hash)."""
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
        "gpus": list(target.gpus),
        **({"coverage_allow": dict(target.coverage_allow)} if target.coverage_allow else {}),
        **({"source_pins": describe(sources)} if sources else {}),
        # prebuilt first: per package with prebuilt wheels, what `lock` chose and why
        **({"prebuilt": {n: {k: v for k, v in e.items() if k != "entries"}
                         for n, e in sorted(decided.items())}} if decided else {}),
        "matrix_hash": matrix_hash, "lock_hash": lock_hash, "override": target.override,
        **({"base": vendor_base.manifest_section(target, base_record)} if base_record else {}),
    }


def labels(target: Target, matrix_hash: str, lock_hash: str, ca_hash: str | None,
           sources: dict[str, Pin] | None = None,
           decided: dict[str, dict[str, Any]] | None = None) -> dict[str, str]:
    """OCI labels: every pin, provided package, the GPUs, what each source build was built
    from, the matrix and lock hashes."""
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
    if target.gpus:
        out[f"{LABEL_NS}.gpus"] = ",".join(target.gpus)
    for name, pin in (sources or {}).items():
        out[f"{LABEL_NS}.source.{name}"] = pin.label()
    for name, entry in (decided or {}).items():
        out[f"{LABEL_NS}.prebuilt.{name}"] = (
            f"{entry['filename']} sha256:{entry['sha256']}" if entry["choice"] == "wheel"
            else "none fits: built from source")
    if ca_hash:
        out[f"{LABEL_NS}.site-ca"] = ca_hash
    return dict(sorted(out.items()))


SOURCE_DIR = "/tmp/verl-env/source"
PREBUILT_DIR = "/tmp/verl-env/prebuilt"


def torch_cuda_arch_list(gpus: tuple[str, ...]) -> str:
    """``sm_80, sm_103, sm_90a`` -> ``8.0;10.3;9.0a`` (torch's cpp_extension reads it)."""
    out = []
    for g in gpus:
        digits = g[3:].rstrip("af")
        out.append(f"{digits[:-1]}.{digits[-1]}{g[3 + len(digits):]}")
    return ";".join(out)


def flash_attn_cuda_archs(gpus: tuple[str, ...]) -> str:
    """``sm_80, sm_100, sm_103`` -> ``80;100`` (FLASH_ATTN_CUDA_ARCHS). flash-attn 2.8's setup.py
    knows 80, 90, 100, 110 and 120 and builds Blackwell per family (``compute_100f``: sm_100
    and sm_103 alike), so a Blackwell GPU names its family; other values it would ignore."""
    out = []
    for g in gpus:
        digits = g[3:].rstrip("af")
        out.append(digits[:-1] + "0" if int(digits) >= 100 else digits)
    return ";".join(dict.fromkeys(out))


def gpu_env(target: Target) -> list[tuple[str, str]]:
    """What a source build compiles GPU code for, all from the one ``gpus:`` list."""
    if target.accelerator == "cuda":
        return [("TORCH_CUDA_ARCH_LIST", f'"{torch_cuda_arch_list(target.gpus)}"')]
    if target.accelerator == "rocm":
        return [("PYTORCH_ROCM_ARCH", f'"{";".join(target.gpus)}"')]
    return []


def _source_name(p: Package) -> str:
    """The name of a package's local source in the context: a directory, or the archive's name."""
    assert p.source is not None
    if p.source.kind == "git" or (p.source.kind == "path" and Path(p.source.location).is_dir()):
        return p.name
    suffix = archive_suffix(p.source.location)
    if not suffix:
        raise RenderError(f"{p.name}: source {p.source.location} is neither a directory nor an "
                          f"archive ({', '.join(ARCHIVE_SUFFIXES)})")
    return p.name + suffix


def source_pins(target: Target, snapshot: Snapshot, lock_file: Path | None) -> dict[str, Pin]:
    """What each source build is pinned to, known before anything is fetched: an sdist's hash
    (metadata snapshot), a git source's recorded commit (beside the lock), a directory's tree
    hash, an archive's sha256 (the file's, or the matrix's for a URL)."""
    record = load_source_record(lock_file) if lock_file is not None else {}
    pins: dict[str, Pin] = {}
    for p in target.enabled_packages:
        if p.build != "source":
            continue
        if p.source is None:
            rel = snapshot.release(p.name, p.version)
            assert rel is not None and rel.sdist_sha256  # sources.problems refused it otherwise
            pins[p.name] = Pin("sdist", f"sha256:{rel.sdist_sha256}")
        elif p.source.kind == "git":
            pins[p.name] = Pin("git", record[p.name]["commit"], record[p.name]["ref"])
        elif p.source.kind == "path" and Path(p.source.location).is_dir():
            pins[p.name] = Pin("tree", tree_sha256(Path(p.source.location)))
        elif p.source.kind == "path":
            pins[p.name] = Pin("archive", "sha256:" + _file_sha256(Path(p.source.location)))
        else:
            pins[p.name] = Pin("archive", f"sha256:{p.source.sha256}")
    return pins


def copy_sources(target: Target, dest: Path, pins: dict[str, Pin], *, fetch: bool = True
                 ) -> None:
    """Every source build's code (for an sdist: its hashed requirement) into ``dest`` (the
    context's ``source/``), each checked against its pin: a git ref fetched on this host must
    still be the recorded commit (a moved ref is refused), a directory must hash as it did, an
    archive (local, or fetched from its URL) must have its sha256. ``fetch=False``: git and URL
    sources are left out (a context to read, not to build)."""
    import urllib.request

    for p in target.enabled_packages:
        if p.build != "source":
            continue
        pin = pins[p.name]
        if p.source is None:
            (dest / f"{p.name}.txt").write_text(
                f"{p.name}=={p.version} --hash={pin.value}\n")
            continue
        out = dest / _source_name(p)
        if p.source.kind == "git":
            if fetch:
                fetch_git(target, p, pin.value, out)
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
            continue
        else:
            try:
                with urllib.request.urlopen(p.source.location, timeout=120) as r, \
                        open(out, "wb") as f:
                    shutil.copyfileobj(r, f)
            except OSError as exc:
                raise RenderError(f"{p.name}: cannot fetch {p.source.location}: {exc}",
                                  target=target.name) from None
        if "sha256:" + _file_sha256(out) != pin.value:
            raise RenderError(f"{p.name}: {p.source.location} has sha256 {_file_sha256(out)}, "
                              f"expected {pin.value.split(':', 1)[1]}", target=target.name)


FLASH_ATTN_NOTES = (
    "flash-attn: FLASH_ATTENTION_FORCE_BUILD (its setup.py would otherwise download an unhashed",
    "prebuilt wheel), for the target's gpus, with as many jobs as the build host's memory allows",
    "(about 9 GB each).")
MAX_JOBS = ('"${MAX_JOBS:-$(awk \'/MemAvailable/ {n = int($2 / 9437184); '
            'print (n > 0 ? n : 1)}\' /proc/meminfo)}"')


def source_stages(target: Target, pins: dict[str, Pin], cache_inputs: str
                  ) -> list[dict[str, Any]]:
    """One build stage per source package: what it copies, builds, and with which variables.
    ``cache_inputs``: what every wheel is compiled against (base, torch layer, build tools,
    GPUs); its hash keys the packages' pip caches, so no wheel built against another torch is
    ever reused."""
    stages = []
    common = [("pybind11_DIR", '"$(/opt/venv/bin/python -m pybind11 --cmakedir)"'),
              *gpu_env(target)]
    for p in target.enabled_packages:
        if p.build != "source":
            continue
        pin = pins[p.name]
        env = [*common, (f"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_{p.name.upper().replace('-', '_')}",
                         p.version)]
        notes: tuple[str, ...] = ()
        if p.name == "flash-attn":
            notes = FLASH_ATTN_NOTES
            env += [("FLASH_ATTENTION_FORCE_BUILD", "TRUE"),
                    ("FLASH_ATTN_CUDA_ARCHS", f'"{flash_attn_cuda_archs(target.gpus)}"'),
                    ("MAX_JOBS", MAX_JOBS)]
        if pin.kind == "sdist":
            origin = f"its sdist on the index ({pin.value}), hash-checked"
            copy, dest, what = f"source/{p.name}.txt", "", f"-r {SOURCE_DIR}/{p.name}.txt"
        else:
            assert p.source is not None
            name = _source_name(p)
            directory = pin.kind in ("git", "tree")
            origin = (f"{split_git(p.source.location)[0]} {pin.ref}, commit {pin.value}"
                      if pin.kind == "git" else f"a directory (tree {pin.value})"
                      if directory else f"an archive ({pin.value})")
            copy = f"source/{name}/" if directory else f"source/{name}"
            dest = f"{name}/" if directory else ""
            what = f"{SOURCE_DIR}/{name}"
        key = hashlib.sha256(f"{cache_inputs}\n{p.name}".encode()).hexdigest()[:12]
        stages.append({"name": p.name, "version": p.version, "origin": origin, "notes": notes,
                       "src": copy, "copy_dest": dest, "what": what, "env": env,
                       "hashed": pin.kind == "sdist", "cache_key": key,
                       "bind": f"type=bind,from=source-{p.name},source=/wheels,"
                               f"target=/tmp/verl-env/built/{p.name}"})
    return stages


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
                      source_builds: list[dict[str, Any]] | None = None,
                      sources: dict[str, Pin] | None = None, templates: Path | None = None,
                      prebuilt: list[str] | None = None,
                      decided: dict[str, dict[str, Any]] | None = None,
                      venv_replaced: tuple[str, ...] = (),
                      base_record: dict[str, Any] | None = None,
                      site_index: bool = False) -> str:
    """The Dockerfile. ``source_builds``: one stage per source package (:func:`source_stages`).
    ``site_index``: every fetching step mounts the site's index config (secrets, not content)."""
    source_builds = source_builds or []
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
    env = _env(templates)
    env.globals["site_index"] = site_index  # read by _macros.j2's ca_mount
    try:
        return env.get_template("Dockerfile.j2").render(
            target=target, layers=layers, matrix_hash=matrix_hash, lock_hash=lock_hash,
            base_ref=target.base.ref, source_base=target.base.source_image or target.base.ref,
            python_bin=f"python{target.python}", apt=sorted(target.apt),
            apt_build=sorted({*target.apt, *APT_BUILD, f"python{target.python}-dev"}),
            ca_bundle=ca_bundle, wheels=wheels,
            find_links=["/tmp/verl-env/wheels"] if wheels else [],
            source_builds=source_builds, gpus=list(target.gpus), prebuilt=prebuilt or [],
            venv_replaced=venv_replaced, vendor=vendor,
            image_env=dict(fam.image_env) if fam else {},
            labels=labels(target, matrix_hash, lock_hash, ca_hash, sources, decided))
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
                   base_record: dict[str, Any] | None = None,
                   fetch_sources: bool = True,
                   index_url: str | None = None) -> BuildContext:
    """Write the whole build context into ``out`` (replaced atomically; no partial directory is
    left behind on error). ``base_record``: the vendor base's record (builder.vendor); what the
    base already holds is left out of the layers, and the record travels in the context.
    ``fetch_sources=False``: git and URL sources are not fetched (the Dockerfile, which names
    their pins, is the same; the context is for reading, not building). ``index_url``: the
    site's own package index (default: ``VERL_ENV_INDEX_URL``, which ``--index-url`` and the
    site config set), handed to the build as secrets."""
    _check_output(out, target)
    index_url = index_url or os.environ.get("VERL_ENV_INDEX_URL") or None
    if base_record is None and target.base.vendor:
        if lock_file is None:
            raise RenderError("a vendor base needs its base record (builder.vendor)",
                              target=target.name)
        base_record = vendor_base.load_record(target, lock_file)
    locked = parse_lock(lock_text)
    lock_hash = sha256_text(lock_text)
    matrix_hash = target.entry_hash
    # prebuilt first: a package `lock` found a fitting hashed wheel for is installed from it
    decided = prebuilt_wheels.load_record(lock_file)
    chosen = prebuilt_wheels.wheels(target, lock_file)
    if chosen:
        target = replace(target, packages=tuple(
            replace(p, build="wheel", source=None, prebuilt=()) if p.name in chosen else p
            for p in target.packages))
    engine = target.engine.name if target.engine and target.engine in target.packages else None
    source_names = {p.name for p in target.enabled_packages if p.build == "source"}
    tools = [locked.pop("uv")] if "uv" in locked else []
    if not tools:
        raise RenderError("the lock has no uv pin: regenerate it with `build-env lock`",
                          target=target.name)
    layers = split_layers(locked, engine=engine,
                          exclude=source_names | set(chosen)
                          | vendor_base.already_there(locked, base_record))
    build_lock = build_lock_path(lock_file) if lock_file else None
    if source_names and (build_lock is None or not build_lock.exists()):
        raise RenderError(f"no build-tools lock beside {lock_file}: run `build-env lock`",
                          target=target.name)
    if source_names:
        refuse_problems(target, snapshot, lock_file)
    wheels = _local_wheels(target, locked)
    if ca_bundle and not ca_bundle.is_file():
        raise RenderError(f"--ca-bundle {ca_bundle}: no such file", target=target.name)
    ca_hash = "sha256:" + _file_sha256(ca_bundle) if ca_bundle else None

    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        pins: dict[str, Pin] = {}
        stages: list[dict[str, Any]] = []
        if source_names:
            assert build_lock is not None
            (tmp / "source").mkdir()
            pins = source_pins(target, snapshot, lock_file)
            copy_sources(target, tmp / "source", pins, fetch=fetch_sources)
            torch_layer = "".join(layer.render() for layer in layers if layer.name == "torch")
            stages = source_stages(target, pins, "\n".join(
                [target.base.source_image or target.base.ref, torch_layer,
                 build_lock.read_text(), ",".join(target.gpus)]))
        dockerfile = render_dockerfile(
            target, layers, matrix_hash=matrix_hash, lock_hash=lock_hash,
            ca_bundle=ca_bundle is not None, ca_hash=ca_hash, wheels=bool(wheels),
            source_builds=stages, sources=pins, templates=templates,
            prebuilt=sorted(chosen), decided=decided,
            venv_replaced=tuple(sorted({"pip", "setuptools", "wheel"} & set(locked))),
            base_record=base_record, site_index=bool(index_url))
        man = manifest(target, matrix_hash, lock_hash, base_record, pins, decided)
        (tmp / "Dockerfile").write_text(dockerfile)
        (tmp / "lock.txt").write_text(lock_text)
        (tmp / "manifest.json").write_text(json.dumps(man, indent=2, sort_keys=True) + "\n")
        if base_record is not None:  # part of the content tag
            (tmp / "base.json").write_text(json.dumps(base_record, indent=2, sort_keys=True)
                                           + "\n")
        (tmp / "layers").mkdir()
        if chosen:
            (tmp / "prebuilt").mkdir()
            lines = []
            for name, entry in sorted(chosen.items()):
                wheel = prebuilt_wheels.fetch(target, entry, tmp / "prebuilt")
                lines.append(f"{name} @ file://{PREBUILT_DIR}/{wheel.name} "
                             f"--hash=sha256:{entry['sha256']}\n")
            (tmp / "layers" / "prebuilt.txt").write_text(
                "# verl-env prebuilt wheels chosen by `build-env lock` (locks/T.prebuilt.json)\n"
                + "".join(lines))
        (tmp / "layers" / "00-tools.txt").write_text(
            "# verl-env tools: the installer\n" + "".join(p.render() for p in tools))
        for layer in layers:
            (tmp / "layers" / layer.filename).write_text(layer.render())
        if source_names:
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
    secrets = {"site-ca": ca_bundle.resolve()} if ca_bundle else {}
    if index_url:
        secrets.update(site_index_secrets(index_url))
    return BuildContext(out, dockerfile,
                        labels(target, matrix_hash, lock_hash, ca_hash, pins, decided), man,
                        lock_hash, secrets)

