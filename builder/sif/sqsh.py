"""A verified image as an enroot squashfs (what ``enroot import`` writes), for
``srun --container-image=IMAGE.sqsh`` (pyxis) and ``enroot create``.

Streamed as the native SIF is (:mod:`builder.sif.native`): the engine's ``docker export`` of a
container of the image (layers and whiteouts applied) passes through the overlay of
:mod:`builder.sif.overlay`, here laying enroot's configuration files instead of apptainer's,
into ``mksquashfs - OUT -tar -all-root``. The files are those ``enroot import`` writes
(``docker::configure`` in enroot's ``src/docker.sh``): ``/etc/environment`` (the image's ENV, one
``NAME=VALUE`` a line, which enroot reads at every start), ``/etc/rc`` (working directory,
entrypoint and command), an empty ``/etc/rc.local`` and ``/etc/fstab`` (the image's volumes).

The file is written under a temporary name beside the output, checked (``unsquashfs``: the
superblock and the environment read back), then renamed; a failure leaves nothing behind, a full
disk is named, and two runs of one output take turns (:mod:`builder.sif.placement`).
"""

from __future__ import annotations

import datetime
import os
import shlex
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from builder.gate import verdicts
from builder.engine import ContainerEngine, ImageInfo, interrupts_raise
from builder.errors import SifError
from builder.sif import meta as sif_meta
from builder.sif import native as sif_native
from builder.sif.overlay import Overlay, OverlayError, Piece, file_entry, header
from builder.sif.placement import Need, is_disk_full, mib, placing

REPORT_SCHEMA = "verl-env/sqsh-report/v1"


def enroot_files(config: dict[str, Any] | None, source: str) -> dict[str, tuple[bytes, int]]:
    """The files ``enroot import`` writes into a rootfs, for an image ``Config``."""
    config = config or {}
    env = "".join(f"{line}\n" for line in config.get("Env") or [])
    volumes = "".join(f"${{ENROOT_ROOTFS}}{v} {v} none x-create=dir,bind,rw,nosuid,nodev\n"
                      for v in sorted(config.get("Volumes") or {}))
    labels = "".join("# {} {}\n".format(k, str(v).replace("\n", " "))
                     for k, v in sorted((config.get("Labels") or {}).items()))
    entry = [shlex.quote(w) for w in config.get("Entrypoint") or []]
    cmd = [shlex.quote(w) for w in config.get("Cmd") or []]
    if not entry and not cmd:
        cmd = ["/bin/sh"]
    workdir = shlex.quote(config.get("WorkingDir") or "/")
    rc = (f"# enroot-provenance: {source}\n{labels}" + ("\n" if labels else "") +
          f"mkdir -p {workdir} 2> /dev/null\n"
          f"cd {workdir} && unset OLDPWD || exit 1\n\n"
          "if [ -s /etc/rc.local ]; then\n    . /etc/rc.local\nfi\n\n"
          "if [ $# -gt 0 ]; then\n"
          f"    exec {' '.join(entry)} \"$@\"\n"
          "else\n"
          f"    exec {' '.join(entry + cmd)}\n"
          "fi\n")
    rclocal = ("# This file is sourced by /etc/rc when the container starts.\n"
               "# It can be used to manipulate the entrypoint or the command of the container.\n")
    return {"etc/environment": (env.encode(), 0o644), "etc/fstab": (volumes.encode(), 0o644),
            "etc/rc": (rc.encode(), 0o644), "etc/rc.local": (rclocal.encode(), 0o644)}


class EnrootOverlay(Overlay):
    """The SIF overlay's stream, laying enroot's files (replacing the image's own) instead of
    apptainer's tree."""

    def __init__(self, config: dict[str, Any] | None, source: str, mtime: float) -> None:
        super().__init__(sif_meta.SifMetadata(), mtime)
        self.files = enroot_files(config, source)
        self.links = {}
        self._watched = {"etc"}

    def _appended(self) -> Iterator[Piece]:
        if "etc" not in self.kinds:
            self.kinds["etc"] = tarfile.DIRTYPE
            self.stats.added.append("etc")
            yield header("etc", kind=tarfile.DIRTYPE, mode=0o755, mtime=self.mtime)
        elif self.kinds["etc"] != tarfile.DIRTYPE:
            raise OverlayError("/etc of the image is not a directory; enroot needs one")
        for name, (data, mode) in self.files.items():
            if name not in self.done:
                self.stats.added.append(name)
                yield file_entry(name, data, mode, self.mtime)
        self.stats.arch = self.detect_arch()


COMPRESSIONS = {"gzip": sif_native.GZIP, "lzo": ["-comp", "lzo"], "zstd": ["-comp", "zstd"],
                "none": sif_native.STORED}


def mksquashfs_command(output: Path, compression: str = "gzip") -> list[str]:
    """``mksquashfs`` reading a tar from stdin, every file owned by root (enroot's
    ``-all-root``); gzip by default (readable by squashfuse and the kernel everywhere), ``none``
    the fastest to write (enroot's own default, ``-comp lzo -noD``, leaves data uncompressed)."""
    return ["mksquashfs", "-", str(output), "-tar", "-noappend", "-all-root",
            *COMPRESSIONS[compression], "-root-mode", "755", "-quiet", "-no-progress"]


def build(engine: ContainerEngine, image: ImageInfo, output: Path, *, source: str, workdir: Path,
          compression: str = "gzip") -> dict[str, Any]:
    """Write the enroot squashfs of ``image`` to ``output`` (overwritten)."""
    if image.os != "linux":
        raise SifError(f"image OS is {image.os!r}; enroot runs linux images")
    started = time.monotonic()
    output.unlink(missing_ok=True)
    overlay = EnrootOverlay(dict(image.config), f"dockerd://{source}",
                            datetime.datetime.now().timestamp())
    with engine.export(image.id) as chunks:
        sif_native.run_mksquashfs(mksquashfs_command(output, compression), overlay.stream(chunks),
                                  workdir / "mksquashfs.log")
    return {"seconds": round(time.monotonic() - started, 1), "arch": overlay.stats.arch,
            "replaced": overlay.stats.replaced, "added": overlay.stats.added}


def check(path: Path, config: dict[str, Any] | None) -> None:
    """The squashfs reads back (superblock) and carries the image's environment."""
    proc = subprocess.run(["unsquashfs", "-s", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SifError(f"unsquashfs -s {path}: {proc.stderr.strip()[-500:]}")
    cat = subprocess.run(["unsquashfs", "-cat", str(path), "etc/environment"],
                         capture_output=True)
    want = enroot_files(config, "")["etc/environment"][0]
    if cat.returncode != 0 or cat.stdout != want:
        raise SifError(f"{path}: /etc/environment does not hold the image's ENV "
                       f"({cat.stderr.decode(errors='replace').strip()[-300:]})")


def space_needs(compression: str, image_size: int) -> list[Need]:
    """The squashfs: :func:`builder.sif.native.least_size` to about the image's size."""
    return [Need("output", sif_native.least_size(image_size, compression), image_size,
                 f"the squashfs ({compression}) of a {mib(image_size)} image")]


def convert(engine: ContainerEngine, image: ImageInfo, *, output: Path, source: str,
            target: str | None = None, force: bool = False, compression: str = "gzip",
            tmpdir: Path | None = None) -> dict[str, Any]:
    """Build, check, then atomically place the squashfs. Raises SifError on any failure."""
    if not force and not verdicts.is_verified(image.id):
        raise SifError(f"image {source} ({image.id[7:19]}) has no passing verdict; run "
                       "`build-env verify` on it first, or pass --force", target=target)
    output = output.absolute()
    with interrupts_raise(), placing(output, tmpdir, what=f"sqsh of {source} to {output}",
                                     needs=space_needs(compression, image.size),
                                     target=target) as work:
        try:
            details = build(engine, image, work.partial, source=source, workdir=work.scratch,
                            compression=compression)
        except (RuntimeError, OverlayError) as exc:
            if is_disk_full(exc):
                raise  # placing() names the file system that filled
            raise SifError(str(exc), target=target) from None
        check(work.partial, dict(image.config))
        os.replace(work.partial, output)
    return {"schema": REPORT_SCHEMA, "target": target, "image_id": image.id, "source": source,
            "output": str(output), "size": output.stat().st_size, "build": details}
