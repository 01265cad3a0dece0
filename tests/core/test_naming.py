"""Content names: every input changes the content hash; override builds never get release tags."""

from __future__ import annotations

from pathlib import Path

from builder.matrix.naming import content_hash, names
from builder.matrix.spec import apply_overrides, load_matrix

REPO = Path(__file__).resolve().parents[2]


def _ctx(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_every_input_moves_the_content_hash(tmp_path: Path) -> None:
    files = {"Dockerfile": "FROM x\n", "lock.txt": "a==1\n", "selftest/__main__.py": "pass\n"}
    base = content_hash(_ctx(tmp_path / "a", files), ["img@sha256:1"], "0.1.0")
    assert base == content_hash(_ctx(tmp_path / "b", files), ["img@sha256:1"], "0.1.0")
    for rel in files:
        changed = {**files, rel: files[rel] + "#\n"}
        assert content_hash(_ctx(tmp_path / f"c-{rel.replace('/', '_')}", changed),
                            ["img@sha256:1"], "0.1.0") != base, rel
    assert content_hash(tmp_path / "a", ["img@sha256:2"], "0.1.0") != base  # base digest
    assert content_hash(tmp_path / "a", ["img@sha256:1"], "0.1.1") != base  # builder version
    extra = _ctx(tmp_path / "d", {**files, "wheels/x.whl": "w"})
    assert content_hash(extra, ["img@sha256:1"], "0.1.0") != base  # a new file


def test_release_and_override_names() -> None:
    t = load_matrix(REPO / "matrix.yaml").target("cuda-x86_64")
    n = names(t, "verl-env", "sha256:" + "ab" * 32)
    assert n.content == "verl-env:cuda-x86_64-verl0.9.1-" + "ab" * 6
    assert n.release == ("verl-env:cuda-x86_64",)
    o = names(apply_overrides(t, ["packages.verl=0.9.0"]), "verl-env", "sha256:" + "cd" * 32)
    assert o.content == "verl-env:cuda-x86_64-override-" + "cd" * 6 and o.release == ()
