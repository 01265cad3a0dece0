"""The streaming overlay on synthetic export-like tars (no Docker needed): the ``/.singularity.d``
tree laid over the stream with apptainer's rules, every path once, file data passed on intact
across arbitrary chunk boundaries, PAX and GNU long names, hardlinks to replaced files, the
architecture from ``/bin/sh``, and clear errors on a broken stream."""

from __future__ import annotations

import datetime
import io
import os
import struct
import tarfile
import tempfile

import pytest

from builder.sif import meta as sif_meta
from builder.sif.native import feed
from builder.sif.overlay import Overlay, OverlayError, elf_arch, normalise

WHEN = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)


def export_tar(*entries: tuple, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """("d", name[, mode]) dirs, ("f", name, data[, mode, uid]) files, ("l", name, target)
    symlinks, ("h", name, target) hardlinks; names as ``docker export`` writes them."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for kind, name, *rest in entries:
            info = tarfile.TarInfo(name)
            data = None
            if kind == "d":
                info.type, info.mode = tarfile.DIRTYPE, rest[0] if rest else 0o755
            elif kind == "f":
                data = rest[0] if isinstance(rest[0], bytes) else rest[0].encode()
                info.size, info.mode = len(data), rest[1] if len(rest) > 1 else 0o644
                info.uid = rest[2] if len(rest) > 2 else 0
            elif kind == "l":
                info.type, info.linkname = tarfile.SYMTYPE, rest[0]
            elif kind == "h":
                info.type, info.linkname = tarfile.LNKTYPE, rest[0]
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def run_overlay(data: bytes, chunk: int = 1000):
    """The overlay's output, written exactly as to mksquashfs (``feed``), read back."""
    meta = sif_meta.generate({"Cmd": ["sh"]}, source="t:1", arch="amd64", when=WHEN)
    overlay = Overlay(meta, WHEN.timestamp())
    chunks = [data[i:i + chunk] for i in range(0, len(data), chunk)]
    with tempfile.TemporaryFile() as f:
        written = feed(f.fileno(), overlay.stream(iter(chunks)))
        f.seek(0)
        out = f.read()
    assert written == len(out)
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        members = tar.getmembers()
        contents = {m.name: tar.extractfile(m).read() for m in members  # type: ignore[union-attr]
                    if m.isreg()}
    names = [m.name for m in members]
    assert len(names) == len(set(names)), "a path twice: mksquashfs would keep only one"
    return overlay, {m.name: m for m in members}, names, contents


def _elf(machine: int) -> bytes:
    return b"\x7fELF\x02\x01\x01" + bytes(11) + struct.pack("<H", machine) + bytes(40)


def test_overlay_rules() -> None:
    big = os.urandom(70_000)  # crosses many 1000-byte chunks
    data = export_tar(
        ("f", ".dockerenv", ""), ("d", "dev"), ("f", "dev/console", ""), ("d", "etc"),
        ("f", "etc/hosts", "127.0.0.1 x", 0o600, 5), ("h", "etc/hosts-link", "etc/hosts"),
        ("f", "etc/keep", big), ("d", "var"), ("l", "var/tmp", "/tmp"),
        ("l", "singularity", "elsewhere"),
        ("l", "environment", ".singularity.d/env/90-environment.sh"),
        ("d", ".singularity.d"), ("f", ".singularity.d/runscript", "old"),
        ("f", ".singularity.d/keepme", "mine"), ("d", "tmp", 0o1777))
    overlay, members, names, contents = run_overlay(data)
    hosts = members["etc/hosts"]
    assert contents["etc/hosts"] == b"" and hosts.mode == 0o644 and hosts.uid == 5
    assert contents["etc/hosts-link"] == b"127.0.0.1 x"  # a hardlink to it keeps the old data
    assert contents["etc/resolv.conf"] == b""  # added
    assert contents["etc/keep"] == big
    assert members["var/tmp"].issym() and members["var/tmp"].linkname == "/tmp"
    assert members["singularity"].linkname == ".singularity.d/runscript"
    assert sif_meta.RUN_MARKER in contents[".singularity.d/runscript"].decode().splitlines()
    assert contents[".singularity.d/keepme"] == b"mine"
    assert members["tmp"].mode == 0o1777  # an existing directory stays as it is
    for d in ("proc", "sys", "home", "root", ".singularity.d/libs", ".singularity.d/env"):
        assert members[d].isdir() and members[d].mode == 0o755
    assert ".dockerenv" not in members and "dev/console" not in members
    assert names.index(".singularity.d/runscript") > names.index(".singularity.d")
    st = overlay.stats
    assert st.members == 15 and sorted(st.dropped) == [".dockerenv", "dev/console"]
    assert set(st.replaced) == {"etc/hosts", "singularity", ".singularity.d/runscript"}
    assert 0 < st.bytes_in <= len(data)


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
@pytest.mark.parametrize("chunk", [7, 512, 4096])
def test_long_names_and_chunking(fmt: int, chunk: int) -> None:
    deep = "/".join(["d" * 60] * 4)
    data = export_tar(("d", "a"), ("f", f"a/{'x' * 150}", "long"), ("l", "a/ln", "y" * 150),
                      ("f", "etc/hosts", "h"), ("f", "a/z", os.urandom(3000)), ("d", deep),
                      ("f", f"{deep}/f", "deep"), fmt=fmt)
    _, members, _, contents = run_overlay(data, chunk)
    assert contents[f"a/{'x' * 150}"] == b"long" and members["a/ln"].linkname == "y" * 150
    assert contents[f"{deep}/f"] == b"deep" and contents["etc/hosts"] == b""
    assert len(contents["a/z"]) == 3000


def test_arch_from_bin_sh_through_symlinks() -> None:
    data = export_tar(("l", "bin", "usr/bin"), ("d", "usr"), ("d", "usr/bin"),
                      ("f", "usr/bin/dash", _elf(183), 0o755),
                      ("f", "usr/bin/other", _elf(62), 0o755), ("l", "usr/bin/sh", "dash"))
    overlay, *_ = run_overlay(data)
    assert overlay.stats.arch == "arm64"  # /bin/sh -> usr/bin/sh -> dash, not the first ELF
    overlay, *_ = run_overlay(export_tar(("f", "x", _elf(62), 0o755)))
    assert overlay.stats.arch == "amd64"  # no /bin/sh: the first executable ELF file
    assert elf_arch(b"not elf") is None


def test_directories_under_a_symlink_are_not_added() -> None:
    data = export_tar(("l", "var", "/elsewhere"))
    _, members, *_ = run_overlay(data)
    assert members["var"].issym() and "var/tmp" not in members


def test_broken_streams_are_reported() -> None:
    data = export_tar(("f", "a", "x" * 2000))
    with pytest.raises(OverlayError, match="ends inside a file"):
        run_overlay(data[:1500])
    with pytest.raises(OverlayError, match="without its end marker"):
        run_overlay(data[:512 + 2048])
    bad = bytearray(data)
    bad[148:156] = b"0000000\0"  # checksum
    with pytest.raises(OverlayError, match="bad tar header at byte 0"):
        run_overlay(bytes(bad))


def test_normalise() -> None:
    assert [normalise(n) for n in ("./a/b/", "/a", "a//b", ".", "./")] == [
        "a/b", "a", "a/b", "", ""]
