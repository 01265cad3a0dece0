"""The command line: list, render, lock/check round trip, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.cli import main
from builder.files import sha256_text
from builder.resolve.metadata import IndexClient
from builder.matrix.spec import load_matrix

REPO = Path(__file__).resolve().parents[2]
MATRIX = str(REPO / "matrix.yaml")


def test_list_table_and_json(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    from builder.gate import verdicts
    from tests.trust.conftest import CUDA_BUILD_VERDICT

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    entry = load_matrix(Path(MATRIX)).target("cuda-x86_64").entry_hash
    lock = sha256_text((Path(MATRIX).parent / "locks" / "cuda-x86_64.txt").read_text())
    bound = verdicts.Binding(verdicts.site_key(MATRIX), "cuda-x86_64", entry, lock)
    verdicts.record("sha256:" + "c" * 64, verdicts.Verdict.from_dict(CUDA_BUILD_VERDICT),
                    target="cuda-x86_64", binding=bound)
    assert main(["list", "--matrix", MATRIX]) == 0
    out = capsys.readouterr().out
    assert "cuda-arm64" in out and "0.10.0(src)" in out and "2.9.1.dev20251204+rocm7.0.2*" in out
    assert "(declared, not yet verified)" in out  # rocm-mi300's base was never inspected
    row = next(line for line in out.splitlines() if line.startswith("cuda-x86_64 "))
    assert "build (gpu pending)" in row  # its newest local verdict, saying what it proved
    assert main(["list", "--matrix", MATRIX, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "verl-env/list/v1"
    data = doc["targets"]
    assert set(data) == {"cuda-x86_64", "cuda-arm64", "rocm-mi300", "cuda-x86_64-sglang",
                         "cuda-x86_64-megatron", "cuda-arm64-megatron"}
    assert data["rocm-mi300"]["provided"] == {"torch": "2.9.1.dev20251204+rocm7.0.2",
                                              "vllm": "0.20.2rc1"}
    assert data["rocm-mi300"]["base_status"] == "declared, not yet verified"
    assert "base_status" not in data["cuda-x86_64"]
    assert data["cuda-x86_64"]["entry_hash"].startswith("sha256:")
    assert data["cuda-x86_64"]["verdict"]["level"] == "build"
    assert data["cuda-x86_64"]["verdict"]["gpu"]["status"] == "pending"
    assert data["cuda-arm64"]["verdict"] is None


def test_render_command_writes_the_context(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ctx"
    assert main(["render", "--matrix", MATRIX, "--target", "cuda-x86_64", "--output",
                 str(out)]) == 0
    assert (out / "Dockerfile").read_text() == (REPO / "tests/golden/cuda-x86_64.Dockerfile"
                                                ).read_text()
    assert sorted(p.name for p in out.iterdir()) == [
        ".verl-env-context", "Dockerfile", "layers", "lock.txt", "manifest.json", "selftest",
        "source"]


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["render"])  # --target is required
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:  # --set is typed: argparse refuses it, exit 2
        main(["render", "--matrix", MATRIX, "--target", "cuda-x86_64", "--set", "nokey"])
    assert exc.value.code == 2
    assert "argument --set: expected KEY=VALUE" in capsys.readouterr().err


def test_missing_matrix_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--matrix", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml: cannot read matrix" in capsys.readouterr().err


@pytest.mark.network
def test_index_metadata_is_read_from_the_wheel_without_downloading_it() -> None:
    client = IndexClient()
    rel = client.release("verl", "0.9.1")
    assert rel.requires_python == "<3.13,>=3.10"
    assert any(r.startswith("ray[default]") for r in rel.requires_dist)
    big = client.release("vllm", "0.24.0")  # a 270 MB wheel: only ranges are fetched
    assert any(r.startswith("transformers") for r in big.requires_dist)
    assert "0.9.1" in client.versions("verl")


@pytest.mark.network
def test_check_online_refreshes_the_snapshot(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    snap = tmp_path / "snap.json"
    code = main(["check", "--online", "--matrix", str(REPO / "tests/fixtures/conflict.yaml"),
                 "--snapshot", str(snap)])
    captured = capsys.readouterr()
    assert code == 1 and "conflict on transformers" in captured.err  # found from fresh data
    data = json.loads(snap.read_text())
    assert "verl==0.9.1" in data["releases"] and "vllm==0.33.0" in data["releases"]
    assert "transformers" in data["versions"]  # constrained by two pins: version list kept


def test_build_print_is_the_plan_without_an_engine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`--print` needs no engine (DOCKER_HOST names a socket that does not exist), writes nothing,
    and says what only the engine can tell as unknown."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-such.sock'}")
    monkeypatch.chdir(tmp_path)
    assert main(["build", "--matrix", MATRIX, "--target", "cuda-x86_64", "--print", "--sif",
                 "out.sif"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["schema"] == "verl-env/build-plan/v1" and plan["target"] == "cuda-x86_64"
    assert plan["workdir"] == "build/cuda-x86_64"
    assert plan["context"]["digest"].startswith("sha256:")
    assert plan["context"]["pins"]["verl"] == "0.9.1"
    assert plan["lock"]["path"] == str(REPO / "locks/cuda-x86_64.txt")
    assert plan["content_tag"]["known"] is False and plan["content_tag"]["needs"] == "the engine"
    assert plan["content_tag"]["pattern"] == "verl-env:cuda-x86_64-verl0.9.1-<hash12>"
    assert plan["reuse"]["known"] is False and plan["release_tags"] == ["verl-env:cuda-x86_64"]
    assert plan["steps"] == ["build", "verify", "tag", "sif"]
    assert plan["extends"] == {"sif": "out.sif", "sign": None, "push": None}
    assert list(tmp_path.iterdir()) == []  # nothing written, not even the workdir

    assert main(["build", "--matrix", MATRIX, "--all", "--print"]) == 0
    plans = json.loads(capsys.readouterr().out)
    assert set(plans) == {"cuda-x86_64", "cuda-arm64", "rocm-mi300", "cuda-x86_64-sglang",
                          "cuda-x86_64-megatron", "cuda-arm64-megatron"}
    assert all(p["schema"] == "verl-env/build-plan/v1" for p in plans.values())
    # a declared vendor base: the run inspects it first (with the engine) and stops there
    assert plans["rocm-mi300"]["base"]["inspect_first"] is True
    assert plans["rocm-mi300"]["context"] is None
    assert plans["cuda-x86_64"]["context"] == plan["context"]
    # --print fetches no git source: the context it hashed lacks it, so its digest is unknown
    assert plans["cuda-arm64"]["context"]["digest"] == {
        "known": False, "needs": "the network", "why": "not fetched: tensordict"}
    assert plans["cuda-arm64"]["context"]["source_pins"]["tensordict"]["kind"] == "git"
    assert list(tmp_path.iterdir()) == []


def test_a_path_sources_entry_hash_is_the_same_in_another_checkout(tmp_path: Path) -> None:
    """The arm64 fixture's ``source: {path: ext}`` is hashed as written, not as the absolute
    path it resolves to: the entry hash (and with it the verdict binding and the content tag)
    is the same in two copies of one site, and still follows the path as written."""
    import shutil

    fixture = REPO / "tests/fixtures/arm64"
    first, second = tmp_path / "a", tmp_path / "deeper/b"
    for copy in (first, second):
        shutil.copytree(fixture, copy)
    hashes = {load_matrix(copy / "matrix.yaml").target("cpu-arm64").entry_hash
              for copy in (first, second)}
    assert len(hashes) == 1, hashes
    target = load_matrix(first / "matrix.yaml").target("cpu-arm64")
    ext = next(p for p in target.packages if p.source)
    assert ext.source is not None and Path(ext.source.location) == (first / "ext").resolve()
    moved = first / "matrix.yaml"
    moved.write_text(moved.read_text().replace("{path: ext}", "{path: ./ext}"))
    assert load_matrix(moved).target("cpu-arm64").entry_hash not in hashes
