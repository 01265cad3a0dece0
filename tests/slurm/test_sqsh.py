"""``build-env sqsh``'s stream (builder/sif/sqsh.py) on a small synthetic export: enroot's files
laid over the rootfs, the image's own replaced, export-only entries dropped, a real
``mksquashfs`` writing it and ``unsquashfs`` reading it back. The whole command on the fixture
image, run by real pyxis + enroot, is in test_sbatch_real.py."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from builder.sif import sqsh

CONFIG = {"Env": ["PATH=/opt/venv/bin:/usr/bin:/bin", "PYTHONPATH=/opt/verl-env",
                  "NOTE=it's $HOME"],
          "Entrypoint": ["/usr/bin/tini", "--"], "Cmd": ["python3", "-c", "print('hi there')"],
          "WorkingDir": "/work dir", "Volumes": {"/data": {}},
          "Labels": {"org.opencontainers.image.title": "verl\nenv"}}


def _export() -> bytes:
    """A small `docker export`-like tar: the image's own /etc/environment, a shell, .dockerenv."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data, kind in (("etc", b"", tarfile.DIRTYPE),
                                 ("etc/environment", b"LANG=C\n", tarfile.REGTYPE),
                                 ("bin", b"", tarfile.DIRTYPE),
                                 ("bin/sh", b"\x7fELF" + bytes(60), tarfile.REGTYPE),
                                 (".dockerenv", b"", tarfile.REGTYPE)):
            info = tarfile.TarInfo(name)
            info.type, info.size, info.uid = kind, len(data), 1000
            info.mode = 0o755 if kind == tarfile.DIRTYPE or name == "bin/sh" else 0o644
            tar.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


def test_enroot_files_as_enroot_import_writes_them() -> None:
    files = sqsh.enroot_files(CONFIG, "dockerd://verl-env:cpu")
    env = files["etc/environment"][0].decode()
    assert env == "PATH=/opt/venv/bin:/usr/bin:/bin\nPYTHONPATH=/opt/verl-env\nNOTE=it's $HOME\n"
    assert files["etc/fstab"][0] == (b"${ENROOT_ROOTFS}/data /data none "
                                     b"x-create=dir,bind,rw,nosuid,nodev\n")
    rc = files["etc/rc"][0].decode()
    assert rc.startswith("# enroot-provenance: dockerd://verl-env:cpu\n"
                         "# org.opencontainers.image.title verl env\n")
    assert "cd '/work dir' && unset OLDPWD || exit 1" in rc
    assert "exec /usr/bin/tini -- \"$@\"" in rc
    assert "exec /usr/bin/tini -- python3 -c 'print('\"'\"'hi there'\"'\"')'" in rc
    assert subprocess.run(["sh", "-n"], input=rc, text=True).returncode == 0
    bare = sqsh.enroot_files({}, "x")["etc/rc"][0].decode()
    assert "exec /bin/sh" in bare  # no entrypoint, no command: a shell, as enroot does


@pytest.mark.skipif(shutil.which("mksquashfs") is None or shutil.which("unsquashfs") is None,
                    reason="squashfs-tools missing (apt-get install squashfs-tools)")
@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_stream_into_a_real_squashfs(compression: str, tmp_path: Path) -> None:
    data = _export()
    overlay = sqsh.EnrootOverlay(CONFIG, "dockerd://x", 1_700_000_000)
    out = tmp_path / "image.sqsh"
    chunks = [data[i:i + 700] for i in range(0, len(data), 700)]  # headers split across chunks
    from builder.sif import native

    native.run_mksquashfs(sqsh.mksquashfs_command(out, compression), overlay.stream(chunks),
                          tmp_path / "log")
    sqsh.check(out, CONFIG)  # superblock and /etc/environment read back
    listing = subprocess.run(["unsquashfs", "-lln", str(out)], capture_output=True, text=True,
                             check=True).stdout
    names = {line.split()[-1].removeprefix("squashfs-root") for line in listing.splitlines()
             if "squashfs-root" in line}
    assert {"/etc/environment", "/etc/rc", "/etc/rc.local", "/etc/fstab", "/bin/sh"} <= names
    assert "/.dockerenv" not in names
    assert all(line.split()[1] == "0/0" for line in listing.splitlines()
               if "squashfs-root" in line)  # -all-root
    assert overlay.stats.replaced == ["etc/environment"] and overlay.stats.arch is None
    assert sorted(overlay.stats.added) == ["etc/fstab", "etc/rc", "etc/rc.local"]
    with pytest.raises(Exception, match="does not hold the image's ENV"):
        sqsh.check(out, {"Env": ["OTHER=1"]})
