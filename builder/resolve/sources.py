"""Where source builds get their code, pinned: a git source by full commit, a directory or an
archive by sha256.

* **git** (``git+https://HOST/REPO@TAG``; also ``git+ssh://``, ``git+git://``, ``git+file://``):
  ``lock`` resolves the ref to its commit (``git ls-remote``) and records it beside the lock
  (``locks/T.sources.json``). Rendering fetches that ref on the build host, refuses it when it no
  longer points at the recorded commit (a moved tag), and copies the commit's tree into the
  context: the image build itself needs no access to the git host, and the content tag hashes
  the tree that is built.
* **directory / archive** (``path``, ``url`` + ``sha256``): copied into the context and hashed
  (:func:`tree_sha256` over a directory's files, sha256 of an archive); the hash is recorded in
  the image's labels and manifest, and the context (hence the content tag) holds the bytes.

A source that cannot be pinned (an unknown kind of file, a symlink leaving its tree, a git source
the lock has no commit for, an sdist the metadata snapshot has no hash for) is reported by
:func:`problems`, which ``check`` prints as ``file:line: key: message`` and render refuses.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from builder import children
from builder.resolve import records
from builder.errors import LockError, NetworkError, RenderError, redact
from builder.resolve.metadata import Snapshot, network_timeout
from builder.matrix.spec import Package, Target

SOURCES_SCHEMA = "verl-env/sources/v1"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip", ".tar")
# What a directory source leaves behind that is not source (copied and hashed without it).
IGNORED = (".git", "__pycache__", "*.pyc", "build", "dist", "*.egg-info", "*.so")
_COMMIT = re.compile(r"[0-9a-f]{40}")
# A shallow fetch of one tag may stream for a while: bounded at this many network timeouts, and
# stopped sooner by git itself when an HTTP transfer stalls (http.lowSpeedTime).
FETCH_TIMEOUTS = 10
LOCK_WAY_OUT = ("--no-fetch keeps the commit the lock recorded; or a local copy: "
                "source: {path: DIR}")
RENDER_WAY_OUT = ("render --no-fetch writes a context for reading; or a local copy: "
                  "source: {path: DIR}")


@dataclass(frozen=True)
class Pin:
    """What a source build's code is pinned to (``kind``: git, tree, archive, sdist)."""

    kind: str
    value: str  # the commit, or sha256:HEX
    ref: str = ""  # git: the ref the matrix names

    def label(self) -> str:
        return f"git {self.ref} {self.value}" if self.kind == "git" else f"{self.kind} {self.value}"


# --------------------------------------------------------------------------- git


def split_git(location: str) -> tuple[str, str]:
    """``git+https://host/repo@v1`` -> (``https://host/repo``, ``v1``)."""
    url = location[len("git+"):]
    head, sep, ref = url.rpartition("@")
    if not sep or "/" in ref or not head or head.endswith("://"):
        raise ValueError(f"{location}: expected git+SCHEME://HOST/REPO@REF")
    return head, ref


def _git(*args: str, cwd: Path | None = None, url: str | None = None,
         way_out: str = LOCK_WAY_OUT, timeout: float | None = None
         ) -> subprocess.CompletedProcess[str]:
    """Run git; when it talks to ``url``, bounded (:func:`network_timeout`) and a stall or a
    failure to reach it is one :class:`NetworkError` naming the URL and ``way_out``."""
    git = shutil.which("git")
    if git is None:
        raise LockError("git not found: source builds from git need it (apt-get install git)")
    limit = timeout or network_timeout()
    wait = max(1, int(network_timeout()))  # one stall: git stops an HTTP transfer, ssh a connect
    stall = ["-c", "http.lowSpeedLimit=1", "-c", f"http.lowSpeedTime={wait}"]
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_SSH_COMMAND": os.environ.get(
        "GIT_SSH_COMMAND", f"ssh -o BatchMode=yes -o ConnectTimeout={wait}")}
    try:
        proc = children.run([git, *stall, *args], cwd=cwd, timeout=limit, env=env)
    except subprocess.TimeoutExpired:
        if url is None or url.startswith("file://"):
            raise LockError(f"git {args[0]} {url or ''}: no result within {limit:g} s") from None
        raise NetworkError(url, f"git {args[0]}: no answer within {limit:g} s",
                           way_out=way_out) from None
    if proc.returncode != 0 and url is not None:
        reason = f"git {args[0]}: {_last_line(proc.stderr, proc.returncode)}"
        if url.startswith("file://"):  # a repository on this host: no network involved
            raise LockError(f"{url}: {reason}")
        raise NetworkError(url, reason, way_out=way_out)
    return proc


def _last_line(stderr: str, code: int) -> str:
    """git's own reason in one line, credentials redacted ("fatal: unable to access ...")."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return redact(lines[-1]) if lines else f"exit status {code}"


def remote_commit(url: str, ref: str, way_out: str = LOCK_WAY_OUT) -> str:
    """The commit ``ref`` (a tag, peeled; else a branch; else a full commit) names at ``url``.
    Raises :class:`NetworkError` when the remote cannot be reached (in time), and
    :class:`LockError` when it has no such ref."""
    if _COMMIT.fullmatch(ref):
        return ref
    proc = _git("ls-remote", url, f"refs/tags/{ref}", f"refs/tags/{ref}^{{}}",
                f"refs/heads/{ref}", url=url, way_out=way_out)
    refs: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        if "\t" in line:
            sha, name = line.split("\t", 1)
            refs[name] = sha
    for name in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}"):
        if name in refs:
            return refs[name]
    raise LockError(f"{redact(url)} has no tag or branch {ref!r}")


def record_path(lock: Path) -> Path:
    return lock.with_name(lock.stem + ".sources.json")


def git_packages(target: Target) -> list[Package]:
    return [p for p in target.enabled_packages
            if p.build == "source" and p.source is not None and p.source.kind == "git"]


def load_record(lock: Path) -> dict[str, dict[str, str]]:
    return records.read_packages(record_path(lock), SOURCES_SCHEMA, "sources")


def moved_message(target: Target, p: Package, ref: str, recorded: str, found: str) -> str:
    url = redact(split_git(p.source.location)[0]) if p.source else "?"
    return (f"{p.name}: the git ref {ref!r} of {url} moved: the lock records commit {recorded}, "
            f"the source now has {found}; review the new commit, then "
            f"`build-env lock --target {target.name} --repin`")


def pin_git(target: Target, lock: Path, *, previous: Path | None = None,
            repin: bool = False, fetch: bool = True) -> dict[str, dict[str, str]]:
    """Resolve every git source of ``target`` to its commit (the record to write beside
    ``lock`` with :func:`write_record`). A ref that moved since ``previous`` (default: the
    record already beside ``lock``) recorded it is refused unless ``repin``. Without ``fetch``
    (a host that cannot reach the source) the recorded commit of an unchanged source is kept,
    its ref not re-checked; a source with no record is refused."""
    old = load_record(previous or lock)
    out: dict[str, dict[str, str]] = {}
    for p in git_packages(target):
        assert p.source is not None
        url, ref = split_git(p.source.location)
        before = old.get(p.name, {})
        if not fetch:
            if before.get("source") != p.source.location or not before.get("commit"):
                raise LockError(f"{p.name}: no recorded commit for {p.source.location} to keep "
                                "(--no-fetch): lock it once where the source is reachable",
                                target=target.name)
            out[p.name] = {"source": p.source.location, "ref": ref, "commit": before["commit"]}
            continue
        try:
            found = remote_commit(url, ref)
        except LockError as exc:
            raise LockError(f"{p.name}: cannot pin {p.source.location} to a commit: {exc}",
                            target=target.name) from None
        if (not repin and before.get("source") == p.source.location
                and before.get("commit") not in (None, found)):
            raise LockError(moved_message(target, p, ref, before["commit"], found),
                            target=target.name)
        out[p.name] = {"source": p.source.location, "ref": ref, "commit": found}
    return out


def write_record(lock: Path, out: dict[str, dict[str, str]]) -> None:
    """The git pins beside ``lock`` (no file when there are none)."""
    records.write_packages(record_path(lock), SOURCES_SCHEMA, out)


def record_problem(target: Target, lock: Path) -> str | None:
    """Why the sources record does not pin the target's git sources (None: it does)."""
    try:
        record = load_record(lock)
    except LockError as exc:
        return str(exc)
    for p in git_packages(target):
        assert p.source is not None
        entry = record.get(p.name, {})
        if entry.get("source") != p.source.location or not _COMMIT.fullmatch(
                entry.get("commit", "")):
            return (f"{p.name}: {p.source.location} is not pinned to a commit in "
                    f"{record_path(lock)}: run `build-env lock --target {target.name}`")
    return None


def moved_refs(target: Target, lock: Path, *, remote: bool = True
               ) -> tuple[list[tuple[str, str]], list[str]]:
    """(errors, warnings): ``(key, message)`` for each git ref that now points elsewhere than
    the recorded commit, and the sources that could not be asked (unreachable: the recorded
    commit is what a build fetches, and it refuses a moved ref then). Without ``remote`` only
    repositories on this host (``git+file://``) are asked: no network call."""
    errors: list[tuple[str, str]] = []
    warnings: list[str] = []
    record = load_record(lock)
    for p in git_packages(target):
        assert p.source is not None
        entry = record.get(p.name)
        if not entry or entry.get("source") != p.source.location:
            continue  # record_problem reports it
        url, ref = split_git(p.source.location)
        if not remote and not url.startswith("file://"):
            continue
        try:
            found = remote_commit(url, ref)
        except (LockError, NetworkError) as exc:
            warnings.append(f"{p.name}: cannot confirm that {ref!r} still points at "
                            f"{entry['commit']} ({exc})")
            continue
        if found != entry["commit"]:
            errors.append((f"packages.{p.name}.source",
                           moved_message(target, p, ref, entry["commit"], found)))
    return errors, warnings


def fetch_git(target: Target, p: Package, commit: str, dest: Path) -> None:
    """The tree of ``p``'s git ref, which must still be ``commit``, into directory ``dest``."""
    assert p.source is not None
    url, ref = split_git(p.source.location)
    with tempfile.TemporaryDirectory(prefix="verl-env-git-") as tmp:
        repo = Path(tmp)
        if _git("init", "-q", cwd=repo).returncode != 0:
            raise RenderError(f"{p.name}: git init failed in {repo}", target=target.name)
        try:
            # asked first within one bound (a silent remote fails here, not after the fetch's
            # longer one), and a moved ref is refused before anything is fetched
            now = remote_commit(url, ref, RENDER_WAY_OUT)
            if now != commit:
                raise RenderError(moved_message(target, p, ref, commit, now), target=target.name)
            _git("fetch", "-q", "--depth", "1", url, ref, cwd=repo, url=url,
                 way_out=RENDER_WAY_OUT, timeout=network_timeout() * FETCH_TIMEOUTS)
        except NetworkError as exc:
            exc.target = target.name
            raise
        except LockError as exc:  # a repository on this host that git cannot read
            raise RenderError(f"{p.name}: {exc.args[0]}", target=target.name) from None
        found = _git("rev-parse", "FETCH_HEAD^{commit}", cwd=repo).stdout.strip()
        if found != commit:
            raise RenderError(moved_message(target, p, ref, commit, found), target=target.name)
        archive = children.run([shutil.which("git") or "git", "archive", "--format=tar",
                                commit], cwd=repo, text=False)
        if archive.returncode != 0:
            raise RenderError(f"{p.name}: git archive {commit}: "
                              f"{archive.stderr.decode(errors='replace').strip()}",
                              target=target.name)
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="tar")


# --------------------------------------------------------------------------- hashing


def _ignored(name: str) -> bool:
    return any(fnmatch(name, pattern) for pattern in IGNORED)


def tree_sha256(root: Path) -> str:
    """sha256 over a directory tree as it is built: every file's relative path, executable bit
    and bytes, every symlink's target, in sorted order; what :data:`IGNORED` names is left out.
    Raises ``ValueError`` for what cannot be hashed (a symlink leaving the tree, a special file)."""
    h = hashlib.sha256(b"verl-env/tree/v1\n")
    root = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not _ignored(d)
                             and not os.path.islink(os.path.join(dirpath, d)))
        links = [d for d in os.listdir(dirpath) if os.path.islink(os.path.join(dirpath, d))
                 and os.path.isdir(os.path.join(dirpath, d)) and not _ignored(d)]
        for name in sorted({*filenames, *links}):
            if _ignored(name):
                continue
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                dest = os.readlink(path)
                if os.path.isabs(dest) or not (path.parent / dest).resolve().is_relative_to(root):
                    raise ValueError(f"{rel} is a symlink out of the tree ({dest})")
                h.update(f"l {rel} {dest}\n".encode())
            elif path.is_file():
                mode = "x" if os.access(path, os.X_OK) else "-"
                h.update(f"f {rel} {mode} {path.stat().st_size}\n".encode())
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
            else:
                raise ValueError(f"{rel} is neither a file nor a directory")
    return "sha256:" + h.hexdigest()


def archive_suffix(location: str) -> str:
    location = location.rstrip("/")
    return next((s for s in ARCHIVE_SUFFIXES if location.endswith(s)), "")


# --------------------------------------------------------------------------- check


def problems(target: Target, snapshot: Snapshot, lock: Path | None) -> list[tuple[str, str]]:
    """``(key, message)`` for every source build whose code cannot be pinned; ``key`` is the
    dotted key inside the target (``packages.NAME.source``)."""
    out: list[tuple[str, str]] = []
    record: dict[str, dict[str, str]] = {}
    if lock is not None:
        try:
            record = load_record(lock)
        except LockError as exc:
            out.append(("", str(exc)))
    for p in target.enabled_packages:
        if p.build != "source":
            continue
        key = f"packages.{p.name}.source"
        if p.source is None:
            rel = snapshot.release(p.name, p.version)
            if rel is None or not rel.sdist_sha256:
                out.append((f"packages.{p.name}", f"{p.name} {p.version}: build: source needs "
                            "an sdist with a sha256 on the index (none in the metadata snapshot) "
                            "or a source (git+https://HOST/REPO@TAG, a directory or an archive)"))
            continue
        if p.source.kind == "git":
            entry = record.get(p.name, {})
            if lock is not None and (entry.get("source") != p.source.location
                                     or not _COMMIT.fullmatch(entry.get("commit", ""))):
                out.append((key, f"{p.name}: {p.source.location} is not pinned to a commit "
                            f"(no entry in {record_path(lock).name}): run `build-env lock "
                            f"--target {target.name}`"))
            continue
        if p.source.kind == "url":
            continue  # the matrix carries its sha256 (spec), checked when fetched
        src = Path(p.source.location)
        if src.is_dir():
            try:
                tree_sha256(src)
            except (ValueError, OSError) as exc:
                out.append((key, f"{p.name}: cannot hash the directory {src}: {exc}"))
        elif not archive_suffix(str(src)):
            out.append((key, f"{p.name}: source {src} is neither a directory nor an archive "
                        f"({', '.join(ARCHIVE_SUFFIXES)}): it cannot be hashed"))
        elif not src.is_file():
            out.append((key, f"{p.name}: cannot read the archive {src}"))
    return out


def refuse_problems(target: Target, snapshot: Snapshot, lock: Path | None) -> None:
    found = problems(target, snapshot, lock)
    if found:
        raise RenderError("; ".join(f"{target.where(k)}: targets.{target.name}"
                                    f"{'.' + k if k else ''}: {m}" for k, m in found),
                          target=target.name)


def describe(pins: dict[str, Pin]) -> dict[str, Any]:
    return {name: {"kind": pin.kind, "pin": pin.value, **({"ref": pin.ref} if pin.ref else {})}
            for name, pin in sorted(pins.items())}
