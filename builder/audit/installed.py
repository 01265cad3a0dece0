"""Every installed Python distribution, from installed metadata: each ``*.dist-info`` and
``*.egg-info`` (directory or file) in the Python paths given, its ``Name`` and ``Version`` read
from ``METADATA`` / ``PKG-INFO`` (the directory name where those lack one). Not the lock: what is
on disk, whoever put it there (the base image's own packages, a pip run in a later layer).

Stdlib only, and the whole module runs inside an image too (:mod:`builder.audit.image` sends its
source to the image's interpreter, which prints :data:`MARKER` and the JSON of :func:`main`): one
reader for an image and for a directory tree (:func:`read_tree`, an unpacked root file system or
a virtual environment), so the reader is tested without an engine.

In an image the paths are every interpreter's ``sys.path`` (``/opt/venv/bin/python``,
``python3``, ``python`` and the system ones, each asked) plus the conventional
``lib/python3*/{site,dist}-packages`` directories under ``/usr``, ``/usr/local``, ``/opt/*``;
in a tree, those conventional directories anywhere below its root.
"""

import glob
import json
import os
import subprocess
import sys
from typing import Dict, List, Tuple

MARKER = "--verl-env-installed--"
SUFFIXES = (".dist-info", ".egg-info")
INTERPRETERS = ("/opt/venv/bin/python", "/opt/conda/bin/python", "/usr/local/bin/python3",
                "/usr/bin/python3", "python3", "python")
PATTERNS = ("usr/lib/python3*/*-packages", "usr/local/lib/python3*/*-packages",
            "usr/lib/python3/dist-packages", "opt/*/lib/python3*/site-packages",
            "opt/*/*/lib/python3*/site-packages", "root/.local/lib/python3*/site-packages")


def _headers(text: str) -> Dict[str, str]:
    """The first value of each header of an RFC 822 metadata file (up to the body)."""
    found = {}  # type: Dict[str, str]
    for line in text.splitlines():
        if not line.strip():
            break
        if line[:1] in (" ", "\t") or ":" not in line:
            continue
        key, _, value = line.partition(":")
        found.setdefault(key.strip().lower(), value.strip())
    return found


def _from_dirname(entry: str) -> Tuple[str, str]:
    stem = entry[:-len(".dist-info")] if entry.endswith(".dist-info") else entry[:-9]
    name, _, rest = stem.partition("-")
    return name, rest.split("-")[0]


def read_one(path: str) -> Dict[str, str]:
    """One distribution: {name, version, path} (empty strings where nothing says)."""
    entry = os.path.basename(path.rstrip("/"))
    if os.path.isdir(path):
        meta = os.path.join(path, "METADATA" if entry.endswith(".dist-info") else "PKG-INFO")
    else:
        meta = path  # an egg-info file is the PKG-INFO itself
    try:
        with open(meta, encoding="utf-8", errors="replace") as f:
            headers = _headers(f.read(65536))
    except OSError:
        headers = {}
    name, version = _from_dirname(entry)
    return {"name": headers.get("name") or name, "version": headers.get("version") or version,
            "path": path}


def scan(paths: List[str]) -> List[Dict[str, str]]:
    """Every distribution in the directories ``paths`` (each once, however often named)."""
    seen, found = set(), []  # type: set, List[Dict[str, str]]
    for directory in paths:
        real = os.path.realpath(directory)
        if real in seen or not os.path.isdir(real):
            continue
        seen.add(real)
        try:
            entries = sorted(os.listdir(real))
        except OSError:
            continue
        for entry in entries:
            if entry.endswith(SUFFIXES):
                dist = read_one(os.path.join(directory, entry))
                if dist["name"]:
                    found.append(dist)
    return found


def conventional(root: str) -> List[str]:
    """The conventional Python package directories under ``root``."""
    found = []  # type: List[str]
    for pattern in PATTERNS:
        found += sorted(glob.glob(os.path.join(root, pattern)))
    return found


def read_tree(root: str) -> List[Dict[str, str]]:
    """Every distribution in a directory tree: its conventional Python package directories
    (a root file system), else every ``site-packages``/``dist-packages`` below it (a virtual
    environment, a bare directory of packages: the root itself)."""
    paths = conventional(root)
    if not paths:
        for here, dirs, _ in os.walk(root):
            dirs.sort()
            paths += [os.path.join(here, d) for d in dirs
                      if d in ("site-packages", "dist-packages")]
        paths = paths or [root]
    dists = scan(paths)
    for d in dists:
        d["path"] = "/" + os.path.relpath(d["path"], root)
    return dists


def _sys_path(interpreter: str) -> List[str]:
    try:
        out = subprocess.run([interpreter, "-c", "import json, sys; print(json.dumps(sys.path))"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=60,
                             universal_newlines=True).stdout
        return [str(p) for p in json.loads(out.strip().splitlines()[-1])]
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return []


def main() -> Dict[str, object]:
    """Inside an image: the interpreters asked, the paths read, the distributions found."""
    paths, asked = list(sys.path), [sys.executable]
    for name in INTERPRETERS:
        exe = name if os.path.isabs(name) else (_which(name) or "")
        if exe and os.access(exe, os.X_OK) and os.path.realpath(exe) not in map(
                os.path.realpath, asked):
            asked.append(exe)
            paths += _sys_path(exe)
    paths += conventional("/")
    paths = [p for p in paths if p and os.path.isdir(p)]
    return {"interpreters": asked, "paths": list(dict.fromkeys(paths)),
            "distributions": scan(paths)}


def _which(name: str) -> str:
    for d in os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(os.pathsep):
        candidate = os.path.join(d, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return ""


if __name__ == "__main__":
    print(MARKER)
    print(json.dumps(main()))
