"""Where ``propose --output DIR`` writes, decided before any work, and how the tool knows its own.

One target: ``DIR`` is the candidate itself, marked by :data:`candidate.MARKER`
(``.verl-env-proposal``). Several targets (``--all``, repeated ``--target``): ``DIR`` holds one
candidate per target, ``DIR/<target>``, and is marked by :data:`SEVERAL_MARKER`
(``.verl-env-proposals``), written into it before its first candidate. An existing ``DIR`` is
taken only when it is empty or carries the marker of its kind, and each ``DIR/<target>`` only
when it is absent, empty or a candidate this tool wrote; anything else is refused (exit 2,
naming the path) before the search, uv or the build has run and before anything is written.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from builder.files import NotOurDirectory, check_replaceable
from builder.propose.candidate import MARKER
from builder.propose.search import ProposeError

SEVERAL_MARKER = ".verl-env-proposals"
SEVERAL_TEXT = "written by build-env propose: one candidate directory per target\n"


def plan(output: Path | None, names: list[str], several: bool) -> dict[str, Path | None]:
    """Each target's candidate directory (None without ``--output``); raises
    :class:`ProposeError` (exit 2) when ``output`` or one of them may not be written."""
    if output is None:
        return {n: None for n in names}
    if not several:
        _replaceable(output)
        return {names[0]: output}
    _refuse_foreign_parent(output)
    outs: dict[str, Path | None] = {}
    for n in names:
        _replaceable(output / n)
        outs[n] = output / n
    return outs


def _replaceable(out: Path) -> None:
    try:
        check_replaceable(out, MARKER)
    except NotOurDirectory as exc:
        raise ProposeError(f"--output: {exc}; nothing was written") from None


def _refuse_foreign_parent(output: Path) -> None:
    if not output.exists() and not output.is_symlink():
        return
    if output.is_symlink() or not output.is_dir():
        raise ProposeError(f"--output: {output} exists and is not a directory: refusing to write "
                           "candidates into it; nothing was written")
    if (output / SEVERAL_MARKER).is_file():
        return
    if (output / MARKER).is_file():
        raise ProposeError(f"--output: {output} is the candidate of a single target (it holds "
                           f"{MARKER}): name another directory for several targets; nothing "
                           "was written")
    if any(output.iterdir()):
        raise ProposeError(f"--output: {output} is a non-empty directory that this tool did not "
                           f"write (no {SEVERAL_MARKER}): refusing to write candidates into it; "
                           "name a new or empty directory; nothing was written")


def claim(output: Path) -> bool:
    """Mark ``output`` as the tool's directory of candidates (created if absent) before the
    first candidate goes in. Returns True when this call created the directory."""
    created = not output.exists()
    output.mkdir(parents=True, exist_ok=True)
    marker = output / SEVERAL_MARKER
    if not marker.is_file():
        marker.write_text(SEVERAL_TEXT)
    return created


def remove_candidate(out: Path) -> None:
    """Remove a candidate directory this run wrote for a target that then failed (only one
    carrying the candidate marker: nothing else is ever removed)."""
    if out.is_dir() and not out.is_symlink() and (out / MARKER).is_file():
        shutil.rmtree(out, ignore_errors=True)


def release(output: Path, created: bool) -> None:
    """A directory of candidates this run created and left with no candidate in it (every
    target failed) is removed again."""
    if created and output.is_dir() and {p.name for p in output.iterdir()} <= {SEVERAL_MARKER}:
        shutil.rmtree(output, ignore_errors=True)
