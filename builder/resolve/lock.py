"""Full dependency locks per target platform and python, with hashes, through ``uv pip compile``.

The lock for target T lives at ``locks/T.txt`` beside the matrix. Its header records an input
hash over everything that decides the resolution (pins, python, platform, provided packages,
find-links, uv options, the snapshot's dependencies of wheel-less packages); ``check``
recomputes it to catch a lock that no longer matches its matrix entry. The header also records
what the body is (:mod:`builder.resolve.lockfile`: a digest of the body and one per entry), so ``check``
and ``render`` refuse a lock edited since ``lock`` wrote it, naming the entry, without resolving
again; every matrix pin must be in the lock at its version. Packages the base image provides are excluded from the graph (``--excludes``) and
never resolved from the index. Packages built from source stay in the lock (their sdist is
hash-pinned there) unless they have no wheel at all (flash-attn), in which case only their
declared dependencies are locked and the sdist hash comes from the metadata snapshot.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder import children
from builder.files import atomic_write_text
from builder.resolve.compat import check_target, holds, local_sources
from builder.errors import CompatError, LockError, NetworkError
from builder.resolve.metadata import INDEX_WAY_OUT, Snapshot, network_timeout
from builder.matrix.spec import Package, Target
from builder.resolve import lockfile as lockbody
from builder.matrix import overrides
from builder.resolve import prebuilt
from builder.resolve import sources
from builder.resolve import vendor
from builder.resolve import closure
from builder.resolve import extras

# antlr4-python3-runtime 4.9.3 (hydra-core 1.3's dependency) is sdist-only and pure python:
# without this exception, binary-only resolution silently downgrades hydra-core to 0.11.3.
SDIST_ALLOWED = ("antlr4-python3-runtime",)
DEFAULT_GLIBC = "2.34"
# The installer baked into every image (installs the layers; pinned and hash-checked like the rest).
UV_IN_IMAGE = "uv==0.13.9"
# What source builds need besides torch (tensordict: setuptools/pybind11/setuptools-scm/cmake;
# flash-attn: ninja/packaging/psutil). Locked separately: they never reach the final image.
BUILD_TOOLS = ("setuptools>=68", "wheel", "pybind11", "setuptools-scm", "cmake", "ninja",
               "packaging", "psutil")
LOCK_SCHEMA = "verl-env/lock/v1"
# uv's whole resolution is bounded at this many network timeouts (each request is bounded by
# one, through UV_HTTP_TIMEOUT); a cold resolution of a CUDA target takes a minute or two.
RESOLVE_TIMEOUTS = 30
# What uv prints when it could not reach an index (its "Caused by" chain names the request).
_UV_NETWORK = re.compile(r"Failed to fetch|error sending request|Request failed after|"
                         r"dns error|tcp connect error|operation timed out|Connection refused|"
                         r"HTTP status client error|HTTP status server error|"
                         r"index \(\S+\) returned an? \d{3}")
_UV_URL = re.compile(r"(?:`|\()(https?://[^\s`)]+)")
# uv reads its index from these too: with the site's index set, only it is asked
_OTHER_INDEXES = ("UV_INDEX", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS",
                  "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")


@dataclass(frozen=True)
class Lock:
    path: Path
    input_hash: str
    text: str
    seconds: float = 0.0

    @property
    def content_hash(self) -> str:
        return "sha256:" + hashlib.sha256(self.text.encode()).hexdigest()


def lock_path(matrix_path: Path, target: Target) -> Path:
    return matrix_path.parent / "locks" / f"{target.name}.txt"


def python_platform(target: Target) -> str:
    glibc = Version(target.base.glibc or DEFAULT_GLIBC)
    return f"{target.arch}-manylinux_{glibc.major}_{glibc.minor}"


def local_only(target: Target, snapshot: Snapshot) -> list[Package]:
    """Source-built packages from a local directory, archive or URL that the index does not know
    at all (a site's own extension): never resolved from the index, built with ``--no-deps``;
    what they import must be pinned by the rest of the lock (the self-test imports them)."""
    local = set(local_sources(target))
    return [p for p in target.enabled_packages
            if p.name in local and snapshot.release(p.name, p.version) is None]


def wheelless(target: Target, snapshot: Snapshot) -> list[Package]:
    """Source-built packages the index has no wheel for at all: kept out of the resolution."""
    out = []
    for p in target.enabled_packages:
        rel = snapshot.release(p.name, p.version)
        if p.build == "source" and rel is not None and not rel.has_wheel:
            out.append(p)
    return out


def requirements_in(target: Target, snapshot: Snapshot) -> list[str]:
    """The resolver input: every enabled pin, plus the declared deps of wheel-less packages
    (local-only packages are left out; see :func:`local_only`)."""
    skip = {p.name for p in (*wheelless(target, snapshot), *local_only(target, snapshot))}
    lines = [p.requirement for p in target.enabled_packages if p.name not in skip]
    lines.append(UV_IN_IMAGE)
    for p in wheelless(target, snapshot):
        rel = snapshot.release(p.name, p.version)
        assert rel is not None  # wheelless() keeps only packages with a release
        for req in rel.requirements():
            if holds(req, target):
                lines.append(str(Requirement(f"{req.name}{req.specifier}")))
    return sorted(set(lines))


def uv_args(target: Target) -> list[str]:
    args = ["--python-version", target.python, "--python-platform", python_platform(target),
            "--generate-hashes", "--only-binary", ":all:", "--no-strip-extras"]
    for name in SDIST_ALLOWED:
        args += ["--no-binary", name]
    for link in target.find_links:
        args += ["--find-links", link]
    return args


def input_hash(target: Target, snapshot: Snapshot, record: dict | None = None) -> str:
    """Over everything that decides the resolution; for a vendor base also its record (the
    base's full freeze constrains the lock: builder.resolve.vendor)."""
    inputs: dict[str, Any] = {
        "schema": LOCK_SCHEMA, "requirements": requirements_in(target, snapshot),
        "excludes": sorted(p.name for p in target.provided),
        "constraints": sorted(f"{p.name}=={p.version}" for p in target.provided),
        "args": uv_args(target)}
    if target.build_tools:  # only then: the locks of targets without them keep their hash
        inputs["build_tools"] = sorted(target.build_tools)
    if target.overrides:  # likewise: reviewed overrides (builder.matrix.overrides), uv's --override
        inputs["overrides"] = [o.requirement for o in target.overrides]
    if record is not None:
        constraints, excludes = vendor.resolution(target, record)
        inputs.update(excludes=excludes, constraints=constraints,
                      base=vendor.record_hash(record))
    if target.extras_exceptions:  # reviewed exceptions to verl's extras: left out (extras.py)
        inputs["excludes"] = sorted({*inputs["excludes"], *extras.excluded(target)})
    blob = json.dumps(inputs, sort_keys=True).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def _uv() -> str:
    found = shutil.which("uv")
    if found:
        return found
    try:
        from uv import find_uv_bin  # the PyPI `uv` package ships the binary

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        raise LockError("uv not found: pip install uv") from None


def _uv_compile(target: Target, requirements: list[str], *, constraints: list[str],
                excludes: list[str], offline: bool, prefer: str | None = None,
                upgrade_packages: tuple[str, ...] = (),
                forced: tuple[str, ...] = ()) -> tuple[str, float]:
    with tempfile.TemporaryDirectory(prefix="verl-env-lock-") as tmp:
        tmpdir = Path(tmp)
        (tmpdir / "requirements.in").write_text("\n".join(requirements) + "\n")
        if prefer is not None:
            # uv keeps the versions of an existing output file unless a requirement moves them
            (tmpdir / "lock.txt").write_text(prefer)
        # Relative names: the lock's "# via -r requirements.in" must not carry a temp path.
        cmd = [_uv(), "pip", "compile", "requirements.in", "-o", "lock.txt", "--no-header",
               "--quiet", *uv_args(target)]
        if excludes:
            (tmpdir / "excludes.txt").write_text("".join(f"{n}\n" for n in excludes))
            cmd += ["--excludes", "excludes.txt"]
        if constraints:
            (tmpdir / "constraints.txt").write_text("".join(f"{c}\n" for c in constraints))
            cmd += ["-c", "constraints.txt"]
        if forced:  # the target's reviewed overrides, and nothing else (builder.matrix.overrides)
            (tmpdir / "overrides.txt").write_text("".join(f"{r}\n" for r in forced))
            cmd += ["--override", "overrides.txt"]
        if offline:
            cmd.append("--offline")
        for name in upgrade_packages:  # uv moves these past the preferred versions
            cmd += ["--upgrade-package", name]
        start = time.monotonic()
        limit = network_timeout() * RESOLVE_TIMEOUTS
        try:
            # TMPDIR: uv's own temporary files (the lock file of a setuptools build, one per
            # run, that uv leaves behind) go into this directory and are removed with it
            proc = children.run(cmd, cwd=tmpdir, timeout=limit,
                                env={**uv_env(), "TMPDIR": str(tmpdir)})
        except subprocess.TimeoutExpired:
            raise NetworkError(site_index() or "the default index", f"uv did not finish "
                               f"resolving within {limit:g} s", way_out=INDEX_WAY_OUT,
                               target=target.name) from None
        seconds = time.monotonic() - start
        if proc.returncode != 0:
            _raise_uv_error(target, proc.stderr)
        return (tmpdir / "lock.txt").read_text(), seconds


def site_index() -> str | None:
    """The site's package index (``--index-url``, ``index_url`` in build-env.toml, or
    ``VERL_ENV_INDEX_URL``; the CLI puts the first two into the environment variable)."""
    return os.environ.get("VERL_ENV_INDEX_URL") or None


def uv_env() -> dict[str, str]:
    """uv's environment: no uv config file, each request bounded, and the site's index, when
    there is one, as the only index (the default index and any other one configured for uv or
    pip are never asked)."""
    env = {**os.environ, "UV_NO_CONFIG": "1"}
    env.setdefault("UV_HTTP_TIMEOUT", str(max(1, int(network_timeout()))))
    index = site_index()
    if index:
        for name in _OTHER_INDEXES:
            env.pop(name, None)
        env["UV_DEFAULT_INDEX"] = index
    return env


def _raise_uv_error(target: Target, stderr: str) -> None:
    """uv failed: an index it could not reach is one :class:`NetworkError` line naming the URL;
    anything else is the resolver's own account (:class:`LockError`)."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    hits = [ln for ln in lines if _UV_NETWORK.search(ln)]
    if hits:
        found = next((m.group(1) for ln in hits for m in [_UV_URL.search(ln)] if m), None)
        refused = next((ln for ln in hits if "returned a" in ln), None)
        cause = (refused.split("returned", 1)[1].split(".")[0].strip() if refused
                 else lines[-1].removeprefix("Caused by:").strip())
        raise NetworkError(found or site_index() or "the default index", f"uv: {cause}",
                           way_out=INDEX_WAY_OUT, target=target.name)
    raise LockError("uv could not resolve the pins:\n  " + "\n  ".join(lines[-15:]),
                    target=target.name)


def _write(out: Path, text: str) -> None:
    atomic_write_text(out, text)


def build_lock_path(lock: Path) -> Path:
    return lock.with_name(lock.stem + ".build.txt")


def compile_lock(target: Target, snapshot: Snapshot, out: Path, *, offline: bool = False,
                 prefer: Path | None = None, record: dict | None = None,
                 upgrade_packages: tuple[str, ...] = (), repin: bool = False,
                 fetch_git: bool = True) -> Lock:
    """Resolve ``target`` with uv and write the lock atomically to ``out``; when the target builds
    packages from source, also the build-tools lock beside it (constrained by the main lock).
    ``prefer``: a lock whose versions are kept wherever the pins allow (an override build moves
    only what its override needs, so the layers below it stay cached; ``build-env lock`` passes
    the committed lock, so a re-lock with no change is byte-identical). ``upgrade_packages``:
    moved to their newest allowed versions all the same. ``record``: the vendor base's record
    (builder.resolve.vendor): its freeze constrains the resolution. Git sources are pinned to their
    commits beside the lock (builder.resolve.sources; a moved ref is refused unless ``repin``; without
    ``fetch_git`` the recorded commits are kept, their refs not re-checked) and
    prebuilt wheels chosen (builder.resolve.prebuilt), before anything is written."""
    unmeant = extras.exception_errors(target, snapshot)  # an exception that excuses nothing
    if unmeant:
        raise unmeant[0]
    ihash = input_hash(target, snapshot, record)
    git_pins = sources.pin_git(target, out, previous=prefer, repin=repin, fetch=fetch_git)
    wheels = prebuilt.lock_prebuilt(target)  # prebuilt first: a source build only on a miss
    constraints, excludes = vendor.resolution(target, record)
    # the reviewed exceptions to verl's extras are never taken from the index (extras.py)
    excludes = sorted({*excludes, *extras.excluded(target)})
    body, seconds = _uv_compile(
        target, requirements_in(target, snapshot),
        constraints=constraints, excludes=excludes, offline=offline,
        prefer=prefer.read_text() if prefer is not None and prefer.is_file() else None,
        upgrade_packages=upgrade_packages,
        forced=tuple(o.requirement for o in target.overrides))
    unmeant = closure.unresolved_errors(target, parse_lock(body), _shown(out))
    if unmeant:  # an override of a package the resolution does not install: nothing written
        raise unmeant[0]
    text = header(target, ihash, body) + body
    build_text = None
    if any(p.build == "source" for p in target.enabled_packages):
        pinned = [f"{p.name}=={p.version}" for p in parse_lock(body).values()]
        build_prefer = build_lock_path(prefer) if prefer is not None else None
        build_body, more = _uv_compile(target, [*BUILD_TOOLS, *target.build_tools],
                                       constraints=pinned,
                                       excludes=excludes,
                                       offline=offline,
                                       prefer=build_prefer.read_text()
                                       if build_prefer is not None and build_prefer.is_file()
                                       else None,
                                       upgrade_packages=upgrade_packages)
        build_text = (header(target, ihash, build_body).replace("lock for", "build-tools lock for")
                      + build_body)
        seconds += more
    _write(out, text)
    if build_text is not None:
        _write(build_lock_path(out), build_text)
    sources.write_record(out, git_pins)
    prebuilt.write_record(out, wheels)
    return Lock(out, ihash, text, seconds)


def moved_pins(before: str | None, after: str) -> list[tuple[str, str | None, str | None]]:
    """``(name, old, new)`` for every pin the new lock text adds, drops or moves (old or new is
    None for an added or dropped package), sorted by name."""
    old = {n: p.version for n, p in parse_lock(before).items()} if before else {}
    new = {n: p.version for n, p in parse_lock(after).items()}
    return [(n, old.get(n), new.get(n)) for n in sorted(old.keys() | new.keys())
            if old.get(n) != new.get(n)]


def header(target: Target, ihash: str, body: str) -> str:
    """The lock's header: the input hash, and what its body is (:mod:`builder.resolve.lockfile`: a
    digest of the body and of each entry), so an edit is found without resolving again."""
    forced = overrides.lock_lines(target.overrides)
    return (f"# verl-env lock for target {target.name}: {target.platform}, python "
            f"{target.python}, {python_platform(target)}\n"
            f"# input-hash: {ihash}\n" + forced + lockbody.record(body, forced) +
            f"# regenerate: build-env lock --target {target.name}\n")


def read_lock(path: Path) -> Lock:
    try:
        text = path.read_text()
    except OSError as exc:
        raise LockError(f"{path}: cannot read lock ({exc.strerror})") from None
    m = re.search(r"^# input-hash: (sha256:[0-9a-f]{64})$", text, re.M)
    if not m:
        raise LockError(f"{path}: not a verl-env lock (no input-hash header)")
    return Lock(path, m.group(1), text)


def stale_reason(target: Target, snapshot: Snapshot, path: Path) -> str | None:
    """Why the lock at ``path`` does not match the matrix entry, or None when it does."""
    if not path.exists():
        return f"no lock at {path}: run `build-env lock --target {target.name}`"
    lock = read_lock(path)
    try:
        record = vendor.load_record(target, path)
    except LockError as exc:
        return str(exc)
    if (any(p.build == "source" for p in target.enabled_packages)
            and not build_lock_path(path).exists()):
        return f"no build-tools lock at {build_lock_path(path)}: run `build-env lock`"
    unpinned = sources.record_problem(target, path) or prebuilt.record_problem(target, path)
    if unpinned:
        return unpinned
    if lock.input_hash != input_hash(target, snapshot, record):
        return (f"{path} was locked from different inputs than targets.{target.name} now has: "
                f"run `build-env lock --target {target.name}`")
    edited = lock_edits(target, path) + lockbody.pin_problems(
        path, lock.text, locked_pins(target, snapshot)
        + [(o.name, o.version) for o in target.overrides])
    if edited:
        more = f" (and {len(edited) - 3} more)" if len(edited) > 3 else ""
        return "; ".join(edited[:3]) + more
    return None


def _shown(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def lock_scope(target: Target, snapshot: Snapshot, path: Path) -> tuple[set[str] | None, bool]:
    """The package names of the target's lock (None: none, or not readable as one) and whether
    it was resolved from the target's inputs as they are, overrides apart (the same input hash
    with the overrides its header records, and no override it records or resolves changed
    since): then it is the target's closure (builder.resolve.closure)."""
    if not path.is_file():
        return None, False
    try:
        lock = read_lock(path)
        record = vendor.load_record(target, path)
    except LockError:
        return None, False
    names = set(parse_lock(lock.text))
    head = lock.text.split("\n# regenerate: ", 1)[0]
    was = overrides.recorded(head)
    now = {o.name: o.version for o in target.overrides}
    as_locked = replace(target, overrides=tuple(
        overrides.Override(n, v, "as the lock records it") for n, v in sorted(was.items())))
    changed = {n for n in was.keys() | now.keys() if was.get(n) != now.get(n)}
    same = input_hash(as_locked, snapshot, record) == lock.input_hash
    return names, same and not (changed & names)


def refuse_unmeant(target: Target, snapshot: Snapshot, path: Path) -> list[str]:
    """Raise the first thing the target asks for that cannot be meant (an unknown extra of a
    pin, an override outside its closure: builder.resolve.closure), else return the warnings
    (what cannot be told without a resolution, an override that repeats its pin)."""
    errors, warnings = closure.extra_errors(target, snapshot)
    locked, authoritative = lock_scope(target, snapshot, path)
    more, unsure = closure.override_errors(target, snapshot, locked, authoritative, _shown(path))
    if errors or more:
        raise (errors + more)[0]
    return warnings + unsure + closure.echo_warnings(target, snapshot)


def locked_pins(target: Target, snapshot: Snapshot) -> list[tuple[str, str]]:
    """The matrix pins the lock itself must hold, at their versions: all but the packages it
    leaves out (wheel-less and local-only ones; provided ones are never among them)."""
    skip = {p.name for p in (*wheelless(target, snapshot), *local_only(target, snapshot))}
    return [(p.name, p.version) for p in target.enabled_packages if p.name not in skip]


def lock_edits(target: Target, path: Path) -> list[str]:
    """What in the lock at ``path`` and its build-tools lock is not what ``build-env lock``
    wrote (:func:`builder.resolve.lockfile.problems`): an unhashed line, an edited hash, a removed or
    added entry, a missing body digest."""
    regenerate = f"build-env lock --target {target.name}"
    out = []
    for file in (path, build_lock_path(path)):
        try:
            text = file.read_text()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise LockError(f"{file}: cannot read lock ({exc.strerror})") from None
        out += lockbody.problems(file, text, regenerate)
    return out


def lock_for(matrix_path: Path, target: Target, snapshot: Snapshot, workdir: Path
             ) -> tuple[str, Path]:
    """The target's lock text and file: the committed lock (refused when stale), or a fresh one
    in ``workdir`` for an override build. Incompatible pins fail before anything resolves."""
    problems = check_target(target, snapshot)
    if problems:
        raise CompatError("; ".join(str(p) for p in problems), target=target.name)
    path = lock_path(matrix_path, target)
    refuse_unmeant(target, snapshot, path)  # what `check` refuses as bad input, render does too
    if target.override:
        committed = path
        path = workdir / f"{target.name}.override-lock.txt"
        compile_lock(target, snapshot, path, prefer=committed,
                     record=vendor.load_record(target, committed))
    else:
        stale = stale_reason(target, snapshot, path)
        if stale:
            raise CompatError(stale, target=target.name)
    return path.read_text(), path


# --------------------------------------------------------------------------- lock parsing


@dataclass(frozen=True)
class LockedPackage:
    name: str
    version: str
    hashes: tuple[str, ...]
    via: tuple[str, ...]  # packages that required it ("-r requirements.in" for direct pins)
    line: str  # the requirement as uv wrote it, without hashes

    def render(self) -> str:
        """The requirement with its hashes, one per continuation line (pip's format)."""
        parts = [self.line] + [f"    --hash={h}" for h in self.hashes]
        return " \\\n".join(parts) + "\n"


_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(\S+)")


def parse_lock(text: str) -> dict[str, LockedPackage]:
    """Parse uv's requirements output (split annotations) into packages with hashes and via.
    Each text is parsed once per process (``lock`` and ``check`` read a lock three times); the
    caller gets its own dict."""
    return dict(_parse_lock(text))


@functools.lru_cache(maxsize=64)
def _parse_lock(text: str) -> dict[str, LockedPackage]:
    out: dict[str, LockedPackage] = {}
    name = version = line = None
    hashes: list[str] = []
    via: list[str] = []
    in_via = False

    def flush() -> None:
        if name is not None:
            out[canonicalize_name(name)] = LockedPackage(
                canonicalize_name(name), version or "", tuple(hashes), tuple(via), line or "")

    for raw in text.splitlines():
        s = raw.strip()
        m = _REQ.match(raw)
        if m:
            flush()
            name, version = m.group(1), m.group(3).rstrip("\\").strip()
            line = raw.split(" \\")[0].strip()
            hashes, via, in_via = [], [], False
        elif s.startswith("--hash="):
            hashes.append(s[len("--hash="):].rstrip("\\").strip())
        elif s.startswith("# via"):
            rest = s[len("# via"):].strip()
            in_via = True
            if rest:
                via.append(rest)
        elif s.startswith("#   ") or (s.startswith("#") and in_via and s != "#"):
            via.append(s.lstrip("#").strip())
        elif not s or not s.startswith("#"):
            in_via = False
    flush()
    return out
