"""Bad matrix input: one clear line naming file:line and key, exit 2 (1 for a failed
compatibility check), and no files written."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from builder.cli import main

REPO = Path(__file__).resolve().parents[2]

GOOD = """\
schema: 1
targets:
  t:
    accelerator: cuda
    arch: x86_64
    cuda: "13.0"
    base: {image: "nvidia/cuda:13.0.2-base-ubuntu24.04", glibc: "2.39"}
    python: "3.12"
    packages:
      torch: "2.11.0"
      vllm: "0.24.0"
      ray: "2.60.0"
      transformers: "5.9.0"
      tensordict: "0.10.0"
      verl: "0.9.1"
    gpus: [sm_80, sm_90]
"""


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    """A directory holding a matrix and the repo's metadata snapshot (as a user's would)."""
    (tmp_path / "metadata").mkdir()
    shutil.copy(REPO / "metadata" / "pypi-snapshot.json", tmp_path / "metadata")
    return tmp_path


def _run(workdir: Path, text: str, *args: str, capsys: pytest.CaptureFixture[str]
         ) -> tuple[int, str]:
    (workdir / "matrix.yaml").write_text(text)
    before = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        code = main([*args, "--matrix", "matrix.yaml"])
    finally:
        os.chdir(cwd)
    after = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
    assert after == before, "a failed command must not write files"
    err = capsys.readouterr().err
    return code, err


CASES = [
    # (name, edit, expected exit, expected substrings)
    ("yaml syntax error", lambda s: s.replace('python: "3.12"', 'python: "3.12'), 2,
     ["matrix.yaml:", "YAML syntax error"]),
    ("unknown key", lambda s: s.replace("    python:", "    pyhton: x\n    python:"), 2,
     ["matrix.yaml:8:", "targets.t.pyhton", "unknown key 'pyhton'"]),
    ("missing pin", lambda s: s.replace('      transformers: "5.9.0"\n', ""), 2,
     ["matrix.yaml:9:", "targets.t.packages", "missing pin: transformers"]),
    ("invalid version", lambda s: s.replace('vllm: "0.24.0"', 'vllm: "zero.24"'), 2,
     ["matrix.yaml:11:", "targets.t.packages.vllm", "invalid version 'zero.24'"]),
    ("ray 2.39", lambda s: s.replace('ray: "2.60.0"', 'ray: "2.39.0"'), 2,
     ["matrix.yaml:12:", "targets.t.packages.ray", "Ray 2.39.0 is refused", ">= 2.40"]),
    ("python 3.13 with verl 0.9.1", lambda s: s.replace('python: "3.12"', 'python: "3.13"'), 1,
     ["matrix.yaml:8:", "targets.t.python", "python 3.13 is outside verl 0.9.1's "
      "Requires-Python <3.13,>=3.10"]),
    ("float version", lambda s: s.replace('python: "3.12"', "python: 3.10"), 2,
     ["matrix.yaml:8:", "targets.t.python", "quoted strings"]),
    ("conflicting pins", lambda s: s.replace('vllm: "0.24.0"', 'vllm: "0.33.0"').replace(
        'torch: "2.11.0"', 'torch: "2.14.0"'), 1,
     ["targets.t.packages.verl", "conflict on transformers", "vllm 0.33.0 requires "
      "transformers<5.21.0,>=5.16.1", "verl 0.9.1 requires transformers!=5.6.0,<5.11,>=5.5.3"]),
    ("two engines", lambda s: s.replace('      verl: "0.9.1"', '      verl: "0.9.1"\n'
                                        '      sglang: "0.5.14"'), 2,
     ["targets.t.packages", "cannot share one environment"]),
    ("glibc too old", lambda s: s.replace('glibc: "2.39"', 'glibc: "2.28"'), 2,
     ["matrix.yaml:7:", "targets.t.base.glibc", "below 2.34"]),
    ("no engine", lambda s: s.replace('      vllm: "0.24.0"\n', ""), 2,
     ["targets.t.packages", "a GPU target needs a rollout engine"]),
    ("gpus missing", lambda s: s.replace("    gpus: [sm_80, sm_90]\n", ""), 2,
     ["matrix.yaml:3:", "targets.t:", "missing key 'gpus'", "sm_"]),
    ("gpus of another family", lambda s: s.replace("[sm_80, sm_90]", "[sm_80, gfx942]"), 2,
     ["matrix.yaml:16:", "targets.t.gpus[1]", "'gfx942' is not a cuda GPU architecture"]),
    ("gpus twice", lambda s: s.replace("[sm_80, sm_90]", "[sm_90, sm_90]"), 2,
     ["targets.t.gpus[1]", "sm_90 is listed twice"]),
    ("gpus on cpu", lambda s: s.replace("accelerator: cuda", "accelerator: cpu").replace(
        '    cuda: "13.0"\n', ""), 2, ["targets.t.gpus", "a cpu target runs on no GPU"]),
    ("git source without a tag", lambda s: s.replace(
        'tensordict: "0.10.0"', 'tensordict: {version: "0.10.0", build: source, '
        'source: "git+https://example.invalid/tensordict"}'), 2,
     ["matrix.yaml:14:", "targets.t.packages.tensordict.source", "git+https://HOST/REPO@TAG"]),
    ("source that cannot be hashed", lambda s: s.replace(
        'tensordict: "0.10.0"', 'tensordict: {version: "0.10.0", build: source, '
        'source: {path: matrix.yaml}}'), 1,
     ["matrix.yaml:14:", "targets.t.packages.tensordict.source", "neither a directory nor an "
      "archive", "cannot be hashed"]),
]


@pytest.mark.parametrize("name,edit,code,needles", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_line(workdir: Path, capsys: pytest.CaptureFixture[str],
                                     name: str, edit, code: int, needles: list[str]) -> None:
    exit_code, err = _run(workdir, edit(GOOD), "check", capsys=capsys)
    assert exit_code == code, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors, err
    joined = "\n".join(errors)
    for needle in needles:
        assert needle in joined, f"{needle!r} not in {joined!r}"


def test_a_git_source_not_yet_pinned_is_the_locks_next_step(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Not pinned yet: `check` passes and names `build-env lock`; `check --locked` (a site's CI)
    fails on it, naming the package's line."""
    text = GOOD.replace('tensordict: "0.10.0"', 'tensordict: {version: "0.10.0", build: source, '
                        'source: "git+https://example.invalid/tensordict@v0.10.0"}')
    code, err = _run(workdir, text, "check", capsys=capsys)
    assert code == 0, err
    code, err = _run(workdir, text, "check", "--locked", capsys=capsys)
    assert code == 1, err
    line = next(x for x in err.splitlines() if "is not pinned to a commit" in x)
    assert "matrix.yaml:14:" in line and "targets.t.packages.tensordict.source" in line
    assert "build-env lock --target t" in line


def test_unknown_target(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(workdir, GOOD, "render", "--target", "nope", capsys=capsys)
    assert code == 2
    assert "unknown target 'nope' (known: t)" in err and "matrix.yaml" in err


def test_conflict_example_from_the_issue(capsys: pytest.CaptureFixture[str]) -> None:
    """verl 0.9.1 with vLLM 0.33.0: both packages and both ranges named, exit 1."""
    code = main(["check", "--matrix", str(REPO / "tests/fixtures/conflict.yaml"),
                 "--snapshot", str(REPO / "metadata/pypi-snapshot.json")])
    err = capsys.readouterr().err
    assert code == 1
    line = next(x for x in err.splitlines() if "conflict on transformers" in x)
    assert "conflict.yaml:16:" in line
    assert "vllm 0.33.0 requires transformers<5.21.0,>=5.16.1" in line
    assert "verl 0.9.1 requires transformers!=5.6.0,<5.11,>=5.5.3" in line


def test_good_matrix_checks_but_has_no_lock(workdir: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(workdir, GOOD, "check", "--locked", capsys=capsys)
    assert code == 1  # compatible pins, but no lock yet: --locked makes that an error
    assert "no lock at locks/t.txt" in err
    assert "pinned by tag only" in err  # tag-only base warns
    # without --locked the missing lock is named as the next step: `check && lock` goes on
    code = main(["check", "--matrix", str(workdir / "matrix.yaml")])
    out = capsys.readouterr().out
    assert code == 0 and "t: ok, not locked: no lock at" in out
    assert "build-env lock --target t" in out


def test_repository_matrix_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["check", "--matrix", str(REPO / "matrix.yaml")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count(": ok") == 6
