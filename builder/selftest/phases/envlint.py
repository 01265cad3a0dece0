"""Environment lint for the multi-node pitfalls (PITFALLS.md #2, #3, #6, #7).

Pure ``lint_*`` functions take the environment and what exists on the machine; ``plan``
probes /sys/class/infiniband, the network interfaces and the HF cache directories.
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
from dataclasses import dataclass
from typing import Mapping

from ..manifest import truthy
from ..phase import Run, Step
from ..report import FAIL, PASS, WARN, Check

PHASE = "env"
APPTAINER_ENV = "/.singularity.d/env/90-environment.sh"


def lint_visible_devices(env: Mapping[str, str]) -> Check:
    """HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES must agree when both are set (Ray and
    verl assert it on ROCm)."""
    cid = "env.hip_cuda_visible_devices"
    hip, cuda = env.get("HIP_VISIBLE_DEVICES"), env.get("CUDA_VISIBLE_DEVICES")
    if hip is not None and cuda is not None and hip.strip() != cuda.strip():
        return Check(cid, PHASE, FAIL, value={"HIP": hip, "CUDA": cuda},
                     reason="HIP_VISIBLE_DEVICES differs from CUDA_VISIBLE_DEVICES "
                            "(Ray and verl require them equal)")
    return Check(cid, PHASE, PASS, reason="consistent or not both set")


def lint_rocr(env: Mapping[str, str], accelerator: str) -> Check:
    """ROCR_VISIBLE_DEVICES under Ray: Ray refuses it on AMD ("Please use
    HIP_VISIBLE_DEVICES instead of ROCR_VISIBLE_DEVICES")."""
    cid = "env.rocr_visible_devices"
    val = env.get("ROCR_VISIBLE_DEVICES")
    if val is None:
        return Check(cid, PHASE, PASS, reason="not set")
    if accelerator == "rocm":
        return Check(cid, PHASE, FAIL, value=val,
                     reason="ROCR_VISIBLE_DEVICES is set: Ray refuses it on AMD GPUs; "
                            "use HIP_VISIBLE_DEVICES (and the same CUDA_VISIBLE_DEVICES)")
    return Check(cid, PHASE, WARN, value=val,
                 reason=f"ROCR_VISIBLE_DEVICES is set on a {accelerator} target (ignored, "
                        "but Ray rejects it on AMD)")


def lint_ray_debug(env: Mapping[str, str]) -> Check:
    """RAY_DEBUG=legacy with RAY_DEBUG_POST_MORTEM: breakpoints never fire (fail); post-mortem
    alone makes a failing task wait for a debugger forever (warn)."""
    cid = "env.ray_debug"
    legacy = env.get("RAY_DEBUG", "").strip().lower() == "legacy"
    post = truthy(env.get("RAY_DEBUG_POST_MORTEM"))
    if legacy and post:
        return Check(cid, PHASE, FAIL, value={"RAY_DEBUG": "legacy", "RAY_DEBUG_POST_MORTEM":
                                              env.get("RAY_DEBUG_POST_MORTEM")},
                     reason="RAY_DEBUG=legacy together with RAY_DEBUG_POST_MORTEM: drop "
                            "the legacy flag")
    if post:
        return Check(cid, PHASE, WARN, value={"RAY_DEBUG_POST_MORTEM":
                                              env.get("RAY_DEBUG_POST_MORTEM")},
                     reason="RAY_DEBUG_POST_MORTEM is set: a failing task waits for a "
                            "debugger forever")
    return Check(cid, PHASE, PASS, reason="no conflicting Ray debugger variables")


@dataclass(frozen=True)
class NcclList:
    """A parsed NCCL device list: ``^`` excludes, ``=`` means exact names (else prefixes)."""

    exclude: bool
    exact: bool
    names: tuple[str, ...]


def parse_nccl_list(value: str) -> NcclList:
    """``"^=mlx5_1:1,mlx5_4"`` → exclude, exact, (mlx5_1, mlx5_4) (ports dropped)."""
    v = value.strip()
    exclude = v.startswith("^")
    v = v[1:] if exclude else v
    exact = v.startswith("=")
    v = v[1:] if exact else v
    names = tuple(n.split(":")[0].strip() for n in v.split(",") if n.strip())
    return NcclList(exclude, exact, names)


def _matches(entry: str, device: str, exact: bool) -> bool:
    return device == entry if exact else device.startswith(entry)


def lint_nccl_list(var: str, value: str | None, available: list[str] | None) -> Check:
    """NCCL_IB_HCA / NCCL_SOCKET_IFNAME must name devices that exist. An include list where
    no entry matches fails (some unmatched: warn); an exclude list that leaves nothing fails."""
    cid = f"env.{var.lower()}"
    if value is None or not value.strip():
        return Check(cid, PHASE, PASS, reason="not set")
    parsed = parse_nccl_list(value)
    devices = sorted(available or [])
    have = ",".join(devices) or "none"
    unmatched = [n for n in parsed.names
                 if not any(_matches(n, d, parsed.exact) for d in devices)]
    if parsed.exclude:
        left = [d for d in devices
                if not any(_matches(n, d, parsed.exact) for n in parsed.names)]
        if not left:
            return Check(cid, PHASE, FAIL, value=value,
                         reason=f"{var}={value} excludes every device (present: {have})")
        return Check(cid, PHASE, PASS, value=value, reason=f"leaves {','.join(left)}")
    if len(unmatched) == len(parsed.names):
        return Check(cid, PHASE, FAIL, value=value,
                     reason=f"{var}={value} names no existing device (present: {have})")
    if unmatched:
        return Check(cid, PHASE, WARN, value=value,
                     reason=f"{var}: {','.join(unmatched)} do not exist (present: {have})")
    return Check(cid, PHASE, PASS, value=value)


DISABLE_VARS = ("NCCL_IB_DISABLE", "NCCL_P2P_DISABLE")


def baked_names(image_env_text: str | None) -> set[str]:
    """Variable names assigned in an image's environment file (apptainer's
    90-environment.sh: ``export NAME=...`` or ``NAME=...`` lines)."""
    if not image_env_text:
        return set()
    return set(re.findall(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=", image_env_text,
                          re.MULTILINE))


def lint_nccl_disable(env: Mapping[str, str], image_env_text: str | None = None) -> Check:
    """NCCL_IB_DISABLE / NCCL_P2P_DISABLE are site settings: baked into the image (seen in
    its environment file) they fail; set in the environment they warn."""
    cid = "env.nccl_disable"
    on = {v: env[v] for v in DISABLE_VARS if truthy(env.get(v))}
    baked = baked_names(image_env_text) & set(DISABLE_VARS)
    if baked:
        return Check(cid, PHASE, FAIL, value=sorted(baked),
                     reason=f"{', '.join(sorted(baked))} baked into the image environment: "
                            "disables IB/P2P on every cluster (site setting only)")
    if on:
        return Check(cid, PHASE, WARN, value=on,
                     reason=f"{', '.join(on)} set: slow collectives; must be a site "
                            "setting, never baked into the image")
    return Check(cid, PHASE, PASS, reason="NCCL_IB_DISABLE/NCCL_P2P_DISABLE not set")


def hf_cache_paths(env: Mapping[str, str], home: str) -> list[tuple[str, str]]:
    """Where Hugging Face writes: HF_HOME (default $XDG_CACHE_HOME/huggingface or
    ~/.cache/huggingface) and HF_HUB_CACHE (default $HF_HOME/hub)."""
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    hf_home = env.get("HF_HOME") or os.path.join(xdg, "huggingface")
    hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or \
        os.path.join(hf_home, "hub")
    return [("HF_HOME", hf_home), ("HF_HUB_CACHE", hub)]


def probe_writable(path: str) -> tuple[bool, str]:
    """Whether ``path`` (or, if it does not exist yet, its nearest existing parent) is
    writable; an existing directory is tested by creating and removing a temp file."""
    if os.path.isdir(path):
        try:
            fd, name = tempfile.mkstemp(prefix=".verl-env-selftest-", dir=path)
            os.close(fd)
            os.unlink(name)
            return True, "exists, writable"
        except OSError as e:
            return False, f"exists, not writable ({e.strerror})"
    if os.path.exists(path):
        return False, "exists but is not a directory"
    parent = os.path.dirname(os.path.abspath(path))
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK):
        return True, f"can be created under {parent}"
    return False, f"cannot be created under {parent}"


def lint_hf_cache(results: list[tuple[str, str, bool, str]]) -> Check:
    """Fail when any HF cache location cannot be written (model loading will fail)."""
    cid = "env.hf_cache"
    bad = [(label, path, detail) for label, path, ok, detail in results if not ok]
    value = {label: path for label, path, _ok, _d in results}
    if bad:
        return Check(cid, PHASE, FAIL, value=value,
                     reason="; ".join(f"{lbl}={p}: {d}" for lbl, p, d in bad)
                            + " (bind a shared writable path and set HF_HOME)")
    return Check(cid, PHASE, PASS, value=value, reason="writable")


def probe_ib_hcas(path: str = "/sys/class/infiniband") -> list[str]:
    """RDMA device names, e.g. mlx5_0."""
    try:
        return os.listdir(path)
    except OSError:
        return []


def probe_ifnames() -> list[str]:
    """Network interface names."""
    try:
        return [name for _i, name in socket.if_nameindex()]
    except OSError:
        return []


def read_image_env(path: str = APPTAINER_ENV) -> str | None:
    """The image's baked environment file, when running from a SIF."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def plan(run: Run) -> list[Step]:
    """The environment lint steps."""
    env, acc = dict(os.environ), run.accelerator

    def hf(r: Run) -> Check:
        paths = hf_cache_paths(env, os.path.expanduser("~"))
        seen: dict[str, tuple[bool, str]] = {}
        results = []
        for label, path in paths:
            if path not in seen:
                seen[path] = probe_writable(path)
            results.append((label, path, *seen[path]))
        return lint_hf_cache(results)

    return [
        Step(("env.hip_cuda_visible_devices",), lambda r: lint_visible_devices(env)),
        Step(("env.rocr_visible_devices",), lambda r: lint_rocr(env, acc)),
        Step(("env.ray_debug",), lambda r: lint_ray_debug(env)),
        Step(("env.nccl_ib_hca",), lambda r: lint_nccl_list(
            "NCCL_IB_HCA", env.get("NCCL_IB_HCA"), probe_ib_hcas())),
        Step(("env.nccl_socket_ifname",), lambda r: lint_nccl_list(
            "NCCL_SOCKET_IFNAME", env.get("NCCL_SOCKET_IFNAME"), probe_ifnames())),
        Step(("env.nccl_disable",), lambda r: lint_nccl_disable(env, read_image_env())),
        Step(("env.hf_cache",), hf),
    ]
