"""Vendor bases: images that already provide torch/vLLM in their own python environment.

A target whose ``base.vendor`` is set installs into the base's interpreter instead of a venv of
its own. What the base holds is recorded in ``locks/<target>.base.json`` beside the lock (the
*base record*): the interpreter, whether it is a venv (``/opt/venv``) or the system site (and
whether that is PEP 668 externally managed), the base's environment (PATH, LD_LIBRARY_PATH ...),
and its full freeze, each distribution with its dist-info location and the sha256 of its
``RECORD``. The record is written by :func:`probe` (``build-env lock --probe``), which runs the
base through the engine interface (no Docker here), and is part of the lock's input hash and of
the build context (so of the content tag).

How the record shapes the rest (pure functions, unit-tested):

- :func:`resolution`: the lock is resolved with every base distribution as a constraint
  (``name==version``), the provided packages and what the index cannot have (local versions such
  as ``+rocm7.0.2``) excluded; a matrix pin of a package the base holds at another version is an
  explicit replacement (never a provided one: those are excluded from resolution).
- :func:`already_there`: locked packages the base holds at the same version are left out of the
  install layers, so nothing the base provides is reinstalled or upgraded.
- :func:`manifest_section`: what the gate asserts (``versions.provided.*`` and
  ``versions.base_files.*``: the provided distribution's files are the base's).

A *declared* base (``vendor: declared``) could not be inspected where the matrix was written (no
registry reachable): its interpreter and provided versions come from the vendor's published
Dockerfiles and notes (``base.sources``). Until a host that can pull it runs
``build-env lock --probe``, the target is "declared, not yet verified".
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.errors import LockError
from builder.files import atomic_write_text
from builder.matrix.spec import Target

if TYPE_CHECKING:  # the engine is handed in; nothing here speaks to it but through that object
    from builder.engine import ContainerEngine

BASE_SCHEMA = "verl-env/base/v1"
# The installer lives in its own directory, never in the base's environment.
TOOLS_DIR = "/opt/verl-env/tools"
# Names never constrained by the base: the tool the image installs with (own directory).
TOOLS = ("uv",)
# The base environment variables recorded and kept (the image never overwrites them).
ENV_KEYS = ("PATH", "LD_LIBRARY_PATH", "LIBRARY_PATH", "VIRTUAL_ENV", "PYTHONPATH", "CONDA_PREFIX")
ENV_PREFIXES = ("ROCM_", "HIP_", "HSA_", "CUDA_", "NCCL_", "RCCL_")

# Runs inside the base with its own python (stdlib only; python >= 3.8).
PROBE_PY = r'''
import hashlib, importlib.metadata as md, json, os, sys, sysconfig
def rec(d):
    p = getattr(d, "_path", None)
    path = str(p) if p is not None else None
    h = None
    if path and os.path.isfile(os.path.join(path, "RECORD")):
        with open(os.path.join(path, "RECORD"), "rb") as f:
            h = "sha256:" + hashlib.sha256(f.read()).hexdigest()
    return path, h
dists = {}
for d in md.distributions():
    name = d.metadata["Name"]
    if not name or name in dists:
        continue  # the first on sys.path wins, as for an import
    path, h = rec(d)
    dists[name] = {"version": d.version, "path": path, "record": h}
stdlib = sysconfig.get_path("stdlib")
print(json.dumps({
    "interpreter": sys.executable, "python": "{}.{}.{}".format(*sys.version_info[:3]),
    "prefix": sys.prefix, "venv": sys.prefix != sys.base_prefix,
    "purelib": sysconfig.get_path("purelib"),
    # PEP 668: the marker of the base interpreter's stdlib binds only outside a venv
    "externally_managed": sys.prefix == sys.base_prefix and os.path.isfile(
        os.path.join(stdlib, "EXTERNALLY-MANAGED")),
    "env": {k: v for k, v in os.environ.items()
            if k in __KEYS__ or k.startswith(__PREFIXES__)},
    "dists": dists}, sort_keys=True))
'''.replace("__KEYS__", repr(ENV_KEYS)).replace("__PREFIXES__", repr(ENV_PREFIXES))
# /bin/sh in the base: the interpreter on the base's own PATH (a venv base puts its bin first).
PROBE_SH = ('PY=$(command -v python3 || command -v python) || { echo "no python in the base" >&2; '
            'exit 3; }; exec "$PY" -c "$1"')


def base_record_path(lock_file: Path) -> Path:
    """``locks/T.base.json`` beside ``locks/T.txt``."""
    return lock_file.with_name(lock_file.stem + ".base.json")


def parse_probe(raw: str, *, target: Target, image: str, image_id: str) -> dict[str, Any]:
    """The base record from the probe's JSON output (the last JSON line of the logs)."""
    line = next((s for s in reversed(raw.strip().splitlines()) if s.startswith("{")), None)
    if line is None:
        raise LockError(f"probe of {image} printed no record: {raw.strip()[-300:]}",
                        target=target.name)
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise LockError(f"probe of {image}: unreadable record ({exc})", target=target.name) \
            from None
    dists = {canonicalize_name(n): dict(d) for n, d in data.get("dists", {}).items()}
    record = {
        "schema": BASE_SCHEMA, "target": target.name, "image": image, "image_id": image_id,
        "inspected": True, "interpreter": data["interpreter"], "python": data["python"],
        "kind": "venv" if data.get("venv") else "system", "prefix": data["prefix"],
        "purelib": data["purelib"], "externally_managed": bool(data.get("externally_managed")),
        "env": dict(sorted(data.get("env", {}).items())),
        "dists": dict(sorted(dists.items())),
    }
    py = ".".join(record["python"].split(".")[:2])
    if py != target.python:
        raise LockError(f"{image} runs python {record['python']} ({record['interpreter']}), "
                        f"the matrix says {target.python}", target=target.name)
    return record


def declared_record(target: Target) -> dict[str, Any]:
    """What the matrix declares of a base that could not be inspected (``vendor: declared``)."""
    return {
        "schema": BASE_SCHEMA, "target": target.name, "image": target.base.ref,
        "inspected": False, "interpreter": target.base.interpreter or "python3",
        "kind": "declared", "externally_managed": False, "env": {},
        "sources": list(target.base.sources),
        "dists": {p.name: {"version": p.version, "path": None, "record": None}
                  for p in target.provided},
    }


def record_hash(record: dict[str, Any] | None) -> str | None:
    if record is None:
        return None
    blob = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def write_record(path: Path, record: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(record, indent=2, sort_keys=True) + "\n")


def load_record(target: Target, lock_file: Path) -> dict[str, Any] | None:
    """The base record of a vendor target: the probed one beside the lock, else the declared one
    (``vendor: declared``); None for a target without a vendor base. A ``vendor: probe`` target
    without a record is an error naming the command that makes it."""
    if not target.base.vendor:
        return None
    path = base_record_path(lock_file)
    if path.is_file():
        try:
            record = json.loads(path.read_text())
        except ValueError as exc:
            raise LockError(f"{path}: unreadable base record ({exc})", target=target.name) \
                from None
        if record.get("schema") != BASE_SCHEMA:
            raise LockError(f"{path}: not a verl-env base record", target=target.name)
        return record
    if target.base.vendor == "declared":
        return declared_record(target)
    raise LockError(f"no base record at {path}: run `build-env lock --probe --target "
                    f"{target.name}` (inspects {target.base.ref} through the engine)",
                    target=target.name)


def probe(engine: ContainerEngine, target: Target, *, timeout: float = 600) -> dict[str, Any]:
    """Inspect the target's base through the engine (``Engine.run``: a short container, no
    network, the image's entrypoint replaced) and return its record."""
    ref = target.base.ref
    image_id = engine.identity(ref)
    result = engine.run(ref, ["-c", PROBE_SH, "verl-env-probe", PROBE_PY],
                        entrypoint=["/bin/sh"], timeout=timeout, role="base-probe")
    if result.exit_code != 0:
        raise LockError(f"probe of {ref} failed (exit {result.exit_code}): "
                        f"{result.logs.strip()[-500:]}", target=target.name)
    return parse_probe(result.logs, target=target, image=ref, image_id=image_id)


# --------------------------------------------------------------------------- pure decisions


def _resolvable(version: str) -> bool:
    """Whether the index can hold this version (a local segment such as +rocm7.0.2 cannot)."""
    try:
        return Version(version).local is None
    except InvalidVersion:
        return False


def resolution(target: Target, record: dict[str, Any] | None) -> tuple[list[str], list[str]]:
    """(constraints, excludes) for ``uv pip compile``.

    Without a record: the provided pins as constraints, the provided names excluded (plain
    targets). With one: every base distribution is a constraint at the base's version, except the
    tools (own directory) and what the matrix pins explicitly (a replacement); provided packages
    and base distributions the index cannot hold (local versions) are excluded from resolution.
    """
    provided = {p.name: p.version for p in target.provided}
    if record is None:
        return ([f"{n}=={v}" for n, v in sorted(provided.items())], sorted(provided))
    pinned = {p.name for p in target.enabled_packages}
    excludes, constraints = set(provided), []
    for name, dist in sorted(record.get("dists", {}).items()):
        if name in TOOLS or name in pinned or name in provided:
            continue
        version = str(dist.get("version", ""))
        if _resolvable(version):
            constraints.append(f"{name}=={version}")
        else:
            excludes.add(name)
    return constraints, sorted(excludes)


def replaced(target: Target, record: dict[str, Any] | None) -> dict[str, tuple[str, str]]:
    """Base distributions the matrix pins at another version: name -> (base, pin)."""
    if record is None:
        return {}
    out = {}
    for p in target.enabled_packages:
        dist = record.get("dists", {}).get(p.name)
        if dist and str(dist.get("version")) != p.version:
            out[p.name] = (str(dist.get("version")), p.version)
    return out


def already_there(locked: dict[str, Any], record: dict[str, Any] | None) -> set[str]:
    """Locked packages the base holds at the same version: left out of the install layers."""
    if record is None:
        return set()
    dists = record.get("dists", {})
    return {n for n, p in locked.items()
            if n in dists and _same(str(dists[n].get("version")), p.version)}


def _same(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def mismatches(target: Target, record: dict[str, Any] | None) -> list[str]:
    """Provided pins the (inspected) base does not hold: the gate refuses such an image; the
    lock says so early."""
    if not record or not record.get("inspected"):
        return []
    out = []
    for p in target.provided:
        dist = record["dists"].get(p.name)
        have = dist.get("version") if dist else None
        if have is None or not _same(str(have), p.version):
            out.append(f"{p.name}: the matrix claims {p.version}, {record['image']} holds "
                       f"{have or 'nothing'}")
    return out


def manifest_section(target: Target, record: dict[str, Any] | None) -> dict[str, Any] | None:
    """The manifest's ``base`` section: what the gate asserts of a vendor base."""
    if record is None:
        return None
    dists = record.get("dists", {})
    return {
        "image": record.get("image"), "image_id": record.get("image_id"),
        "inspected": bool(record.get("inspected")), "interpreter": record.get("interpreter"),
        "kind": record.get("kind"), "record_hash": record_hash(record),
        "provided": {p.name: {"version": p.version,
                              "path": (dists.get(p.name) or {}).get("path"),
                              "record": (dists.get(p.name) or {}).get("record")}
                     for p in sorted(target.provided, key=lambda p: p.name)},
    }


_SAFE = re.compile(r"^[A-Za-z0-9_./+-]+$")


def interpreter(record: dict[str, Any]) -> str:
    """The base interpreter as the Dockerfile names it (refused when not a plain path)."""
    path = str(record.get("interpreter") or "")
    if not _SAFE.match(path):
        raise LockError(f"base interpreter {path!r} is not a plain path")
    return path


def first_inspection(engine: ContainerEngine, target: Target, lock_file: Path) -> None:
    """A declared base reached an engine that can pull it: inspect it, record what it really
    holds beside the lock, and stop (the lock was resolved from declared facts, and its input
    hash covers the record): the build host re-locks with the record and commits both."""
    record = probe(engine, target)
    path = base_record_path(lock_file)
    try:
        write_record(path, record)
    except OSError as exc:
        raise LockError(f"{target.base.ref} inspected, but its record cannot be written to "
                        f"{path} ({exc.strerror}): run `build-env init DIR` for a site of your "
                        f"own and `build-env lock --probe --target {target.name}` there",
                        target=target.name) from None
    wrong = mismatches(target, record)
    raise LockError(
        f"{target.base.ref} was declared, not inspected: inspected it now and recorded "
        f"{record['image_id']} ({len(record['dists'])} distributions, {record['interpreter']}) "
        f"at {path}" + (f"; it contradicts the matrix: {'; '.join(wrong)}" if wrong else "")
        + f". Run `build-env lock --target {target.name}`, commit both files, and build again.",
        target=target.name)
