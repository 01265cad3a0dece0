"""The one atomic-write helper: a reader sees the old file or the new one, never half of either.

The new content goes to a temporary file in the same directory (same file system), is flushed to
disk, and replaces the target with ``os.replace``. On any error the temporary file is removed.

Directories the tool generates (build contexts) are replaced the same way, and only when the
directory being replaced is one the tool wrote itself (:func:`replace_generated_dir`): a user's
``--output .`` inside a site never deletes the site.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def naming(path: Path | str) -> Iterator[None]:
    """An OSError raised inside names ``path`` (the path the user gave), not the temporary file
    or directory the tool writes beside it: ``-o DIR`` says ``DIR: cannot write: Is a
    directory``, never ``.DIR.x1y2.part: Is a directory``. Its errno (and so its exit code: a
    full disk stays an infrastructure error) is kept."""
    try:
        yield
    except OSError as exc:
        why = exc.strerror or str(exc)
        if exc.filename == str(path) and why.startswith("cannot write"):
            raise  # named already (a helper inside that names the same path)
        raise OSError(exc.errno, f"cannot write: {why}", str(path)) from exc


def reason(exc: OSError) -> str:
    """What went wrong, in the system's words (``No space left on device``), also for an error
    :func:`naming` re-raised with its own ``cannot write:`` wording."""
    inner = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
    return inner.strerror or str(inner)


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    path = Path(path)
    with naming(path):
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, data, mode)


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: Path, text: str, mode: int = 0o644) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def state_home() -> Path:
    """Where the tool keeps its local state (verdict records, run locks):
    ``$XDG_STATE_HOME/verl-env``, default ``~/.local/state/verl-env``."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "verl-env"


def sha256_file(path: Path) -> str:
    """``sha256:<hex>`` of a file, read in 8 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
    return "sha256:" + h.hexdigest()


def sha256_text(text: str) -> str:
    """``sha256:<hex>`` of a text's UTF-8 bytes."""
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class NotOurDirectory(Exception):
    """The path exists and is not a directory this tool generated: it is never replaced."""


def _marker_kind(directory: Path, marker: str, legacy: frozenset[str]) -> str | None:
    """``marked``, ``legacy`` (an unmarked earlier rendering: only names in ``legacy`` at its top
    level, ``manifest.json`` among them), ``empty``, or None (someone else's directory)."""
    if (directory / marker).is_file():
        return "marked"
    names = {p.name for p in directory.iterdir()}
    if not names:
        return "empty"
    if legacy and "manifest.json" in names and names <= legacy:
        try:
            schema = json.loads((directory / "manifest.json").read_text()).get("schema", "")
        except (OSError, ValueError, AttributeError):
            return None
        if isinstance(schema, str) and schema.startswith("verl-env/manifest/"):
            return "legacy"
    return None


def check_replaceable(out: Path, marker: str, legacy: frozenset[str] = frozenset()) -> None:
    """Raise :class:`NotOurDirectory` unless ``out`` is absent, an empty directory, or a directory
    this tool generated (it holds ``marker``). Called before any work and again at the swap."""
    out = Path(out)
    if not out.exists() and not out.is_symlink():
        return
    if out.is_symlink() or not out.is_dir():
        raise NotOurDirectory(f"{out} exists and is not a directory: refusing to replace it")
    if _marker_kind(out, marker, legacy) is None:
        raise NotOurDirectory(
            f"{out} is a non-empty directory that this tool did not write (no {marker}): "
            "refusing to replace it; name a new or empty directory")


def replace_generated_dir(staged: Path, out: Path, marker: str,
                          legacy: frozenset[str] = frozenset()) -> None:
    """Put the finished directory ``staged`` (a sibling of ``out``, same file system) at ``out``.

    An existing ``out`` is replaced only if :func:`check_replaceable` allows it: it is renamed
    aside first, the new one renamed into place, then the old one removed, so ``out`` is at every
    moment either the complete old directory or the complete new one."""
    out = Path(out)
    check_replaceable(out, marker, legacy)
    if not out.exists():
        os.replace(staged, out)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
    os.rmdir(aside)
    os.replace(out, aside)
    try:
        os.replace(staged, out)
    except BaseException:
        os.replace(aside, out)
        raise
    shutil.rmtree(aside, ignore_errors=True)
