"""Flattening rules on synthetic ``docker save`` streams (no Docker needed): OCI whiteouts, the
same-layer rule, hardlinks, directory metadata, both save formats and compressed layers, and the
``/.singularity.d`` overlay. The merged tar is produced exactly as for mksquashfs (spool ranges
through ``sendfile``) and read back with ``tarfile``."""

from __future__ import annotations

import datetime
import gzip
import hashlib
import io
import json
import struct
import tarfile
from pathlib import Path

import pytest

from builder import sif_meta
from builder.sif_layers import Spool, flatten, read_saved
from builder.sif_native import detect_arch, feed, pieces, singularity_tree

Entry = tuple  # (name, kind, content-or-target, mode, uid)


def layer(*entries: Entry) -> bytes:
    """A layer tar: ("d", name, mode) dirs, ("f", name, data) files, ("l", name, target)
    symlinks, ("h", name, target) hardlinks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for kind, name, value, *rest in entries:
            info = tarfile.TarInfo(name)
            info.mode = rest[0] if rest else (0o755 if kind == "d" else 0o644)
            info.uid = rest[1] if len(rest) > 1 else 0
            data = None
            if kind == "d":
                info.type = tarfile.DIRTYPE
            elif kind == "f":
                data = value if isinstance(value, bytes) else value.encode()
                info.size = len(data)
            elif kind == "l":
                info.type, info.linkname = tarfile.SYMTYPE, value
            elif kind == "h":
                info.type, info.linkname = tarfile.LNKTYPE, value
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _tar(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


CONFIG = {"architecture": "amd64", "os": "linux", "config": {"Cmd": ["/bin/sh"]}}


def legacy_save(layers: list[bytes], *, duplicate_last: bool = False) -> bytes:
    """The docker < 25 form: <id>/layer.tar dirs in an unrelated (reversed) order."""
    ids = [hashlib.sha256(b"%d" % i).hexdigest() for i in range(len(layers))]
    files = {f"{i}/layer.tar": data for i, data in reversed(list(zip(ids, layers)))}
    links = {}
    if duplicate_last:  # docker save links a repeated layer to its first copy
        ids.append("f" * 64)
        links[f"{ids[-1]}/layer.tar"] = f"../{ids[0]}/layer.tar"
    files["cfg.json"] = json.dumps(CONFIG).encode()
    files["manifest.json"] = json.dumps([{"Config": "cfg.json", "RepoTags": ["t:1"],
                                          "Layers": [f"{i}/layer.tar" for i in ids]}]).encode()
    return _tar(files, links)


def oci_save(layers: list[bytes], *, compress: bool = False) -> bytes:
    """The docker >= 25 form: an OCI layout (index.json -> manifest -> blobs)."""
    blobs: dict[str, bytes] = {}

    def put(data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[f"blobs/sha256/{digest[7:]}"] = data
        return digest

    media = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if compress else "")
    layer_descs = [{"mediaType": media, "digest": put(gzip.compress(d) if compress else d),
                    "size": 0} for d in layers]
    manifest = {"schemaVersion": 2, "config": {"digest": put(json.dumps(CONFIG).encode())},
                "layers": layer_descs}
    index = {"schemaVersion": 2, "manifests": [{"digest": put(json.dumps(manifest).encode())}]}
    return _tar({**blobs, "index.json": json.dumps(index).encode(),
                 "oci-layout": b'{"imageLayoutVersion":"1.0.0"}'})


def merged(tmp_path: Path, save: bytes, extra: bool = False):
    """Flatten a save stream; return (tree, members of the merged tar by name, contents)."""
    spool = Spool(iter([save[i:i + 1000] for i in range(0, len(save), 1000)]), tmp_path / "spool")
    try:
        saved = read_saved(spool)
        tree = flatten(spool, saved)
        gen = []
        if extra:
            meta = sif_meta.generate({"Cmd": ["sh"]}, source="t:1", arch="amd64",
                                     when=datetime.datetime.now(datetime.timezone.utc))
            gen = singularity_tree(tree, meta, 0)
        out = tmp_path / "merged.tar"
        with open(out, "wb") as f:
            feed(f.fileno(), spool.fd, pieces(tree, gen))
        arch = detect_arch(tree, spool)
    finally:
        spool.close()
    names, contents = [], {}
    with tarfile.open(out) as tar:
        members = tar.getmembers()
        for m in members:
            names.append(m.name)
            if m.isreg():
                contents[m.name] = tar.extractfile(m).read()  # type: ignore[union-attr]
    return tree, {m.name: m for m in members}, names, contents, arch, saved


BASE = layer(("d", "etc", None), ("f", "etc/keep", "k"), ("d", "o", None), ("f", "o/a", "a"),
             ("d", "o/sub", None), ("f", "o/sub/b", "b"), ("d", "d", None), ("f", "d/x", "x1"),
             ("f", "d/y", "y"), ("d", "gone", None), ("f", "gone/z", "z"),
             ("d", "p", None, 0o755), ("f", "p/c", "c"), ("f", "h1", "orig"), ("h", "h2", "h1"),
             ("f", "k1", "kept"), ("h", "k2", "k1"), ("d", "todir", None),
             ("f", "todir/child", "c"), ("f", "tofile", "f"))
UPPER = layer(("f", "d/x", "x2"), ("f", "d/.wh.x", ""),  # whiteout after an entry: entry wins
              ("f", "d/.wh.y", ""), ("f", ".wh.gone", ""),
              ("d", "o", None), ("f", "o/new", "n"), ("f", "o/.wh..wh..opq", ""),
              ("d", "p", None, 0o700), ("f", "h1", "changed"), ("f", "todir", "now a file"),
              ("d", "tofile", None), ("f", "tofile/inside", "i"), ("f", ".wh..wh.plnk", ""))


@pytest.mark.parametrize("fmt", ["legacy", "oci", "oci-gzip"])
def test_whiteouts_and_merge(tmp_path: Path, fmt: str) -> None:
    save = {"legacy": lambda: legacy_save([BASE, UPPER]),
            "oci": lambda: oci_save([BASE, UPPER]),
            "oci-gzip": lambda: oci_save([BASE, UPPER], compress=True)}[fmt]()
    tree, members, names, contents, _, saved = merged(tmp_path, save)
    assert saved.format == ("docker-legacy" if fmt == "legacy" else "oci-layout")
    assert contents["d/x"] == b"x2"  # same-layer entry survives its whiteout
    assert "d/y" not in members and "gone" not in members and "gone/z" not in members
    assert contents["o/new"] == b"n" and "o/a" not in members and "o/sub" not in members
    assert "o" in members  # the opaque directory itself stays
    assert not any(".wh." in n for n in names)
    assert contents["todir"] == b"now a file" and "todir/child" not in members
    assert members["tofile"].isdir() and contents["tofile/inside"] == b"i"
    # a hardlink whose original was overwritten keeps the old content (as a copy)
    assert contents["h1"] == b"changed" and contents["h2"] == b"orig"
    # a hardlink whose original survives stays a hardlink
    assert members["k2"].islnk() and members["k2"].linkname == "k1"
    # directory metadata from the upper layer, position of the first appearance
    assert members["p"].mode == 0o700 and names.index("p") < names.index("p/c")
    assert len(names) == len(set(names))  # mksquashfs keeps the first duplicate: none allowed
    assert tree.whiteouts == 5


def test_duplicate_layer_link_and_root_entry(tmp_path: Path) -> None:
    base = layer(("d", "./", None, 0o700), ("f", "a", "1"))
    tree, members, *_ = merged(tmp_path, legacy_save([base, layer(("f", "b", "2"))],
                                                     duplicate_last=True))
    assert tree.root is not None and tree.root.mode == 0o700
    assert set(members) == {"a", "b"}


def _elf(machine: int) -> bytes:
    return b"\x7fELF\x02\x01\x01" + bytes(11) + struct.pack("<H", machine) + bytes(40)


def test_arch_from_bin_sh_through_symlinks(tmp_path: Path) -> None:
    base = layer(("d", "usr", None), ("d", "usr/bin", None), ("l", "bin", "usr/bin"),
                 ("f", "usr/bin/dash", _elf(183), 0o755), ("l", "usr/bin/sh", "/usr/bin/dash"),
                 ("f", "usr/bin/other", _elf(62), 0o755))
    *_, arch, _ = merged(tmp_path, legacy_save([base]))
    assert arch == "arm64"  # /bin/sh -> usr/bin/sh -> /usr/bin/dash, not the first ELF found


def test_singularity_overlay(tmp_path: Path) -> None:
    base = layer(("d", "etc", None), ("f", "etc/hosts", "127.0.0.1 x", 0o600, 5),
                 ("d", "var", None), ("l", "var/tmp", "/tmp"), ("l", "singularity", "elsewhere"),
                 ("l", "environment", ".singularity.d/env/90-environment.sh"),
                 ("d", ".singularity.d", None), ("f", ".singularity.d/runscript", "old"),
                 ("f", ".singularity.d/keepme", "mine"))
    tree, members, names, contents, *_ = merged(tmp_path, legacy_save([base]), extra=True)
    hosts = members["etc/hosts"]
    assert contents["etc/hosts"] == b"" and hosts.mode == 0o644 and hosts.uid == 5
    assert contents["etc/resolv.conf"] == b""
    assert members["var/tmp"].issym() and members["var/tmp"].linkname == "/tmp"
    assert members["singularity"].linkname == ".singularity.d/runscript"
    assert names.count("environment") == 1
    assert sif_meta.RUN_MARKER in contents[".singularity.d/runscript"].decode().splitlines()
    assert contents[".singularity.d/keepme"] == b"mine"
    for d in ("proc", "sys", "dev", "tmp", "home", "root", ".singularity.d/libs"):
        assert members[d].isdir() and members[d].mode == 0o755
    assert len(names) == len(set(names))
