"""Lock parsing, staleness, layer splitting (pure), and a real uv resolution (network)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from builder.resolve.layers import split_layers
from builder.resolve.lock import compile_lock, input_hash, lock_for, lock_path, parse_lock, \
    python_platform, stale_reason
from builder.resolve.metadata import Snapshot, load_snapshot
from builder.matrix.spec import Matrix, Target, apply_overrides, load_matrix

REPO = Path(__file__).resolve().parents[2]
LOCK = """\
# verl-env lock for target t
# input-hash: sha256:{h}
a==1.0 \\
    --hash=sha256:aaa
    # via -r requirements.in
b==2.0 \\
    --hash=sha256:bbb \\
    --hash=sha256:bb2
    # via
    #   a
    #   torch
torch==2.11.0 \\
    --hash=sha256:ttt
    # via
    #   -r requirements.in
    #   verl
    #   vllm
nvidia-nccl==2.28 \\
    --hash=sha256:nnn
    # via torch
vllm==0.24.0 \\
    --hash=sha256:vvv
    # via -r requirements.in
xgrammar==0.2 \\
    --hash=sha256:xxx
    # via vllm
verl==0.9.1 \\
    --hash=sha256:lll
    # via -r requirements.in
""".format(h="0" * 64)


def test_parse_lock_reads_hashes_and_via() -> None:
    pk = parse_lock(LOCK)
    assert list(pk) == ["a", "b", "torch", "nvidia-nccl", "vllm", "xgrammar", "verl"]
    assert pk["b"].hashes == ("sha256:bbb", "sha256:bb2")
    assert pk["b"].via == ("a", "torch")
    assert pk["torch"].via == ("-r requirements.in", "verl", "vllm")
    assert pk["b"].render() == "b==2.0 \\\n    --hash=sha256:bbb \\\n    --hash=sha256:bb2\n"


def test_layers_put_torch_first_engine_next_verl_last() -> None:
    layers = split_layers(parse_lock(LOCK), engine="vllm")
    names = {layer.name: [p.name for p in layer.packages] for layer in layers}
    assert [layer.name for layer in layers] == ["torch", "engine", "deps", "verl"]
    assert names["torch"] == ["b", "nvidia-nccl", "torch"]  # b is also needed by torch
    assert names["engine"] == ["vllm", "xgrammar"]
    assert names["deps"] == ["a"]
    assert names["verl"] == ["verl"]
    assert [layer.filename for layer in layers] == ["10-torch.txt", "20-engine.txt",
                                                    "30-deps.txt", "40-verl.txt"]


def test_layers_cover_the_lock_exactly_once() -> None:
    locked = parse_lock((REPO / "locks" / "cuda-x86_64.txt").read_text())
    locked.pop("uv")
    layers = split_layers(locked, engine="vllm", exclude={"flash-attn"})
    names = [p.name for layer in layers for p in layer.packages]
    assert sorted(names) == sorted(locked) and len(names) == len(set(names))
    assert layers[-1].name == "verl" and [p.name for p in layers[-1].packages] == ["verl"]


def test_committed_locks_match_the_matrix() -> None:
    m = load_matrix(REPO / "matrix.yaml")
    snap = load_snapshot(REPO / "metadata" / "pypi-snapshot.json")
    for t in m.targets.values():
        assert stale_reason(t, snap, lock_path(m.path, t)) is None
    assert python_platform(m.target("cuda-arm64")) == "aarch64-manylinux_2_39"


def test_a_changed_pin_makes_the_lock_stale() -> None:
    m = load_matrix(REPO / "matrix.yaml")
    snap = load_snapshot(REPO / "metadata" / "pypi-snapshot.json")
    t = apply_overrides(m.target("cuda-x86_64"), ["packages.transformers=5.8.1"])
    assert input_hash(t, snap) != input_hash(m.target("cuda-x86_64"), snap)
    reason = stale_reason(t, snap, lock_path(m.path, t))
    assert reason and "different inputs" in reason


def _fixture_target() -> tuple[Matrix, Snapshot, Target]:
    """The CPU fixture's matrix, snapshot and target, for a real uv resolution (or a skip)."""
    fixtures = REPO / "tests" / "fixtures"
    m = load_matrix(fixtures / "cpu.yaml")
    t = m.target("cpu-x86_64")
    if not all(Path(d).is_dir() for d in t.find_links):
        pytest.skip("no local CPU torch wheel directory on this machine")
    if not shutil.which("uv"):
        pytest.skip("uv not installed")
    return m, load_snapshot(fixtures / "metadata" / "pypi-snapshot.json"), t


@pytest.mark.network
def test_uv_resolves_the_fixture_target_reproducibly(tmp_path: Path) -> None:
    _, snap, t = _fixture_target()
    first = compile_lock(t, snap, tmp_path / "a.txt")
    second = compile_lock(t, snap, tmp_path / "b.txt")
    assert first.text == second.text  # no temp paths, no timestamps
    assert "# via -r requirements.in" in first.text and str(tmp_path) not in first.text
    locked = parse_lock(first.text)
    for p in t.enabled_packages:
        assert locked[p.name].version == p.version
        assert locked[p.name].hashes
    assert locked["hydra-core"].version.startswith("1.3")  # not 0.11.3 through antlr4
    assert stale_reason(t, snap, tmp_path / "a.txt") is None


@pytest.mark.network
def test_a_resolution_leaves_nothing_in_the_temporary_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """uv leaves a lock file of its setuptools build (``uv-setuptools-<hash>.lock``, a new one
    each run) in its temporary directory: the resolution gives uv a directory of its own and
    removes it, so a ``lock`` writes nothing the user did not name."""
    import tempfile

    _, snap, t = _fixture_target()
    base = tmp_path / "tmp"
    base.mkdir()
    monkeypatch.setenv("TMPDIR", str(base))
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    compile_lock(t, snap, tmp_path / "lock.txt")
    assert (tmp_path / "lock.txt").is_file()
    assert sorted(p.name for p in base.iterdir()) == []


@pytest.mark.network
def test_an_override_moves_only_what_it_overrides(tmp_path: Path) -> None:
    """A verl-only bump keeps every other version of the committed lock (uv keeps the versions of
    the lock it is given), so only the verl layer is rebuilt."""
    m, snap, t = _fixture_target()
    bumped = apply_overrides(t, ["packages.verl=0.9.0"])
    text, path = lock_for(m.path, bumped, snap, tmp_path)
    assert path.parent == tmp_path
    before = {n: p.version for n, p in parse_lock(lock_path(m.path, t).read_text()).items()}
    after = {n: p.version for n, p in parse_lock(text).items()}
    changed = {n for n in before.keys() | after.keys() if before.get(n) != after.get(n)}
    assert changed == {"verl"}, {n: (before.get(n), after.get(n)) for n in changed}
