#!/usr/bin/env python3
"""Cross-check the self-test's ABI phase against the real loader, inside an image.

Runs with the image's interpreter and its installed self-test (``/opt/verl-env`` on the path;
bind-mount a newer ``builder/selftest`` over ``/opt/verl-env/verl_env_selftest`` to check a
working tree), and compares, for every ELF shared object under the interpreter's site
directories:

* the phase (``abi.scan``: the process after ``import torch``, the image's loader path) with
  a real ``dlopen`` of the file: ``import torch`` once, then one ``fork`` per file, whose child
  calls ``ctypes.CDLL(path, sys.getdlopenflags())`` (``RTLD_NOW``, local: what Python's import
  does; ``RTLD_GLOBAL`` would leak each file's symbols into the next file's scope) and exits;
  a fresh child per file, so no file is helped by one loaded before it;
* the phase's loader model run as ``ldd`` runs it (the file alone, nothing loaded before it:
  ``abimodel.unbound_alone``) with ``ldd -r``: the same unresolved symbols and missing
  libraries.

Every disagreement is listed with the phase's class for the file (driver, alternative not
taken, another interpreter, allowed). Prints one JSON object (``--json PATH`` writes it too)::

    docker run --rm --network none -v $PWD/builder/selftest:/opt/verl-env/verl_env_selftest:ro \
        -v $PWD/scripts:/x:ro IMAGE /opt/venv/bin/python /x/abi-crosscheck.py --accelerator cuda

Stdlib only (torch is imported for the dlopen half).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, "/opt/verl-env")

from verl_env_selftest import abi, abiload, abimodel  # noqa: E402
from verl_env_selftest.phases.coverage import shared_objects, site_dirs  # noqa: E402

LDD_SYM = re.compile(r"\s*undefined symbol: ([^,\s]+)(?:, version \S+)?\s+\((.*)\)$")
LDD_MISSING = re.compile(r"\s*(\S+) => not found")


def ldd_r(path: str) -> tuple[set[str], set[str]]:
    """(undefined symbols of ``path`` itself, libraries not found) as ``ldd -r`` says."""
    out = subprocess.run(["ldd", "-r", path], capture_output=True, text=True, timeout=300)
    syms, missing = set(), set()
    for line in (out.stdout + out.stderr).splitlines():
        m = LDD_SYM.match(line)
        if m and os.path.realpath(m.group(2)) == path:
            syms.add(m.group(1))
        m = LDD_MISSING.match(line)
        if m:
            missing.add(m.group(1))
    return syms, missing


def dlopen_each(paths: list[str], first: dict[str, list[tuple[str, bool]]]) -> \
        dict[str, str | None]:
    """path -> None (loaded) or the loader's error, each in a fresh fork after import torch;
    ``first``: what the file's package loads itself before it (abiload.PACKAGE_LOADS), loaded
    first in the child as the package does (RTLD_GLOBAL where it does)."""
    importlib.import_module("torch")  # extensions load after torch, as in a training job
    flags = sys.getdlopenflags()
    out: dict[str, str | None] = {}
    for path in paths:
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: load, say what happened, leave without cleanup
            os.close(rfd)
            try:
                for lib, global_ in first.get(path, []):
                    ctypes.CDLL(lib, mode=flags | (os.RTLD_GLOBAL if global_ else 0))
                ctypes.CDLL(path, mode=flags)
                msg = b""
            except OSError as e:
                msg = str(e).encode() or b"OSError"
            os.write(wfd, msg)
            os._exit(0)
        os.close(wfd)
        chunks = []
        while True:
            chunk = os.read(rfd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(rfd)
        _pid, status = os.waitpid(pid, 0)
        msg = b"".join(chunks).decode(errors="replace")
        if os.WIFSIGNALED(status):
            msg = f"killed by signal {os.WTERMSIG(status)} while loading"
        out[path] = msg or None
    return out


def classify(found: Any, root_of: dict[str, str]) -> dict[str, dict[str, Any]]:
    """realpath -> the phase's view of the file: status (loads | problems | driver | allowed |
    alternative | interpreter | foreign) and its problems."""
    out: dict[str, dict[str, Any]] = {}
    for r in found.results:
        real = os.path.realpath(os.path.join(root_of[r.dist, r.library], r.library))
        problems = [p.text() for p in r.problems]
        status = "problems" if problems else ("driver" if r.driver else "loads")
        if problems and r.allowed:
            status = "allowed"
        if r.not_taken:
            status = "alternative"
        out[real] = {"status": status, "problems": problems, "driver": sorted(r.driver)}
    for kind, items in (("interpreter", found.other_interpreter),
                        ("foreign", found.foreign)):
        for rel, root in _located(items, found.roots):
            out[os.path.realpath(os.path.join(root, rel))] = {"status": kind, "problems": []}
    return out


def _located(items: list[Any], roots: list[str]) -> list[tuple[str, str]]:
    out = []
    for item in items:
        rel = item if isinstance(item, str) else item["library"]
        root = next((r for r in roots if os.path.exists(os.path.join(r, rel))), roots[0])
        out.append((rel, root))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--accelerator", default="cuda")
    ap.add_argument("--json", help="also write the result here")
    ap.add_argument("--allow", default="{}", help="abi_allow as JSON (default: none)")
    ap.add_argument("--no-ldd", action="store_true")
    args = ap.parse_args()
    roots = site_dirs()
    t0 = time.monotonic()
    found = abi.scan(roots, args.accelerator, allow=json.loads(args.allow))
    seconds = time.monotonic() - t0
    root_of = {}
    for root in roots:
        owned = abi.owners(root)
        for p in shared_objects(root):
            rel = os.path.relpath(p, root)
            root_of[owned.get(os.path.normpath(rel), abi.UNOWNED), rel] = root
    phase = classify(found, root_of)
    paths = sorted(phase)
    proc, _src = abi.make_process(sys.executable, roots, dict(os.environ))
    ldd_disagree, ldd_unresolved, model_unresolved = [], 0, 0
    if not args.no_ldd:
        for p in paths:
            if phase[p]["status"] == "foreign":
                continue
            syms, missing = abimodel.unbound_alone(proc, p)
            theirs = ldd_r(p)
            ldd_unresolved += bool(theirs[0] or theirs[1])
            model_unresolved += bool(syms or missing)
            if (syms, set(missing)) != theirs:
                ldd_disagree.append({"file": p, "symbols": sorted(syms ^ theirs[0])[:5],
                                     "libraries": sorted(set(missing) ^ theirs[1])})
    first = {os.path.realpath(os.path.join(root_of[k], k[1])): abiload.package_loads(k[1], roots)
             for k in root_of}
    loaded = dlopen_each([p for p in paths if phase[p]["status"] != "foreign"], first)
    rows, disagree = [], []
    for p in paths:
        view = phase[p]
        err = loaded.get(p)
        row = {"file": p, "phase": view["status"], "dlopen": "ok" if err is None else err}
        rows.append(row)
        says_loads = view["status"] in ("loads", "driver")
        if view["status"] in ("loads", "problems") and says_loads != (err is None):
            disagree.append(row)
        elif view["status"] == "driver" and err is not None and not any(
                d in err for d in view["driver"]):
            disagree.append(row)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["phase"]] = counts.get(row["phase"], 0) + 1
    result = {
        "elf_files": found.elf_files, "objects": len(found.results), "seconds": round(seconds, 2),
        "phase_classes": counts,
        "phase_unresolved_files": sum(1 for r in rows if r["phase"] == "problems"),
        "dlopen_failed": sum(1 for r in rows if r["dlopen"] != "ok"),
        "dlopen_disagree": disagree,
        "ldd": None if args.no_ldd else {
            "files": len([p for p in paths if phase[p]["status"] != "foreign"]),
            "unresolved_files_ldd": ldd_unresolved, "unresolved_files_model": model_unresolved,
            "disagree": ldd_disagree},
        "files": rows,
    }
    text = json.dumps(result, indent=1, sort_keys=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    summary = {k: v for k, v in result.items() if k != "files"}
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
