"""Real wheels for the device-code tests: NVIDIA's nvcc and cuobjdump, a CUDA library and a ROCm
library, downloaded once with pip by exact version and sha256 into a cache that survives runs
(``/var/tmp/verl-env-wheels``, or ``$VERL_ENV_WHEEL_CACHE``) and unpacked beside it.

``fetch`` raises :class:`IndexUnreachable` only when pip could not reach the package index (the
tests then skip with that reason); any other failure, a wrong hash included, is an error.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import subprocess
import sys
import zipfile
from collections.abc import Collection
from pathlib import Path

CACHE = Path(os.environ.get("VERL_ENV_WHEEL_CACHE", "/var/tmp/verl-env-wheels"))

# name -> (version, wheel file name, sha256). x86_64 Linux wheels.
WHEELS: dict[str, tuple[str, str, str]] = {
    "nvidia-cuda-nvcc": ("13.5.37", "nvidia_cuda_nvcc-13.5.37-py3-none-manylinux2014_x86_64."
                         "manylinux_2_17_x86_64.whl",
                         "f5c4f7ead5d964fb4af42bbf1e6d3ec3c1e6e9d83b53749f691d387e7fcaa3a7"),
    "nvidia-nvvm": ("13.5.37", "nvidia_nvvm-13.5.37-py3-none-manylinux2010_x86_64."
                    "manylinux_2_12_x86_64.whl",
                    "c41bfa362e407405163f103c2229f0765f8cc2ed7d148b754dc77f228bf7e070"),
    "nvidia-cuda-runtime": ("13.5.37", "nvidia_cuda_runtime-13.5.37-py3-none-manylinux2014_"
                            "x86_64.manylinux_2_17_x86_64.whl",
                            "df2b79a8852f10d1fef8c848489c49eebb5754051bf870202a862831412b179d"),
    "nvidia-cuda-crt": ("13.5.37", "nvidia_cuda_crt-13.5.37-py3-none-manylinux2014_x86_64."
                        "manylinux_2_17_x86_64.whl",
                        "e898b7f73d3035fa89915a3f7bf3b54a73e90249746111aed295822c4729bb29"),
    "nvidia-cuda-cuobjdump": ("13.5.37", "nvidia_cuda_cuobjdump-13.5.37-py3-none-manylinux2014_"
                              "x86_64.manylinux_2_17_x86_64.whl",
                              "38780fee50863252a0b8926357faa91615ca1c8346490563f33a06100cd73f58"),
    "nvidia-curand": ("10.4.5.25", "nvidia_curand-10.4.5.25-py3-none-manylinux_2_27_x86_64.whl",
                      "22bb226a857e5888fe6b54ae465fc4371296bcff13a35f79e19691bcf454f529"),
    "jax-rocm7-pjrt": ("0.12.0", "jax_rocm7_pjrt-0.12.0-py3-none-manylinux_2_27_x86_64.whl",
                       "4551d0714523355f2946ca1958c3f584e95661e467a641d36b726f718a1c7934"),
}
NVCC_WHEELS = ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-runtime", "nvidia-cuda-crt",
               "nvidia-cuda-cuobjdump")
_OFFLINE = ("Could not fetch URL", "NewConnectionError", "Max retries exceeded",
            "Temporary failure in name resolution", "Network is unreachable",
            "Connection refused", "ConnectTimeout", "ReadTimeout", "ProxyError")


class IndexUnreachable(Exception):
    """pip could not reach the package index."""


def supported() -> str | None:
    """Why these wheels cannot be used on this machine (None: they can)."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return (f"the pinned wheels are for x86_64 Linux, this is "
                f"{sys.platform}/{platform.machine()}")
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(name: str) -> Path:
    """The wheel file, downloaded into the cache on first use and checked against its hash."""
    version, filename, sha = WHEELS[name]
    return download(name, version, {sha}, pattern=filename)


def download(name: str, version: str, hashes: Collection[str], *, pattern: str,
             platform_tag: str | None = None) -> Path:
    """``name==version`` as a wheel in the cache (pip, once, under a lock; ``platform_tag``:
    pip's ``--platform``), the file matching ``pattern``, whose sha256 must be one of
    ``hashes`` (a wrong file is removed). :class:`IndexUnreachable` only when pip could not
    reach the index."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not sorted(CACHE.glob(pattern)):
            plat = ["--platform", platform_tag] if platform_tag else []
            proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                                   "--only-binary", ":all:", *plat, "-d", str(CACHE),
                                   f"{name}=={version}"], capture_output=True, text=True)
            if proc.returncode != 0:
                out = proc.stdout + proc.stderr
                if any(s in out for s in _OFFLINE):
                    raise IndexUnreachable(f"pip download {name}=={version}: package index "
                                           f"unreachable ({out.strip().splitlines()[-1]})")
                raise RuntimeError(f"pip download {name}=={version} failed: {out[-1500:]}")
        found = sorted(CACHE.glob(pattern))
        if not found:
            raise RuntimeError(f"pip download {name}=={version} did not produce {pattern}")
        wheel = found[0]
        got = _sha256(wheel)
        if got not in hashes:
            wheel.unlink()
            raise RuntimeError(f"{wheel.name}: sha256 {got}, expected one of {sorted(hashes)}")
    return wheel


def unpack(names: tuple[str, ...], into: str) -> Path:
    """Unpack the wheels ``names`` (fetched first) into one cached tree ``CACHE/into``
    (executables keep their mode); done once, marked complete."""
    dest = CACHE / into
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{into}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        key = ",".join(WHEELS[n][2] for n in names)
        marker = dest / ".complete"
        if marker.exists() and marker.read_text() == key:
            return dest
        for n in names:
            with zipfile.ZipFile(fetch(n)) as z:
                for info in z.infolist():
                    path = Path(z.extract(info, dest))
                    mode = info.external_attr >> 16
                    if mode & 0o111 or "/bin/" in info.filename:
                        path.chmod(0o755)
        marker.write_text(key)
    return dest
