"""NVIDIA's enroot and pyxis, built for the real-Slurm tests from their source snapshots.

The snapshots (Apache-2.0; ``enroot-src.tar.gz``, its submodules in ``enroot-deps-src.tar.gz``,
``pyxis-src.tar.gz``) live outside the repository, in ``$VERL_ENV_VENDOR_DIR`` or else in
``../shared/vendor`` beside the checkout (CI mounts a read-only copy there); their README says
what was measured building and running them. enroot is ``make install``-ed into a private
prefix, pyxis is built against Debian's Slurm headers (``libslurm-dev``). Each fake node gets a
small ``enroot`` wrapper first on its slurmd's PATH that gives it its own data and runtime
directories (two slurmd on one host would otherwise share one container store); pyxis runs
``enroot`` with slurmd's PATH and drops a job's ``ENROOT_*_PATH`` variables. Tasks get a third
wrapper on their PATH that picks the store by ``$SLURMD_NODENAME``, so that a job's own
``enroot`` calls (the script's clean-up of its named containers) reach the same store.

pyxis keeps its default ``container_scope=global``: with ``container_scope=job`` its epilog runs
``enroot list`` with a fixed PATH (``/usr/local/bin:/usr/bin:/bin``) where this private install is
not, fails, and drains the node; named containers are then removed by the job script itself.

The enroot configuration leaves ``ENROOT_LOGIN_SHELL`` at enroot's default (true), as a cluster
may: the generated job must turn the login shell off itself.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.hostenv import CACHE

CHECKOUT = Path(__file__).resolve().parents[2]
ARCHIVES = ("enroot-src.tar.gz", "enroot-deps-src.tar.gz", "pyxis-src.tar.gz")
BUILD_TOOLS = ("make", "gcc", "mksquashfs", "unsquashfs", "jq", "parallel", "fuse-overlayfs",
               "squashfuse", "curl", "zstd", "pigz")


def vendor_dir() -> Path:
    """Where the snapshots are: $VERL_ENV_VENDOR_DIR, else ../shared/vendor beside the
    checkout."""
    given = os.environ.get("VERL_ENV_VENDOR_DIR")
    return Path(given) if given else CHECKOUT.parent / "shared" / "vendor"


def skip_reason() -> str | None:
    """Why enroot and pyxis cannot be built here, or None."""
    where = vendor_dir()
    missing = [a for a in ARCHIVES if not (where / a).is_file()]
    if missing:
        return (f"enroot/pyxis source snapshots not found in {where} ({', '.join(missing)}); "
                "set VERL_ENV_VENDOR_DIR")
    tools = [t for t in BUILD_TOOLS if shutil.which(t) is None]
    if tools:
        return f"missing for enroot/pyxis: {', '.join(tools)} (scripts/os-packages.sh)"
    if not Path("/usr/include/slurm/spank.h").is_file():
        return "Slurm's spank.h missing (apt-get install libslurm-dev)"
    return None


@dataclass(frozen=True)
class Tools:
    prefix: Path  # enroot's install prefix (bin/enroot)
    pyxis: Path  # spank_pyxis.so

    def plugstack_line(self, runtime: Path) -> str:
        """plugstack.conf: pyxis required, its runtime files under ``runtime``."""
        runtime.mkdir(parents=True, exist_ok=True)
        return f"required {self.pyxis} runtime_path={runtime}\n"


def _make(args: list[str], log: Path) -> None:
    with open(log, "ab") as out:
        proc = subprocess.run(["make", *args], stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"make {' '.join(args)} failed (exit {proc.returncode}); "
                           f"last lines of {log}:\n{log.read_text(errors='replace')[-3000:]}")


def build(work: Path) -> Tools:
    """enroot and pyxis built from the snapshots once per content key (the three archives and
    Slurm's spank.h), under the tests' cache and a lock beside it: the Slurm and the emulated
    group of a whole run share one build. ``work`` holds the build's logs where it ran here."""
    h = hashlib.sha256(Path("/usr/include/slurm/spank.h").read_bytes())
    for archive in ARCHIVES:
        h.update((vendor_dir() / archive).read_bytes())
    home = CACHE / f"enroot-{h.hexdigest()[:12]}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / ".complete").exists():
            shutil.rmtree(home, ignore_errors=True)
            _build(home, work)
            (home / ".complete").write_text(home.name)
    return Tools(home / "prefix", home / "src" / "pyxis" / "spank_pyxis.so")


def _build(home: Path, work: Path) -> None:
    """Unpack and build enroot and pyxis under ``home`` (logs in ``work``); print the timings."""
    src, prefix = home / "src", home / "prefix"
    src.mkdir(parents=True)
    work.mkdir(parents=True, exist_ok=True)
    where = vendor_dir()
    start = time.monotonic()
    subprocess.run(["tar", "-xzf", str(where / "enroot-src.tar.gz"), "-C", str(src)], check=True)
    subprocess.run(["tar", "-xzf", str(where / "enroot-deps-src.tar.gz"), "-C",
                    str(src / "enroot" / "deps")], check=True)
    subprocess.run(["tar", "-xzf", str(where / "pyxis-src.tar.gz"), "-C", str(src)], check=True)
    jobs = f"-j{min(4, os.cpu_count() or 1)}"
    _make(["-C", str(src / "enroot"), jobs, "install", f"prefix={prefix}"], work / "enroot.log")
    built = time.monotonic()
    _make(["-C", str(src / "pyxis"), jobs], work / "pyxis.log")
    print(f"TIMING enroot build {built - start:.1f}s, pyxis build {time.monotonic() - built:.1f}s")


def _wrapper(tools: Tools, bindir: Path, node_dir: str) -> None:
    bindir.mkdir(parents=True)
    wrapper = bindir / "enroot"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'd="{node_dir}"\n'
        'export ENROOT_DATA_PATH="$d/data/user-$(id -u)"\n'
        'export ENROOT_RUNTIME_PATH="$d/run/user-$(id -u)"\n'
        'export ENROOT_CACHE_PATH="$d/cache/user-$(id -u)"\n'
        'export ENROOT_TEMP_PATH="$d/tmp"\n'
        "export ENROOT_MAX_PROCESSORS=1\n"
        f'exec "{tools.prefix}/bin/enroot" "$@"\n')
    wrapper.chmod(0o755)


def node_path(tools: Tools, store: Path, node: str) -> str:
    """A PATH for ``node``'s slurmd: its enroot wrapper first (own container store)."""
    for name in ("data", "run", "cache", "tmp"):
        (store / node / name).mkdir(parents=True, mode=0o1777)
        (store / node / name).chmod(0o1777)
    _wrapper(tools, store / node / "bin", str(store / node))
    return f"{store / node / 'bin'}:{tools.prefix}/bin:{os.environ.get('PATH', '/usr/bin:/bin')}"


def task_bin(tools: Tools, store: Path) -> Path:
    """A directory for the tasks' PATH: ``enroot`` on the store of ``$SLURMD_NODENAME``."""
    _wrapper(tools, store / "task-bin", f"{store}/${{SLURMD_NODENAME:?}}")
    return store / "task-bin"


def containers(store: Path) -> list[str]:
    """The enroot containers left in every node's store."""
    return sorted(str(p.relative_to(store)) for p in store.glob("node*/data/*/*"))
