"""`propose` reads a target's reviewed ``overrides:`` through the code `check` and `lock` use
(builder.matrix.overrides.kept): the override replaces the requirements it names, and holds its
package to its version. Offline: the reference matrix and its recorded snapshot."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from builder.matrix import overrides
from builder.matrix.spec import load_matrix
from builder.propose.proposal import propose
from builder.propose.search import Anchors, Space
from builder.resolve.compat import check_target
from builder.resolve.metadata import load_snapshot

REPO = Path(__file__).resolve().parents[2]
TARGET = "cuda-x86_64-sglang"


def _inputs():
    target = load_matrix(REPO / "matrix.yaml").target(TARGET)
    return target, load_snapshot(REPO / "metadata" / "pypi-snapshot.json")


def test_the_sglang_target_needs_its_override() -> None:
    """The premise: without its override the target's own pins are not coherent."""
    target, snap = _inputs()
    assert [o.name for o in target.overrides] == ["transformers"]
    bare = replace(target, overrides=())
    assert Space(bare, snap, Anchors()).solve() is None
    assert check_target(bare, snap), "check must refuse the pins without the override"
    assert check_target(target, snap) == []


def test_propose_honours_the_override_as_check_does() -> None:
    target, snap = _inputs()
    proposal = propose(target, snap, Anchors())
    pins = {p.name: p for p in proposal.pins}
    o = target.overrides[0]
    assert pins[o.name].new == o.version  # held by the override, never moved off it
    assert "reviewed override" in (pins[o.name].reason or "")


def test_one_reading_of_overrides() -> None:
    """The requirement the override replaces is dropped by propose's space as by check."""
    target, snap = _inputs()
    space = Space(target, snap, Anchors())
    sglang = target.package("sglang")
    assert sglang is not None
    rel = snap.release(sglang.name, sglang.version)
    assert rel is not None
    replaced = [r for r in rel.requirements() if r.name == "transformers"]
    assert replaced, "the snapshot's sglang names transformers"
    kept = overrides.kept(target.overrides, sglang.name, rel.requirements())
    assert not any(r.name == "transformers" for r in kept)
    assert not any(r.name == "transformers"
                   for r in space.requirements(sglang.name, sglang.version))
