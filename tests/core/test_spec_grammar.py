"""Every matrix string that reaches a template is held to its grammar at `check` time
(builder.matrix.grammar): one line naming file:line:key, exit 2, nothing written. Then the cross-field
checks (exit 1): the target's CUDA/ROCm version against the torch build and the base image's tag,
and each source build's GPU list against what its build compiles for; and a base pinned inside
its image reference (`name:tag@sha256:...`) is pinned by digest."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from builder.cli import main
from builder.resolve.compat import accelerator_problems, torch_build
from builder.resolve.metadata import load_snapshot
from builder.matrix.spec import load_matrix
from tests.core.test_spec_errors import GOOD, REPO, _run

DIGEST = "sha256:" + "ab" * 32
IMAGE = "nvidia/cuda:13.0.2-base-ubuntu24.04"


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "metadata").mkdir()
    (tmp_path / "metadata" / "pypi-snapshot.json").write_bytes(
        (REPO / "metadata" / "pypi-snapshot.json").read_bytes())
    return tmp_path


def _sub(old: str, new: str):
    def edit(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, 1)
    return edit


HOSTILE = [
    # (name, edit, expected substrings of the one error line)
    ("base image with a newline (the issue's example)",
     _sub(f'image: "{IMAGE}"', f'image: "{IMAGE}\\nRUN echo pwned"'),
     ["matrix.yaml:7:", "targets.t.base.image:", "is not an image reference", "\\nRUN echo"]),
    ("apt package with a shell command (the issue's example)",
     _sub("    python:", '    apt: ["curl; rm -rf /", procps]\n    python:'),
     ["matrix.yaml:8:", "targets.t.apt[0]:", "not a Debian package"]),
    ("apt package with a command substitution",
     _sub("    python:", '    apt: ["$(id)"]\n    python:'),
     ["targets.t.apt[0]:", "not a Debian package"]),
    ("source image with backticks",
     _sub('glibc: "2.39"}', 'glibc: "2.39", source_image: "nvidia/cuda:`id`"}'),
     ["matrix.yaml:7:", "targets.t.base.source_image:", "not an image reference"]),
    ("bytecode image with a command substitution",
     _sub('glibc: "2.39"}', 'glibc: "2.39", bytecode_image: "debian:$(id)"}'),
     ["matrix.yaml:7:", "targets.t.base.bytecode_image:", "not an image reference"]),
    ("python with a newline", _sub('python: "3.12"', 'python: "3.12\\nRUN id"'),
     ["matrix.yaml:8:", "targets.t.python:"]),
    ("description with U+2028",
     _sub("    accelerator: cuda", '    description: "a\\u2028RUN id"\n    accelerator: cuda'),
     ["matrix.yaml:4:", "targets.t.description:", "U+2028"]),
    ("description with NEL",
     _sub("    accelerator: cuda", '    description: "a\\x85b"\n    accelerator: cuda'),
     ["targets.t.description:", "U+0085"]),
    ("package name with a newline",
     _sub('      verl: "0.9.1"', '      verl: "0.9.1"\n      "x\\nRUN id": "1.0"'),
     ["targets.t.packages.x\\nRUN id:", "U+000A"]),
    ("extra with a semicolon",
     _sub('ray: "2.60.0"', 'ray: {version: "2.60.0", extras: ["default;id"]}'),
     ["matrix.yaml:12:", "targets.t.packages.ray.extras[0]:", "not an extra name"]),
    ("version with a trailing newline", _sub('vllm: "0.24.0"', 'vllm: "0.24.0\\n"'),
     ["matrix.yaml:11:", "targets.t.packages.vllm:", "invalid version"]),
    ("base digest with a newline",
     _sub('glibc: "2.39"}', f'glibc: "2.39", digest: "{DIGEST[:-1]}\\n"}}'),
     ["targets.t.base.digest:"]),
    ("git source with a backtick",
     _sub('tensordict: "0.10.0"', 'tensordict: {version: "0.10.0", build: source, '
          'source: "git+https://h/x`id`@v1"}'),
     ["matrix.yaml:14:", "targets.t.packages.tensordict.source:", "URL"]),
    ("find_links with a newline",
     _sub("    python:", '    find_links: ["/srv/wheels\\nRUN id"]\n    python:'),
     ["targets.t.find_links[0]:", "U+000A"]),
    ("build tool with a newline",
     _sub("    python:", '    build_tools: ["ninja==1.13.0\\nRUN id"]\n    python:'),
     ["targets.t.build_tools[0]:"]),
]


@pytest.mark.parametrize("name,edit,needles", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_a_hostile_string_is_refused_at_check(workdir: Path, capsys: pytest.CaptureFixture[str],
                                              name: str, edit, needles: list[str]) -> None:
    code, err = _run(workdir, edit(GOOD), "check", capsys=capsys)  # _run: nothing written
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"


def test_a_hostile_base_image_is_refused_from_the_command_line(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--base-image and --set go through the same grammar as the matrix."""
    (workdir / "matrix.yaml").write_text(GOOD)
    with pytest.raises(SystemExit) as exc:  # the options are typed: argparse refuses, exit 2
        main(["render", "--target", "t", "--matrix", str(workdir / "matrix.yaml"),
              "--base-image", "ubuntu:24.04\nRUN id", "--out", str(workdir / "out")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err
    assert "argument --base-image: 'ubuntu:24.04\\nRUN id' is not an image reference" in err
    with pytest.raises(SystemExit) as exc:
        main(["render", "--target", "t", "--matrix", str(workdir / "matrix.yaml"),
              "--set", "python=3.12\nRUN id", "--out", str(workdir / "out")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "python" in err and "Traceback" not in err
    assert not (workdir / "out").exists()


def test_a_hostile_default_names_the_defaults_line(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A value a target inherits from `defaults:` is named at the line that wrote it."""
    text = GOOD.replace("targets:\n", 'defaults:\n  apt: [procps, "curl && id"]\ntargets:\n')
    code, err = _run(workdir, text, "check", capsys=capsys)
    assert code == 2, err
    assert "error: matrix.yaml:3: defaults.apt[1]: 'curl && id' is not a Debian package" in err


# --------------------------------------------------------------------------- cross-field checks


def test_cuda_that_disagrees_with_torch_and_the_base_fails_check(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: cuda 12.0 with torch 2.11.0 (a CUDA 13.0 build) on a 13.0.2 base."""
    code, err = _run(workdir, GOOD.replace('cuda: "13.0"', 'cuda: "12.0"'), "check",
                     capsys=capsys)
    out = capsys.readouterr().out
    assert code == 1, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    torch = next(x for x in errors if "torch" in x)
    assert "matrix.yaml:6: targets.t.cuda:" in torch
    assert "cuda 12.0 disagrees with torch 2.11.0, a CUDA 13.0 build" in torch
    assert "cuda-toolkit==13.0.2" in torch
    base = next(x for x in errors if "base.image" in x)
    assert f"disagrees with base.image {IMAGE} (CUDA 13.0)" in base
    assert "t: ok" not in out and "not locked" not in out


def test_cuda_that_agrees_passes(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(workdir, GOOD, "check", capsys=capsys)
    assert code == 0, err


def test_a_torch_local_version_names_its_build() -> None:
    """+cu128 on a cuda 13.0 target: the local version is what the torch build is for."""
    m = load_matrix(REPO / "matrix.yaml")
    snap = load_snapshot(REPO / "metadata" / "pypi-snapshot.json")
    t = m.target("cuda-x86_64")
    t = replace(t, packages=tuple(replace(p, version="2.11.0+cu128") if p.name == "torch"
                                  else p for p in t.packages))
    messages = [p.message for p in accelerator_problems(t, snap)]
    assert any("a CUDA 12.8 build (its local version +cu128)" in x for x in messages), messages
    assert accelerator_problems(replace(t, cuda="12.8", base=replace(
        t.base, image="nvidia/cuda:12.8.1-base-ubuntu24.04", source_image=None)), snap) == []


def test_a_base_tag_of_another_cuda_fails(workdir: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    text = GOOD.replace(IMAGE, "nvidia/cuda:12.8.1-base-ubuntu24.04")
    code, err = _run(workdir, text, "check", capsys=capsys)
    assert code == 1, err
    line = next(x for x in err.splitlines() if "base.image" in x)
    assert "matrix.yaml:6: targets.t.cuda: cuda 13.0 disagrees with base.image" in line
    assert "(CUDA 12.8)" in line


def test_the_reference_rocm_target_agrees_with_its_vendor_torch() -> None:
    m = load_matrix(REPO / "matrix.yaml")
    snap = load_snapshot(REPO / "metadata" / "pypi-snapshot.json")
    t = m.target("rocm-mi300")
    build = torch_build(t, snap)
    assert build is not None and (build.kind, build.version) == ("rocm", "7.0.2")
    assert accelerator_problems(t, snap) == []
    wrong = replace(t, rocm="6.4")
    messages = [p.message for p in accelerator_problems(wrong, snap)]
    assert any("disagrees with torch 2.9.1.dev20251204+rocm7.0.2" in x for x in messages)
    assert any("disagrees with base.image rocm/verl:" in x and "(ROCm 7.0.2)" in x
               for x in messages)


FLASH = '      flash-attn: {version: "2.8.3", build: source}\n'


@pytest.mark.parametrize("gpus,bad", [("[sm_75, sm_80]", "sm_75"), ("[sm_90, sm_110]", "sm_110")])
def test_a_gpu_flash_attn_builds_nothing_for_fails_check(
        workdir: Path, capsys: pytest.CaptureFixture[str], gpus: str, bad: str) -> None:
    text = GOOD.replace('      verl: "0.9.1"\n', '      verl: "0.9.1"\n' + FLASH).replace(
        "[sm_80, sm_90]", gpus)
    code, err = _run(workdir, text, "check", capsys=capsys)
    assert code == 1, err
    line = next(x for x in err.splitlines() if "flash-attn" in x)
    assert "matrix.yaml:17: targets.t.gpus:" in line
    assert f"flash-attn 2.8.3 builds no code for {bad}" in line


def test_sm_89_is_a_gpu_flash_attn_builds_for(workdir: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    text = GOOD.replace('      verl: "0.9.1"\n', '      verl: "0.9.1"\n' + FLASH).replace(
        "[sm_80, sm_90]", "[sm_86, sm_89]")
    code, err = _run(workdir, text, "check", capsys=capsys)
    assert code == 0, err


# --------------------------------------------------------------------------- the base's digest


def test_a_digest_inside_the_image_reference_pins_the_base(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`name:tag@sha256:...` is pinned by digest: no "pinned by tag only" warning."""
    code, err = _run(workdir, GOOD.replace(IMAGE, f"{IMAGE}@{DIGEST}"), "check", capsys=capsys)
    assert code == 0, err
    assert "pinned by tag only" not in err
    code, err = _run(workdir, GOOD, "check", capsys=capsys)
    assert "targets.t.base: base image" in err and "pinned by tag only" in err


def test_two_different_digests_for_one_base_are_refused(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = "sha256:" + "cd" * 32
    text = GOOD.replace(f'image: "{IMAGE}"', f'image: "{IMAGE}@{DIGEST}", digest: "{other}"')
    code, err = _run(workdir, text, "check", capsys=capsys)
    assert code == 2, err
    assert "targets.t.base.digest:" in err and "keep one" in err
