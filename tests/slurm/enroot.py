"""NVIDIA's enroot and pyxis, built for the real-Slurm tests from their source snapshots.

The snapshots (Apache-2.0; ``enroot-src.tar.gz``, its submodules in ``enroot-deps-src.tar.gz``,
``pyxis-src.tar.gz``) live outside the repository, in ``$VERL_ENV_VENDOR_DIR`` or else in
``../shared/vendor`` beside the checkout (CI mounts a read-only copy there); their README says
what was measured building and running them. enroot is ``make install``-ed into a private
prefix, pyxis is built against Debian's Slurm headers (``libslurm-dev``). Each fake node gets a
small ``enroot`` wrapper first on its slurmd's PATH that gives it its own data and runtime
directories (two slurmd on one host would otherwise share one container store); pyxis runs
``enroot`` with slurmd's PATH and drops a job's ``ENROOT_*_PATH`` variables.

The enroot configuration leaves ``ENROOT_LOGIN_SHELL`` at enroot's default (true), as a cluster
may: the generated job must turn the login shell off itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

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
        """plugstack.conf: pyxis required; named containers removed with their job."""
        runtime.mkdir(parents=True, exist_ok=True)
        return f"required {self.pyxis} runtime_path={runtime} container_scope=job\n"


def _make(args: list[str], log: Path) -> None:
    with open(log, "ab") as out:
        proc = subprocess.run(["make", *args], stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"make {' '.join(args)} failed (exit {proc.returncode}); "
                           f"last lines of {log}:\n{log.read_text(errors='replace')[-3000:]}")


def build(work: Path) -> Tools:
    """Unpack and build enroot and pyxis under ``work``; print the timings."""
    src, prefix = work / "src", work / "prefix"
    src.mkdir(parents=True)
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
    return Tools(prefix, src / "pyxis" / "spank_pyxis.so")


def node_path(tools: Tools, store: Path, node: str) -> str:
    """A PATH for ``node``'s slurmd: its enroot wrapper first (own container store)."""
    bindir = store / node / "bin"
    bindir.mkdir(parents=True)
    dirs = {name: store / node / name for name in ("data", "run", "cache", "tmp")}
    for d in dirs.values():
        d.mkdir(mode=0o1777)
        d.chmod(0o1777)
    wrapper = bindir / "enroot"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'export ENROOT_DATA_PATH="{dirs["data"]}/user-$(id -u)"\n'
        f'export ENROOT_RUNTIME_PATH="{dirs["run"]}/user-$(id -u)"\n'
        f'export ENROOT_CACHE_PATH="{dirs["cache"]}/user-$(id -u)"\n'
        f'export ENROOT_TEMP_PATH="{dirs["tmp"]}"\n'
        "export ENROOT_MAX_PROCESSORS=1\n"
        f'exec "{tools.prefix}/bin/enroot" "$@"\n')
    wrapper.chmod(0o755)
    return f"{bindir}:{tools.prefix}/bin:{os.environ.get('PATH', '/usr/bin:/bin')}"
