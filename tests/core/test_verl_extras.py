"""Each stack holds verl's own extras (issue 37 item 1): the difference between a shipped lock
and what verl 0.9.1 declares for the target's extras is computed from verl's recorded
Requires-Dist (metadata/pypi-snapshot.json), and only the matrix's reviewed
``extras_exceptions`` may differ; `check` refuses any other difference (file:line: key)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from builder.cli import main
from builder.errors import SpecError
from builder.matrix.spec import load_matrix
from builder.resolve import extras
from builder.resolve.lock import lock_path, parse_lock
from builder.resolve.metadata import load_snapshot
from builder.render.baked import manifest

REPO = Path(__file__).resolve().parents[2]
FSDP = ("cuda-x86_64", "cuda-arm64", "cuda-x86_64-sglang")
MEGATRON = ("cuda-x86_64-megatron", "cuda-arm64-megatron")


def _snapshot():
    return load_snapshot(REPO / "metadata" / "pypi-snapshot.json")


def _locked(name: str) -> dict[str, str]:
    t = load_matrix(REPO / "matrix.yaml").target(name)
    return {n: p.version for n, p in parse_lock(lock_path(REPO / "matrix.yaml", t).read_text())
            .items()}


def _verl_declares(extra: str) -> dict[str, str]:
    """verl 0.9.1's own requirements for ``extra`` (its references to its own extras
    followed), read here from the recorded Requires-Dist independently of the module."""
    rel = _snapshot().release("verl", "0.9.1")
    reqs = [Requirement(line) for line in rel.requires_dist]
    out, todo, seen = {}, [extra], set()
    while todo:
        e = todo.pop()
        if e in seen:
            continue
        seen.add(e)
        for r in reqs:
            if r.marker is not None and f'extra == "{e}"' in str(r.marker):
                if r.name == "verl":
                    todo += list(r.extras)
                else:
                    out[r.name.lower().replace("_", "-")] = str(r.specifier)
    return out


@pytest.mark.parametrize("name", FSDP + MEGATRON)
def test_the_lock_holds_what_verls_extras_declare_but_the_reviewed_exceptions(name: str) -> None:
    t = load_matrix(REPO / "matrix.yaml").target(name)
    locked = _locked(name)
    asked = [e for e in t.package("verl").extras]
    want: dict[str, str] = {}
    for e in asked:
        want.update(_verl_declares(e))
    missing = {n for n, spec in want.items()
               if n not in locked or (spec and not Requirement(f"x{spec}").specifier.contains(
                   locked[n], prereleases=True))}
    assert missing == {n for n, _ in t.extras_exceptions}, (missing, t.extras_exceptions)
    # the module computes the same
    diffs = extras.differences(t, _snapshot(), locked)
    assert {d.declared.name for d in diffs} == missing
    assert all(d.reason for d in diffs)
    assert extras.difference_errors(t, _snapshot(), locked) == []


@pytest.mark.parametrize("name", FSDP)
def test_fsdp_and_sglang_locks_hold_the_fsdp_extra(name: str) -> None:
    t = load_matrix(REPO / "matrix.yaml").target(name)
    assert "fsdp" in t.package("verl").extras
    locked = _locked(name)
    assert locked["cupy-cuda13x"] == "14.0.1" and locked["trl"] == "0.27.0"
    assert locked["flash-linear-attention"] == "0.5.2" and "liger-kernel" in locked


@pytest.mark.parametrize("name", MEGATRON)
def test_megatron_locks_hold_the_megatron_extra(name: str) -> None:
    t = load_matrix(REPO / "matrix.yaml").target(name)
    assert set(t.package("verl").extras) == {"megatron", "vllm"}
    locked = _locked(name)
    assert locked["cupy-cuda13x"] == "14.0.1" and locked["trl"] == "0.27.0"
    assert "liger-kernel" in locked
    assert {n for n, _ in t.extras_exceptions} == {"apex", "flash-attn", "megatron-bridge"}


@pytest.mark.parametrize("name", FSDP + MEGATRON)
def test_the_gate_imports_the_extras_packages(name: str) -> None:
    t = load_matrix(REPO / "matrix.yaml").target(name)
    imports = manifest(t, "m", "l", installed=_locked(name))["imports"]
    want = {"cupy-cuda13x": "cupy", "trl": "trl", "liger-kernel": "liger_kernel"}
    if name in FSDP:
        want.update({"flash-linear-attention": "fla.layers", "fla-core": "fla"})
    assert {n: imports.get(n) for n in want} == want


def test_an_unreviewed_difference_is_an_error_naming_the_extras_line() -> None:
    t = load_matrix(REPO / "matrix.yaml").target("cuda-x86_64")
    locked = {n: v for n, v in _locked("cuda-x86_64").items() if n != "trl"}
    locked["cupy-cuda13x"] = "13.6.0"
    errors = [str(e) for e in extras.difference_errors(t, _snapshot(), locked)]
    line = t.lines["packages.verl.extras"] if "packages.verl.extras" in t.lines \
        else t.lines["packages.verl"]
    assert len(errors) == 2, errors
    assert all(e.startswith(f"{t.file}:{line}: targets.cuda-x86_64.packages.verl.extras: ")
               for e in errors), errors
    assert any("verl[fsdp] declares trl==0.27.0: not in the lock" in e for e in errors)
    assert any("cupy-cuda13x==14.0.1: the lock holds 13.6.0" in e for e in errors)


def _site(tmp_path: Path, edit) -> Path:
    for part in ("metadata", "locks"):
        shutil.copytree(REPO / part, tmp_path / part)
    text = (REPO / "matrix.yaml").read_text()
    (tmp_path / "matrix.yaml").write_text(edit(text))
    return tmp_path / "matrix.yaml"


def test_check_refuses_an_exception_no_extra_declares(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = _site(tmp_path, lambda s: s.replace(
        "    extras_exceptions:\n      flash-attn:",
        '    extras_exceptions:\n      leftpad: "a package verl does not declare at all"\n'
        "      flash-attn:", 1))
    rc = main(["check", "--matrix", str(path), "--target", "cuda-x86_64"])
    err = capsys.readouterr().err
    line = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if "leftpad:" in ln)
    assert rc == 2, err
    assert (f"matrix.yaml:{line}: targets.cuda-x86_64.extras_exceptions.leftpad: no extra this "
            "target asks for declares leftpad") in err, err


def test_check_json_shows_the_difference_and_its_reason(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--matrix", str(REPO / "matrix.yaml"), "--target",
                 "cuda-x86_64-megatron", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["targets"][0]
    diffs = {d["name"]: d for d in result["extras"]["differences"]}
    assert set(diffs) == {"apex", "flash-attn", "megatron-bridge"}
    assert diffs["megatron-bridge"]["declared"] == "==0.5.2"
    assert diffs["megatron-bridge"]["locked"] is None
    assert "not published on the index" in diffs["megatron-bridge"]["reason"]


def test_a_bad_exception_names_file_line_key(tmp_path: Path) -> None:
    path = _site(tmp_path, lambda s: s.replace(
        "    extras_exceptions:\n      flash-attn: \"verl's fsdp extra pins",
        "    extras_exceptions:\n      flash-attn: \"short\"\n      x: \"verl's fsdp extra pins",
        1))
    with pytest.raises(SpecError) as err:
        load_matrix(path)
    assert "targets.cuda-x86_64.extras_exceptions.flash-attn" in str(err.value)
    assert "give the reason in words" in str(err.value)


def test_lock_refuses_an_exception_no_extra_declares_before_resolving(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _site(tmp_path, lambda s: s.replace(
        "    extras_exceptions:\n      flash-attn:",
        '    extras_exceptions:\n      leftpad: "a package verl does not declare at all"\n'
        "      flash-attn:", 1))
    before = (tmp_path / "locks" / "cuda-x86_64.txt").read_text()
    rc = main(["lock", "--matrix", str(path), "--target", "cuda-x86_64", "--offline"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "targets.cuda-x86_64.extras_exceptions.leftpad: no extra this target asks for" in err
    assert (tmp_path / "locks" / "cuda-x86_64.txt").read_text() == before
