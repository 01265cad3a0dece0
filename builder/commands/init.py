"""``build-env init DIR``: a starter site (matrix, snapshot, locks)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from builder.commands import _shared
from builder.errors import SiteError
from builder.files import atomic_write_text
from builder.matrix.spec import with_modeline
from builder.resolve.targets import init_site

NAME = "init"
HELP = "write a starter site directory (matrix, snapshot, locks)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    # a string, not a Path: Path("") is ".", and an empty DIR must not make the working
    # directory a site (`init .` says so on purpose)
    p.add_argument("directory", metavar="DIR",
                   help="the new site's directory (`.` for the working directory)")
    _shared.json_flag(p, "the files written")
    _shared.quiet(p)


# what a directory may already hold and still become a site: a version-control directory
# (`git init site && build-env init site`); init writes none of these names
KEPT = frozenset({".git", ".hg", ".svn"})


def refuse_occupied(directory: Path) -> None:
    """A directory that holds anything but :data:`KEPT` is refused before anything is written:
    init never mixes its files with someone else's (an existing matrix is refused as before)."""
    if (directory / "matrix.yaml").exists() or not directory.is_dir():
        return  # init_site refuses the first; a missing DIR is made, a file DIR fails there
    others = sorted(p.name for p in directory.iterdir() if p.name not in KEPT)
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise SiteError(f"{directory} is not empty ({shown}): init writes a site only into a new "
                        "or empty directory (a .git there is kept); nothing written")


def run(args: argparse.Namespace) -> int:
    if not args.directory.strip():
        raise SiteError(f"DIR is empty ({args.directory!r}): name the new site's "
                        "directory (`.` for the working directory); nothing written")
    directory = Path(args.directory)
    refuse_occupied(directory)
    written = init_site(directory)
    # the first line points editors at the schema `check` validates against
    matrix = directory / "matrix.yaml"
    atomic_write_text(matrix, with_modeline(matrix.read_text(encoding="utf-8")))
    if args.json:
        _shared.emit_json("init", {"site": str(directory.resolve()),
                                   "written": [str(p) for p in written]})
    _shared.info(args, f"{directory}: verl-env site with {len(written)} files (matrix.yaml, "
                       f"metadata/, locks/); next: cd {shlex.quote(str(directory))} && "
                       "build-env check")
    return 0
