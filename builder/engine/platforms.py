"""Architectures and platforms, and QEMU user emulation for foreign-platform builds and runs:
the functions, and :class:`Platforms`, the engine's part that asks the daemon."""

from __future__ import annotations

import os
from pathlib import Path

import docker.errors
import requests

from builder.engine.client import Daemon
from builder.errors import EngineError

_PLATFORMS = {"x86_64": "linux/amd64", "amd64": "linux/amd64",
              "aarch64": "linux/arm64", "arm64": "linux/arm64"}

BINFMT_DIR = "/proc/sys/fs/binfmt_misc"
# QEMU's binfmt_misc handler name per platform architecture (qemu-user-static's names).
_QEMU = {"arm64": "aarch64", "amd64": "x86_64"}
EMULATION_PACKAGES = "qemu-user-static binfmt-support"


def emulation_problem(platform: str, binfmt_dir: str = BINFMT_DIR) -> str | None:
    """Why this machine cannot run ``platform`` binaries under QEMU user emulation, or None.

    What Docker needs: binfmt_misc mounted, the ``qemu-<arch>`` handler registered and enabled,
    with the F (fix-binary) flag, so that the interpreter is opened at registration and works
    inside containers, whose root filesystem does not hold it.
    """
    arch = platform_of(platform).split("/", 1)[1]
    qemu = f"qemu-{_QEMU.get(arch, arch)}"
    install = (f"apt-get install {EMULATION_PACKAGES}, then `mount -t binfmt_misc binfmt_misc "
               f"{binfmt_dir}` (if not mounted) and `update-binfmts --enable {qemu}`")
    if not os.path.exists(os.path.join(binfmt_dir, "status")):
        return f"binfmt_misc is not mounted at {binfmt_dir}: {install}"
    handler = os.path.join(binfmt_dir, qemu)
    try:
        text = Path(handler).read_text()
    except OSError:
        return f"no QEMU binfmt_misc handler {handler} for {platform_of(platform)}: {install}"
    lines = text.splitlines()
    if not lines or lines[0].strip() != "enabled":
        return f"the QEMU handler {handler} is disabled: {install}"
    flags = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("flags:")), "")
    if "F" not in flags:
        shown = flags or "none"
        return (f"the QEMU handler {handler} lacks the F (fix-binary) flag (flags: {shown}), so "
                f"its interpreter is not found inside containers: re-register it with "
                f"qemu-user-static's binfmt file (update-binfmts --import {qemu})")
    return None


def platform_of(arch_or_platform: str) -> str:
    """``x86_64`` -> ``linux/amd64``, ``arm64``/``aarch64`` -> ``linux/arm64``; platforms pass."""
    if "/" in arch_or_platform:
        return arch_or_platform
    try:
        return _PLATFORMS[arch_or_platform]
    except KeyError:
        raise EngineError(f"unknown architecture {arch_or_platform!r} "
                          f"(known: {', '.join(sorted(_PLATFORMS))})") from None


class Platforms:
    """The daemon's platform and emulation on its host (a part of
    :class:`builder.engine.Engine`)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def require_emulation(self, platform: str, *, target: str | None = None) -> None:
        """Before a foreign-platform build or run: raise EngineError naming what to install when
        the kernel cannot run ``platform`` binaries. Only a local daemon's kernel can be checked
        from here; a remote engine host fails its first foreign RUN step with "exec format
        error", which the build explains the same way."""
        if not self.daemon.is_local():
            return
        why = emulation_problem(platform)
        if why:
            raise EngineError(f"cannot build or run {platform_of(platform)} images on this "
                              f"{self.daemon_platform()} host without QEMU emulation: {why}",
                              target=target)

    def daemon_platform(self) -> str:
        """The daemon's own platform (``linux/amd64``)."""
        version = self.daemon.client.version()
        return f"{version.get('Os', 'linux')}/{platform_of(version.get('Arch', 'amd64'))[6:]}"

    def daemon_arch(self) -> str:
        """The engine host's CPU architecture as the daemon reports it (``x86_64``, ``aarch64``)."""
        try:
            return str(self.daemon.client.info().get("Architecture") or "")
        except (docker.errors.APIError, requests.RequestException) as exc:
            raise EngineError(f"cannot query the Docker Engine: {exc}") from None
