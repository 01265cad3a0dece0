"""Small real images for the SIF and publish tests, built from the debootstrap base (a 4 MB
``FROM scratch`` stage holding dash and a few coreutils copied out of it, so that conversions
take a second).

``LAYERED`` exercises every flattening rule in real overlay2 layers (the engine applies them when
it exports; the tests check the SIF holds the result): a deleted file and
directory (``.wh.NAME``), a directory emptied and refilled in one layer (``.wh..wh..opq``), a
directory replaced by a file, a file re-created after its deletion, a hardlink whose original is
overwritten later (the link must keep the old content), mode and owner changes, and an ENV,
ENTRYPOINT, CMD and LABEL set with characters that need escaping.
"""

from __future__ import annotations

import fcntl
import io
import os
import tarfile
from pathlib import Path
from typing import Any

from builder.sif.overlay import normalise

LAYERED_TAG = "verl-env-test/sif-layers:1"
# A 4 MB image from the debootstrap base: dash as /bin/sh and the few tools the layers use.
MINI = """\
FROM {base} AS src
FROM scratch
COPY --from=src /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 /lib64/ld-linux-x86-64.so.2
COPY --from=src /usr/lib/x86_64-linux-gnu/libc.so.6 /usr/lib/x86_64-linux-gnu/libselinux.so.1 \\
     /usr/lib/x86_64-linux-gnu/libpcre2-8.so.0 /lib/x86_64-linux-gnu/
COPY --from=src /usr/bin/dash /bin/sh
COPY --from=src /usr/bin/rm /usr/bin/mkdir /usr/bin/ln /usr/bin/chmod /usr/bin/chown \\
     /usr/bin/cat /usr/bin/env /usr/bin/echo /usr/bin/true /bin/
"""
LAYERED = MINI + """\
RUN mkdir -p /data/keep /data/gone /data/opaque/sub /data/replaced \\
 && echo keep > /data/keep/a && echo gone > /data/gone/b && echo old > /data/opaque/old \\
 && echo old > /data/opaque/sub/deep && echo f > /data/replaced/child && echo x > /data/deleted \\
 && echo orig > /data/h1 && ln /data/h1 /data/h2 && ln -s keep/a /data/symlink \\
 && echo over > /data/overwritten && chmod 0700 /data/keep && chown 1234:4321 /data/keep/a
RUN rm -rf /data/gone /data/deleted /data/opaque && mkdir -p /data/opaque \\
 && echo new > /data/opaque/new && rm -rf /data/replaced && echo now-a-file > /data/replaced \\
 && echo newer > /data/overwritten && echo changed > /data/h1 && chmod 0750 /data/keep
RUN echo again > /data/deleted && rm -f /bin/true
ENV GREETING="hello \\"world\\" \\$HOME it's" PLAIN=1 EMPTY=
LABEL org.example.tricky="<a&b>" org.verl-env.pin.demo="1.0" org.verl-env.target="layers"
ENTRYPOINT ["/bin/echo", "it's"]
CMD ["default arg"]
"""
# What the flattened /data must hold (path -> content), and what must be gone.
EXPECTED_FILES = {"data/keep/a": "keep\n", "data/opaque/new": "new\n",
                  "data/replaced": "now-a-file\n", "data/deleted": "again\n",
                  "data/overwritten": "newer\n", "data/h1": "changed\n", "data/h2": "orig\n"}
EXPECTED_GONE = ["data/gone", "data/gone/b", "data/opaque/old", "data/opaque/sub",
                 "data/opaque/sub/deep", "data/replaced/child", "bin/true"]
# Entries the native build adds to the image tree (apptainer's /.singularity.d and friends).
ADDED = {".singularity.d", ".singularity.d/Singularity", ".singularity.d/actions",
         ".singularity.d/actions/exec", ".singularity.d/actions/run",
         ".singularity.d/actions/shell", ".singularity.d/actions/start",
         ".singularity.d/actions/test", ".singularity.d/env", ".singularity.d/env/01-base.sh",
         ".singularity.d/env/10-docker2singularity.sh", ".singularity.d/env/90-environment.sh",
         ".singularity.d/env/94-appsbase.sh", ".singularity.d/env/95-apps.sh",
         ".singularity.d/env/99-base.sh", ".singularity.d/env/99-runtimevars.sh",
         ".singularity.d/labels.json", ".singularity.d/libs", ".singularity.d/runscript",
         ".singularity.d/startscript", ".exec", ".run", ".shell", ".test", "environment",
         "singularity"}
# Entries `docker export` adds or rewrites (the container's init layer), never in the image.
EXPORT_ONLY = {".dockerenv", "etc/mtab", "dev/pts", "dev/shm"}
EXPORT_REWRITES = {"etc/hosts", "etc/hostname", "etc/resolv.conf", "dev/console"}


def build_image(client: Any, dockerfile: str, tag: str) -> Any:
    """Build a Dockerfile (no context files) with the SDK; raises with the log on failure."""
    import docker.errors

    try:
        image, _ = client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag,
                                       rm=True, forcerm=True, network_mode="none", pull=False)
    except docker.errors.BuildError as exc:
        log = "".join(str(x.get("stream", x)) for x in exc.build_log)
        raise RuntimeError(f"test image build failed: {exc}\n{log[-2000:]}") from None
    return image


def layered_image(client: Any, base: str) -> Any:
    return build_image(client, LAYERED.format(base=base), LAYERED_TAG)


def tree_of(tar: tarfile.TarFile) -> dict[str, tuple[str, int, int, int, str]]:
    """path -> (kind, mode, uid, gid, link target) of a tar, with export-style names."""
    out = {}
    for m in tar:
        name = normalise(m.name)
        if not name:
            continue
        kind = "d" if m.isdir() else "l" if m.issym() else "h" if m.islnk() else (
            "f" if m.isreg() else "o")
        out[name] = (kind, m.mode & 0o7777, m.uid, m.gid, m.linkname if m.issym() else "")
    return out


def export_tree(client: Any, ref: str) -> dict[str, tuple[str, int, int, int, str]]:
    """The image's filesystem as ``docker export`` of a (never started) container shows it."""
    container = client.containers.create(ref, ["true"])
    try:
        data = b"".join(container.export(chunk_size=1 << 20))
    finally:
        container.remove(force=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tree_of(tar)


def cached_native_sif(client: Any, ref: str, directory: Path, name: str) -> Path:
    """A native SIF of ``ref`` built once per test session (shared by tests/sif and
    tests/publish through the session's base temp dir; a file lock serialises builders)."""
    from builder.engine import Engine
    from builder.sif import native as sif_native

    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f"{name}.sif"
    with open(directory / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            work = sif_native.scratch_dir(out, None)
            partial = out.with_suffix(".partial")
            try:
                engine = Engine(client)
                sif_native.build(engine, engine.image(ref), partial, source=ref, workdir=work)
                os.replace(partial, out)
            finally:
                partial.unlink(missing_ok=True)
                import shutil

                shutil.rmtree(work, ignore_errors=True)
    return out
