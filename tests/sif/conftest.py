"""Fixtures for the SIF tests: the layered test image and its native SIF (real Docker Engine,
real mksquashfs), tool checks that skip visibly, and a stand-in ``singularity`` for the
apptainer backend."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sif.images import LAYERED_TAG, cached_native_sif, layered_image

SIF_TOOLS = {"mksquashfs": "squashfs-tools", "unsquashfs": "squashfs-tools",
             "siftool": "siftool"}


def need_tools(*names: str) -> None:
    """Skip (visibly) when a host tool the test relies on is missing."""
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        pkgs = sorted({SIF_TOOLS.get(n, n) for n in missing})
        pytest.skip(f"missing {', '.join(missing)} (apt-get install {' '.join(pkgs)})")


@pytest.fixture(scope="session")
def docker_client(docker_host: str) -> Any:
    import docker

    return docker.DockerClient(base_url=docker_host, timeout=600)


@pytest.fixture(scope="session")
def layered(docker_client: Any, debian_base: str) -> Any:
    """The layered test image (built once per session; docker's cache makes rebuilds free)."""
    return layered_image(docker_client, debian_base)


@pytest.fixture(scope="session")
def layered_sif(docker_client: Any, layered: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A native SIF of the layered image (shared with tests/publish)."""
    need_tools("mksquashfs")
    return cached_native_sif(docker_client, LAYERED_TAG,
                             tmp_path_factory.getbasetemp() / "shared-sif", "layers")


@pytest.fixture
def mount_sif(tmp_path: Path) -> Iterator[Any]:
    """Mount a SIF's partition with squashfuse; everything mounted is unmounted at teardown."""
    need_tools("squashfuse")
    if not Path("/dev/fuse").exists():
        pytest.skip("no /dev/fuse for squashfuse")
    mounts: list[Path] = []

    def mount(sif: Path) -> Path:
        from builder.sif import format as sif_format

        part = sif_format.read_info(sif).primary_partition()
        assert part is not None
        mnt = tmp_path / f"mnt{len(mounts)}"
        mnt.mkdir()
        subprocess.run(["squashfuse", "-o", f"offset={part.offset}", str(sif), str(mnt)],
                       check=True)
        mounts.append(mnt)
        return mnt

    try:
        yield mount
    finally:
        for mnt in mounts:
            subprocess.run(["umount", str(mnt)], check=False)
