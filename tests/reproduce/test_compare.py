"""The file-tree listing and comparison of ``build-env reproduce`` (pure: tar streams made here),
the verdict's tree record, and the input check's wording."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from builder.engine.filetree import FileEntry, read_tree
from builder.gate.record import FileTreeRecord, GateRecord
from builder.gate.verdicts import Verdict
from builder.reproduce.compare import compare, ignored_reason, root_digest, tree_document
from builder.reproduce.ignored import IGNORED
from builder.reproduce.run import _read_record, input_differences


def _tar(*members: tuple[str, str, object], mode: int = 0o644, uid: int = 0) -> bytes:
    """A tar stream: (name, kind, payload) with kind file (bytes), dir, symlink, hardlink (target)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            info.mode, info.uid, info.gid = mode, uid, uid
            data = None
            if kind == "file":
                assert isinstance(payload, bytes)
                info.size, data = len(payload), io.BytesIO(payload)
            elif kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, str(payload)
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, str(payload)
            tar.addfile(info, data)
    return out.getvalue()


def _chunks(data: bytes, size: int = 7) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


BASE = (("opt", "dir", None), ("opt/a.txt", "file", b"alpha"),
        ("opt/link", "symlink", "a.txt"), ("opt/hard", "hardlink", "opt/a.txt"),
        (".dockerenv", "file", b""), ("etc/hostname", "file", b""))


def test_the_tree_of_a_tar_stream_has_each_path_with_type_mode_owner_size_digest_and_link() -> None:
    tree = {e.path: e for e in read_tree(_chunks(_tar(*BASE)))}
    a = tree["/opt/a.txt"]
    assert (a.kind, a.mode, a.uid, a.size) == ("file", 0o644, 0, 5)
    assert a.digest == "sha256:8ed3f6ad685b959ead7022518e1af76cd816f8e8ec7ccdda1ed4018e8f2223f8"
    assert (tree["/opt/link"].kind, tree["/opt/link"].link) == ("symlink", "a.txt")
    hard = tree["/opt/hard"]
    assert (hard.kind, hard.link, hard.digest, hard.size) == ("hardlink", "/opt/a.txt",
                                                               a.digest, 5)
    assert tree["/opt"].kind == "dir"
    assert list(tree) == sorted(tree)


def test_identical_trees_compare_identical_and_count_the_compared_paths() -> None:
    # another order of the stream (a hard link still after its target, as in any tar)
    other = [m for m in reversed(BASE) if m[1] != "hardlink"] + [BASE[3]]
    one, two = read_tree([_tar(*BASE)]), read_tree(_chunks(_tar(*other), 3))
    result = compare(one, two)
    assert result.identical
    # /.dockerenv and /etc/hostname are the engine's, not the build's: not counted
    assert result.files == 4
    assert result.lines() == ["identical (4 files)"]
    assert root_digest(one) == root_digest(two)


def test_every_differing_field_and_path_is_named() -> None:
    original = read_tree([_tar(*BASE, ("opt/gone", "file", b"x"))])
    changed = [m for m in BASE if m[0] != "opt/a.txt"] + [("opt/a.txt", "file", b"alphb"),
                                                           ("opt/new", "file", b"")]
    rebuilt = read_tree([_tar(*changed, mode=0o600, uid=1000)])
    result = compare(original, rebuilt)
    by_path = {d.path: d.what for d in result.differences}
    assert by_path["/opt/gone"] == ("only in the original",)
    assert by_path["/opt/new"] == ("only in the rebuilt image",)
    what = by_path["/opt/a.txt"]
    assert what[0] == "mode 0644 -> 0600" and what[1] == "owner 0:0 -> 1000:1000"
    assert what[2].startswith("content 8ed3f6ad685b -> ")
    assert "size" not in " ".join(what)  # same length, other bytes
    assert result.lines()[-1] == f"differs: {len(result.differences)} of {result.files} files"
    assert not result.identical and root_digest(original) != root_digest(rebuilt)


def test_a_symlink_retargeted_and_a_type_change_are_differences() -> None:
    a = read_tree([_tar(("x", "symlink", "one"), ("y", "file", b""))])
    b = read_tree([_tar(("x", "symlink", "two"), ("y", "dir", None))])
    by_path = {d.path: d.what for d in compare(a, b).differences}
    assert by_path["/x"] == ("link one -> two",)
    assert by_path["/y"][0] == "type file -> dir"


def test_image_settings_that_differ_are_named_as_config() -> None:
    tree = read_tree([_tar(*BASE)])
    result = compare(tree, tree, original_config={"Env": ["A=1"], "Labels": {"k": "1"}},
                     rebuilt_config={"Env": ["A=1"], "Labels": {"k": "2"}})
    assert [d.line() for d in result.config] == ["config:Labels.k: '1' -> '2'"]
    assert not result.identical


def test_every_ignored_path_has_a_reason_and_only_those_are_left_out() -> None:
    assert all(pattern.startswith("/") and len(reason) > 20 for pattern, reason in IGNORED)
    assert ignored_reason("/etc/hosts") and ignored_reason("/dev/shm")
    assert ignored_reason("/etc/hosts.allow") is None and ignored_reason("/devices") is None
    assert ignored_reason("/dev") is None  # the directory itself is compared


def test_the_tree_record_travels_in_the_gate_section_and_reads_back() -> None:
    files = FileTreeRecord("sha256:" + "ab" * 32, 12, proved="rebuilt identical at T")
    gate = GateRecord("cpu", ("imports",), ("imports",), (), files=files)
    data = gate.to_dict()
    assert data["files"] == {"schema": "verl-env/filetree/v1", "root": files.root, "files": 12,
                             "proved": "rebuilt identical at T"}
    back = GateRecord.from_dict(json.loads(json.dumps(data)))
    assert back.files == files and "files" not in back.extra
    assert GateRecord.from_dict({"files": {"root": 3}}).files is None


def test_against_a_tree_document_every_path_is_compared(tmp_path: Path) -> None:
    tree = read_tree([_tar(*BASE)])
    doc = tmp_path / "tree.json"
    doc.write_text(json.dumps(tree_document(tree, image="sha256:x")))
    root, entries = _read_record(doc)
    assert root == root_digest(tree) and entries is not None
    assert compare(entries, tree).identical
    assert [FileEntry.from_dict(e.to_dict()) for e in tree] == tree


def test_against_a_verdict_record_its_root_is_read(tmp_path: Path) -> None:
    gate = GateRecord("cpu", (), (), (), files=FileTreeRecord("sha256:" + "cd" * 32, 3))
    record = tmp_path / "verdict.json"
    record.write_text(json.dumps(Verdict("img", 0, {"gate": gate.to_dict()}).to_dict()))
    assert _read_record(record) == ("sha256:" + "cd" * 32, None)
    record.write_text(json.dumps(Verdict("img", 0, {"gate": {}}).to_dict()))
    with pytest.raises(Exception, match="neither a tree document"):
        _read_record(record)


def test_the_inputs_that_differ_are_named_by_label() -> None:
    image = {"org.verl-env.lock-hash": "sha256:1", "org.verl-env.target": "t",
             "org.verl-env.source.x": "tree sha256:a", "maintainer": "base"}
    here = {"org.verl-env.lock-hash": "sha256:2", "org.verl-env.target": "t"}
    assert input_differences(image, here) == [
        "lock-hash: the image records 'sha256:1', here it is 'sha256:2'",
        "source.x: the image records 'tree sha256:a', here it is None"]
    assert input_differences(here, dict(here)) == []
    # a label the image has from its base, with the base's value, is not an input
    base = {"org.verl-env.debian-key": "04d4"}
    assert input_differences({**here, **base}, here, base) == []
    assert input_differences({**here, "org.verl-env.debian-key": "x"}, here, base) == [
        "debian-key: the image records 'x', here it is None"]
