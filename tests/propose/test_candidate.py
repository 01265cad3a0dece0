"""The candidate directory and `--apply` (no engine): written whole, never over a directory the
tool did not write, and an unproven proposal is never applied."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import run_build_env
from tests.propose.test_search import site  # noqa: F401  (the fixture)


def test_candidate_directory(site: Path, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "proposal"
    proc = run_build_env("propose", "--matrix", str(site), "--target", "gpu", "--no-lock",
                         "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    names = {p.name for p in out.iterdir()}
    assert {"matrix.yaml", "matrix.diff", "PROPOSAL.md", "proposal.json", "metadata",
            ".verl-env-proposal"} <= names
    # the candidate is a site: its matrix holds the proposed entry and passes `check`
    check = run_build_env("check", "--matrix", str(out / "matrix.yaml"), "--json")
    assert check.returncode == 0, check.stderr
    listed = json.loads(run_build_env("list", "--matrix", str(out / "matrix.yaml"),
                                      "--json").stdout)
    assert "gpu" in json.dumps(listed) and "0.31.0" in json.dumps(listed)
    # the diff rewrites the target's own lines of the site's matrix (an inherited pin gets a
    # line of its own under the target's packages)
    diff = (out / "matrix.diff").read_text()
    assert '-      vllm: "0.24.0"' in diff and '+      vllm: "0.31.0"' in diff
    assert '+      transformers: "5.10.4"' in diff
    md = (out / "PROPOSAL.md").read_text()
    assert md.startswith("# gpu: vllm 0.24.0 → 0.31.0, torch 2.11.0 → 2.13.0, transformers "
                         "5.9.0 → 5.10.4")
    assert "vllm 0.32.0**: vllm 0.32.0 needs transformers>=5.16.1; verl 0.9.1 requires" in md
    doc = json.loads((out / "proposal.json").read_text())
    assert doc["schema"] == "verl-env/proposal/v1" and doc["status"] == "searched"
    # a second run replaces its own directory ...
    again = run_build_env("propose", "--matrix", str(site), "--target", "gpu", "--no-lock",
                          "--output", str(out), "--hold", "vllm")
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "proposal.json").read_text())["anchors"]["hold"] == ["vllm"]
    # ... never one it did not write
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    refused = run_build_env("propose", "--matrix", str(site), "--target", "gpu", "--no-lock",
                            "--output", str(mine))
    assert refused.returncode != 0 and "did not write" in refused.stderr
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_apply_refuses_an_unproven_proposal(site: Path, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "proposal"
    assert run_build_env("propose", "--matrix", str(site), "--target", "gpu", "--no-lock",
                         "--output", str(out)).returncode == 0
    before = {p: p.read_bytes() for p in site.parent.rglob("*") if p.is_file()}
    proc = run_build_env("propose", "--matrix", str(site), "--apply", str(out))
    assert proc.returncode == 1, proc.stderr
    assert "the proposal is searched, not proven" in proc.stderr
    assert "nothing was written" in proc.stderr
    after = {p: p.read_bytes() for p in site.parent.rglob("*") if p.is_file()}
    assert after == before
    # a directory that is not a proposal at all
    other = run_build_env("propose", "--matrix", str(site), "--apply", str(tmp_path))
    assert other.returncode == 2 and "not a proposal directory" in other.stderr


def _resolved(target: Any) -> dict:
    """The canonical entry with each path source as the directory it resolves to."""
    d = target.to_dict()
    for p in target.packages:
        if p.source is not None and p.source.kind == "path":
            d["packages"][p.name]["source"]["path"] = p.source.location
    return d


def test_candidate_entry_keeps_every_key_of_the_target() -> None:
    """The candidate's matrix entry reads back as the same target (import claims included: the
    gate checks them) for every shipped and fixture target."""
    import tempfile

    import yaml

    from builder.propose.candidate import entry
    from builder.matrix.spec import load_matrix
    from tests.conftest import REPO

    for matrix in (REPO / "matrix.yaml", REPO / "tests/fixtures/cpu.yaml",
                   REPO / "tests/fixtures/cuda/matrix.yaml"):
        for t in load_matrix(matrix).targets.values():
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "matrix.yaml"
                path.write_text(yaml.safe_dump({"schema": 1, "targets": {
                    t.name: entry(t, matrix.parent)}}))
                back = load_matrix(path).target(t.name)
            # a path source is written absolute (the candidate lives elsewhere): the same
            # directory, though not the same text as the site's matrix wrote
            assert _resolved(back) == _resolved(t), t.name
            assert {p.name: p.import_name for p in back.packages} == {
                p.name: p.import_name for p in t.packages}, t.name


def test_the_edit_of_a_matrix_with_a_relative_path_source_is_checked_where_it_lives(
        tmp_path: Path) -> None:
    """The edited matrix is loaded as the site's own file: a ``source: {path: ext}`` beside it
    resolves, so the edit is written in place (it was refused: the check loaded the edited text
    from a temporary directory, where ``ext`` does not exist). Nothing is written anywhere."""
    import shutil

    from builder.matrix.spec import load_matrix
    from builder.propose.candidate import matrix_diff
    from builder.propose.proposal import Pin, Proposal
    from tests.conftest import REPO

    site = tmp_path / "site"
    shutil.copytree(REPO / "tests/fixtures/arm64", site)
    matrix = site / "matrix.yaml"
    target = load_matrix(matrix).target("cpu-arm64")
    proposal = Proposal(target=target.name, python=target.python, arch="aarch64",
                        platform="linux", accelerator="cpu", anchors={},
                        pins=[Pin("ray", "2.60.0", "2.61.0", "2.61.0")])
    before = sorted(p for p in tmp_path.rglob("*"))
    diff, new = matrix_diff(matrix, target, proposal)
    assert new is not None, diff
    assert diff.count('-      ray: "2.60.0"') == 1 and '+      ray: "2.61.0"' in diff, diff
    assert sorted(p for p in tmp_path.rglob("*")) == before
