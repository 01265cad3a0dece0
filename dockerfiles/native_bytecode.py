"""Byte-compile an image's Python modules with the build machine's own interpreter.

Stdlib only: this file goes into a build context as ``bytecode/compile.py`` (the bytecode stage
of ``Dockerfile.j2`` beside it, for a target with ``base.bytecode_image``) and runs there, never
inside the tool. An image built under emulation (arm64 on an x86_64 host, QEMU) would otherwise
byte-compile every module with its own interpreter, emulated: about a minute for torch alone. The
same CPython version writes the same byte code on every architecture (the magic number and
cache tag are the version's, and checked-hash ``.pyc`` files hold no time stamp), so the build
machine's interpreter compiles them natively, in the very step that installed them.

Two uses:

* ``python3.X compile.py --launcher PATH --mount DIR`` (in the bytecode stage, natively): write
  ``PATH``, a shell script that runs this interpreter through its own dynamic loader and
  libraries as seen under ``DIR`` (where the install steps bind-mount this stage), so that it
  starts inside a container of another architecture: the kernel runs the loader natively, and
  nothing of the target's root file system is used;
* ``LAUNCHER --expect X.Y DIR...`` (in an install step): compile every ``.py`` under the
  directories whose byte code is missing or not of its source, as ``uv pip install
  --compile-bytecode`` does (``compileall.compile_file``, the invalidation mode of
  ``PYC_INVALIDATION_MODE``), side by side on every CPU. Files whose byte code is current (the
  earlier layers') are not written again, so no layer replaces another's.
"""

from __future__ import annotations

import argparse
import compileall
import concurrent.futures
import importlib.util
import multiprocessing
import os
import py_compile
import re
import shlex
import subprocess
import sys
import time

MODES = {mode.name: mode for mode in py_compile.PycInvalidationMode}


def mode_from_env() -> py_compile.PycInvalidationMode:
    """The invalidation mode the Dockerfile sets (``PYC_INVALIDATION_MODE``), as uv reads it."""
    name = os.environ.get("PYC_INVALIDATION_MODE", "CHECKED_HASH")
    if name not in MODES:
        sys.exit(f"bytecode: PYC_INVALIDATION_MODE={name!r} is none of {', '.join(MODES)}")
    return MODES[name]


def current(source: str, mode: py_compile.PycInvalidationMode) -> bool:
    """True when ``source``'s byte code exists and is of this source, in ``mode``."""
    try:
        with open(importlib.util.cache_from_source(source), "rb") as f:
            header = f.read(16)
        with open(source, "rb") as f:
            data = f.read()
    except OSError:
        return False
    if len(header) < 16 or header[:4] != importlib.util.MAGIC_NUMBER:
        return False
    flags = int.from_bytes(header[4:8], "little")
    if mode is py_compile.PycInvalidationMode.TIMESTAMP:
        st = os.stat(source)
        return flags == 0 and header[8:16] == (
            (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
            + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little"))
    checked = mode is py_compile.PycInvalidationMode.CHECKED_HASH
    return flags == (0b11 if checked else 0b01) and header[8:16] == importlib.util.source_hash(data)


def stale(roots: list[str], mode: py_compile.PycInvalidationMode) -> list[str]:
    """Every ``.py`` under ``roots`` whose byte code is missing or not current, sorted."""
    out = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            out += [os.path.join(dirpath, name) for name in filenames
                    if name.endswith(".py") and not current(os.path.join(dirpath, name), mode)]
    return sorted(out)


def _compile(args: tuple[str, py_compile.PycInvalidationMode]) -> bool:
    path, mode = args
    # what uv's compile worker runs for each file (a file that does not compile is skipped,
    # as there: a test module of Python 2, a template)
    return bool(compileall.compile_file(path, force=True, quiet=2, invalidation_mode=mode))


def compile_all(roots: list[str], expect: str) -> int:
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if version != expect:
        sys.exit(f"bytecode: this interpreter is Python {version}, the image's is {expect}: "
                 "byte code is per Python version (base.bytecode_image must have "
                 f"python{expect})")
    missing = [root for root in roots if not os.path.isdir(root)]
    if missing:
        sys.exit(f"bytecode: no such directory: {', '.join(missing)}")
    started, mode = time.monotonic(), mode_from_env()
    todo = stale(roots, mode)
    workers = max(1, min(len(os.sched_getaffinity(0)), 32))
    # fork: a started interpreter (forkserver, spawn) would exec sys.executable, which only
    # runs through the launcher's loader
    with concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("fork")) as pool:
        done = sum(pool.map(_compile, [(path, mode) for path in todo], chunksize=64))
    print(f"bytecode: {done} of {len(todo)} modules compiled by Python {sys.version.split()[0]} "
          f"({os.uname().machine}, {workers} processes) in {time.monotonic() - started:.1f} s "
          f"under {', '.join(roots)}", flush=True)
    return 0


def loader_and_libraries(executable: str) -> tuple[str, list[str]]:
    """The dynamic loader ``executable`` runs with and the directories of its libraries, as
    ``ldd`` lists them (real paths: a symbolic link may be absolute, and would leave the
    mount)."""
    proc = subprocess.run(["ldd", executable], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bytecode: ldd {executable}: {proc.stderr.strip() or proc.returncode}")
    loader, dirs = None, []
    for line in proc.stdout.splitlines():
        linked = re.match(r"\s*\S+ => (/\S+) \(0x", line)
        if linked:
            found = os.path.dirname(os.path.realpath(linked.group(1)))
            dirs += [] if found in dirs else [found]
        elif re.match(r"\s*/\S+ \(0x", line):
            loader = os.path.realpath(line.split()[0])
    if loader is None:
        sys.exit(f"bytecode: ldd names no dynamic loader for {executable}: {proc.stdout!r}")
    here = os.path.dirname(loader)
    return loader, dirs if here in dirs else [*dirs, here]


def write_launcher(path: str, mount: str) -> int:
    """The launcher (see the module's doc) for this interpreter seen under ``mount``."""
    executable = os.path.realpath(sys.executable)
    loader, dirs = loader_and_libraries(executable)
    under = [mount + d for d in dirs]
    script = os.path.join(mount, os.path.abspath(__file__).lstrip("/"))
    command = [mount + loader, "--library-path", ":".join(under), mount + executable,
               "-I", "-S", script]
    with open(path, "w") as f:
        f.write("#!/bin/sh\n# Python {} of {} ({}), run through its own loader from {}\n"
                "exec {} \"$@\"\n".format(sys.version.split()[0], os.uname().machine,
                                           executable, mount, shlex.join(command)))
    os.chmod(path, 0o755)
    print(f"bytecode: {path}: Python {sys.version.split()[0]} ({os.uname().machine}), "
          f"loader {loader}, libraries from {':'.join(dirs)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="compile.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--launcher", metavar="PATH", help="write the launcher here and stop")
    ap.add_argument("--mount", default="/", help="where the install steps mount this stage")
    ap.add_argument("--expect", metavar="X.Y", help="the image's Python version")
    ap.add_argument("roots", nargs="*", help="the directories to compile")
    args = ap.parse_args(argv)
    if args.launcher:
        return write_launcher(args.launcher, args.mount.rstrip("/"))
    if not args.roots or not args.expect:
        ap.error("give --expect X.Y and the directories to compile (or --launcher PATH)")
    return compile_all(args.roots, args.expect)


if __name__ == "__main__":
    sys.exit(main())
