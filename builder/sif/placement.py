"""Writing one image file (a ``.sif`` or ``.sqsh``) so that nothing half-done is ever left.

:func:`placing` is the frame both conversions run in:

* it holds the run lock of the output path (:mod:`builder.exclusive`): a second run writing the same
  file waits for the first, then does its own conversion and replaces the file atomically;
* under that lock it removes what an earlier, killed run of the same output left (its
  ``.NAME.partial-PID`` file beside the output and its ``.build-env-sif-NAME-HASH-*`` scratch
  directory): no live run can own them, since a live run would hold the lock;
* it checks the free space up front against what the image's size lets us estimate (refused below
  the :class:`Need`'s floor, a warning below its estimate);
* a write that fills the file system (``ENOSPC``, from our own writes or from ``mksquashfs``'s
  "No space left on device") becomes one clear error naming the file system's path, what was
  written and how much the conversion needs;
* on any failure the partial file and the scratch directory are removed; the output path keeps
  whatever was there before (the caller renames the partial file only once it has been checked).
"""

from __future__ import annotations

import errno
import glob
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from builder import exclusive as runlock
from builder.errors import SifError

SCRATCH_PREFIX = ".build-env-sif-"
NO_SPACE = "No space left on device"


@dataclass(frozen=True)
class Need:
    """Space a conversion needs in one place: ``floor`` (less free: refused before anything is
    written) and ``estimate`` (less free: a warning, the write may still fit)."""

    where: str  # "output" or "scratch"
    floor: int
    estimate: int
    what: str  # "the SIF (gzip squashfs of a 48 MiB image)"


@dataclass(frozen=True)
class Work:
    partial: Path
    scratch: Path  # this run's directory under ``base``
    base: Path  # --tmpdir, else the output's directory
    free: dict[str, int]  # free bytes when the conversion started: "output", "scratch"


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the file system holding ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _tag(output: Path) -> str:
    """The scratch directories of one output path share this prefix (name + hash of the path)."""
    digest = hashlib.sha256(str(output.resolve()).encode()).hexdigest()[:12]
    return f"{SCRATCH_PREFIX}{output.name}-{digest}-"


def scratch_base(output: Path, tmpdir: Path | None) -> Path:
    return Path(tmpdir).absolute() if tmpdir else output.parent


def partial_path(output: Path) -> Path:
    return output.parent / f".{output.name}.partial-{os.getpid()}"


def sweep(output: Path, tmpdir: Path | None) -> list[Path]:
    """Remove the partial files and scratch directories earlier runs for ``output`` left.
    Call only while holding the output's run lock. Returns what was removed."""
    removed: list[Path] = []
    base = scratch_base(output, tmpdir)
    if output.parent.is_dir():
        for p in output.parent.glob(f".{glob.escape(output.name)}.partial-*"):
            p.unlink(missing_ok=True)
            removed.append(p)
    if base.is_dir():
        for d in base.glob(f"{glob.escape(_tag(output))}*"):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def _same_fs(a: Path, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b).st_dev


def preflight(output: Path, base: Path, needs: list[Need], target: str | None) -> list[str]:
    """Refuse (SifError) when a place has less free space than the floor of what it needs;
    return warnings for places with less than the estimate."""
    places = {"output": output.parent, "scratch": base}
    if _same_fs(output.parent, base):
        needs = _combined(needs)
    warnings = []
    for need in needs:
        where = places[need.where]
        free = free_bytes(where)
        if free < need.floor:
            raise SifError(
                f"not enough space on the file system of {where}: {mib(free)} free, and "
                f"{need.what} needs at least {mib(need.floor)} (up to about "
                f"{mib(need.estimate)}); nothing was written. Free space there or choose "
                f"another {'--tmpdir' if need.where == 'scratch' else '--output'}", target=target)
        if free < need.estimate:
            warnings.append(f"warning: {where} has {mib(free)} free; {need.what} may need up "
                            f"to {mib(need.estimate)}")
    return warnings


#: A failure with less free space than this where the conversion writes is a full disk (the
#: writer's own message may be lost: mksquashfs's log lives on the file system that filled).
FULL_BELOW = 1 << 20


def is_disk_full(exc: BaseException) -> bool:
    """The error says so (ENOSPC, or a tool's "No space left on device")."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    return NO_SPACE in str(exc)


def _filled(output: Path, work: Work) -> bool:
    return any(free_bytes(p) < FULL_BELOW for p in (output.parent, work.scratch) if p.exists())


def _combined(needs: list[Need]) -> list[Need]:
    """One file system holds the output and the scratch: their needs add up."""
    if not needs:
        return []
    return [Need("output", sum(n.floor for n in needs), sum(n.estimate for n in needs),
                 " together with ".join(n.what for n in needs))]


def disk_full_error(exc: BaseException, output: Path, work: Work, needs: list[Need],
                    target: str | None) -> SifError:
    """The clear message for a write that filled a file system."""
    filename = getattr(exc, "filename", None)
    same = _same_fs(output.parent, work.base)
    candidates = {"output": output.parent, "scratch": work.base}
    if same:
        where, needs = "output", _combined(needs)
    elif filename:
        where = "scratch" if Path(str(filename)).absolute().is_relative_to(work.base) \
            else "output"
    else:  # the fuller of the two
        where = min(candidates, key=lambda k: free_bytes(candidates[k]))
    place = candidates[where]
    need = next((n for n in needs if n.where == where), None)
    wanted = f"; {need.what} needs up to about {mib(need.estimate)}" if need else ""
    option = "--tmpdir" if where == "scratch" else "--output"
    label = "the scratch directory" if where == "scratch" else "the output directory"
    return SifError(
        f"no space left on device in {label} {place} ({mib(work.free[where])} were free when "
        f"the conversion started){wanted}. Nothing was left at {output} and the partial files "
        f"were removed; free space there or choose another {option}", target=target)


@contextmanager
def placing(output: Path, tmpdir: Path | None, *, what: str, needs: list[Need],
            target: str | None) -> Iterator[Work]:
    """The frame of one conversion to ``output`` (absolute): see the module docstring. The body
    writes ``work.partial`` (and scratch files) and renames the partial file to ``output``."""
    base = scratch_base(output, tmpdir)
    output.parent.mkdir(parents=True, exist_ok=True)
    base.mkdir(parents=True, exist_ok=True)
    with runlock.held(runlock.key_for_path(output), what=what):
        removed = sweep(output, tmpdir)
        if removed:
            print(f"build-env: removed what an interrupted run left: "
                  f"{', '.join(str(p) for p in removed)}", file=sys.stderr, flush=True)
        for line in preflight(output, base, needs, target):
            print(f"build-env: {line}", file=sys.stderr, flush=True)
        try:
            scratch = Path(tempfile.mkdtemp(prefix=_tag(output), dir=base))
        except OSError as exc:
            raise SifError(f"cannot create a scratch directory in {base}: {exc.strerror}",
                           target=target) from None
        work = Work(partial_path(output), scratch, base,
                    {"output": free_bytes(output.parent), "scratch": free_bytes(base)})
        try:
            yield work
        except Exception as exc:
            if is_disk_full(exc) or _filled(output, work):
                raise disk_full_error(exc, output, work, needs, target) from None
            raise
        finally:
            work.partial.unlink(missing_ok=True)
            shutil.rmtree(work.scratch, ignore_errors=True)
