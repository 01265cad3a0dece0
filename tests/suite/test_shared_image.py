"""tests/support/shared_image.py: in a whole run one group builds the CPU fixture and hands it
to the others; a failed build or a run without the share makes every group build for itself."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support import shared_image


def _config(group: str):  # type: ignore[no-untyped-def]
    return SimpleNamespace(getoption=lambda name, default=None: f"/tmp/x/{group}")


def test_without_the_share_every_group_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(shared_image.SHARE_ENV, raising=False)
    monkeypatch.setenv(shared_image.BUILDER_ENV, "main")
    assert shared_image.receive(_config("slurm"), "cpu-x86_64", "unix:///nowhere") == \
        "built here"
    shared_image.offer(_config("main"), "cpu-x86_64", "unix:///nowhere", None)  # nothing to do


def test_a_failed_build_lets_the_others_build(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    monkeypatch.setenv(shared_image.SHARE_ENV, str(tmp_path / "share"))
    monkeypatch.setenv(shared_image.BUILDER_ENV, "main")
    # the builder itself never waits
    assert shared_image.receive(_config("main"), "cpu-x86_64", "unix:///nowhere") == "built here"
    shared_image.offer(_config("main"), "cpu-x86_64", "unix:///nowhere",
                       {"result": "fail", "tags": [], "content_hash": "sha256:" + "0" * 64})
    assert (tmp_path / "share" / "cpu-x86_64.failed").is_file()
    assert not (tmp_path / "share" / "cpu-x86_64.ready").exists()
    said = shared_image.receive(_config("slurm"), "cpu-x86_64", "unix:///nowhere")
    assert said == "built here (the main group's build failed)"


def test_a_receiver_never_offers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(shared_image.SHARE_ENV, str(tmp_path / "share"))
    monkeypatch.setenv(shared_image.BUILDER_ENV, "main")
    shared_image.offer(_config("heavy"), "cpu-x86_64", "unix:///nowhere", {"result": "pass"})
    assert not (tmp_path / "share").exists()


def test_a_passed_build_names_its_engine_and_content_tag(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    monkeypatch.setenv(shared_image.SHARE_ENV, str(tmp_path / "share"))
    monkeypatch.setenv(shared_image.BUILDER_ENV, "main")
    content = "sha256:" + "ab12" * 16
    shared_image.offer(_config("main"), "cpu-x86_64", "unix:///nowhere/docker.sock",
                       {"result": "pass", "content_hash": content,
                        "tags": ["verl-env:cpu-x86_64-" + content[7:19], "verl-env:cpu-x86_64"]})
    ready = tmp_path / "share" / "cpu-x86_64.ready"
    assert json.loads(ready.read_text()) == {"host": "unix:///nowhere/docker.sock",
                                             "tag": "verl-env:cpu-x86_64-" + content[7:19]}
    assert sorted(p.name for p in ready.parent.iterdir()) == ["cpu-x86_64.ready"]  # no .part
    # a builder's engine that cannot send the image (gone with its group): this group builds
    said = shared_image.receive(_config("slurm"), "cpu-x86_64", "unix:///nowhere/mine.sock")
    assert said.startswith("built here (the main group's engine could not send it: "), said
