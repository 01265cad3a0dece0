"""The proved tree recorded with the image's local verdict, and ``--against-record`` read back
from it (the verdict store of the session: XDG_STATE_HOME, tests/conftest.py; an engine stand-in
that answers only what ``against_record`` asks: the image and its file tree)."""

from __future__ import annotations

import io
import tarfile

import pytest

from builder.engine import ImageInfo
from builder.engine.filetree import FileEntry, read_tree
from builder.gate import verdicts
from builder.reproduce.compare import root_digest
from builder.reproduce.run import InputsUnavailable, against_record, record_tree, recorded_tree

IMAGE = "sha256:" + "5e" * 32


def _tree(payload: bytes) -> list[FileEntry]:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("opt/f")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    return read_tree([out.getvalue()])


class Engine:
    def __init__(self, tree: list[FileEntry]) -> None:
        self.tree = tree

    def image(self, ref: str) -> ImageInfo:
        return ImageInfo(IMAGE, tags=(ref,))

    def file_tree(self, image: str) -> list[FileEntry]:
        assert image == IMAGE
        return self.tree


def _verdict() -> verdicts.Verdict:
    report = {"overall": "pass", "gate": {"schema": "verl-env/gate/v1", "family": "cpu",
                                          "phases": ["imports"], "required_phases": ["imports"],
                                          "selftest_args": [], "scope": "release",
                                          "partial_reason": None}}
    return verdicts.record(IMAGE, verdicts.Verdict(IMAGE, 0, report), target="t",
                           tags=("verl-env:t",))


def test_an_identical_rebuild_is_recorded_with_the_verdict_and_checked_later() -> None:
    before = _verdict()
    tree = _tree(b"one")
    assert record_tree(IMAGE, root_digest(tree), 1)
    after = verdicts.lookup(IMAGE)
    assert after is not None and after.tags == before.tags and after.target == "t"
    assert verdicts.release_problem(after) == verdicts.release_problem(before)
    recorded = recorded_tree(IMAGE)
    assert recorded is not None and (recorded.root, recorded.files) == (root_digest(tree), 1)
    assert recorded.proved and recorded.proved.startswith("rebuilt identical at ")
    assert against_record(Engine(tree), "verl-env:t", None)[1:] == (root_digest(tree),
                                                                  recorded.root)
    changed = against_record(Engine(_tree(b"two")), "verl-env:t", None)
    assert changed[0] is None and changed[1] != changed[2]


def test_no_recorded_tree_is_exit_3_naming_the_way_out() -> None:
    _verdict()  # a verdict without a tree
    with pytest.raises(InputsUnavailable, match="no file tree is recorded") as caught:
        against_record(Engine(_tree(b"one")), "verl-env:t", None)
    assert caught.value.exit_code == 3
