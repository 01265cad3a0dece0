"""Reviewed dependency overrides (builder.matrix.overrides, issue 31 item 1): matrix data with a reason,
held to the grammars with file:line:key errors, shown by `check` and `list`, resolved by `lock`
as uv's --override and nothing else, recorded in the lock's header under its body digest and
in the image's manifest and labels. The shipped SGLang target needs one (sglang 0.5.12 pins
transformers==5.6.0, which verl 0.9.1 excludes)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from builder.resolve import lock as lockmod
from builder.resolve import lockfile as lockbody
from builder.matrix import overrides
from builder.cli import main
from builder.resolve.compat import check_target
from builder.resolve.metadata import load_snapshot
from builder.render.baked import labels, manifest
from builder.matrix.spec import apply_overrides, load_matrix

REPO = Path(__file__).resolve().parents[2]
SGL = "cuda-x86_64-sglang"
REASON = "sglang 0.5.12 pins transformers==5.6.0, which verl 0.9.1 excludes"

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
      sglang: "0.5.12"
      ray: "2.60.0"
      transformers: "5.9.0"
      tensordict: "0.10.0"
      verl: {version: "0.9.1", extras: [sglang]}
    gpus: [sm_80, sm_90]
"""
OVERRIDE = f"""\
    overrides:
      transformers:
        version: "5.9.0"
        reason: "{REASON}"
"""


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "metadata").mkdir()
    shutil.copy(REPO / "metadata" / "pypi-snapshot.json", tmp_path / "metadata")
    return tmp_path


def _run(workdir: Path, text: str, *args: str, capsys: pytest.CaptureFixture[str]
         ) -> tuple[int, str, str]:
    (workdir / "matrix.yaml").write_text(text)
    before = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        code = main([*args, "--matrix", "matrix.yaml"])
    finally:
        os.chdir(cwd)
    assert sorted(p.relative_to(workdir) for p in workdir.rglob("*")) == before
    out = capsys.readouterr()
    return code, out.out, out.err


def _line_of(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


BAD = [
    ("reason: \"{}\"".format(REASON), "reason: \"short\"", "reason", "give the reason in words"),
    ("reason: \"{}\"".format(REASON), "why: \"{}\"".format(REASON), "why", "unknown key 'why'"),
    ("version: \"5.9.0\"", "version: \"5.9.0; rm -rf\"", "version", "invalid version"),
    ("version: \"5.9.0\"", "version: \"5.8.0\"", "transformers",
     "but packages.transformers pins 5.9.0"),
    ("      transformers:\n", "      transformers==5.9.0:\n", "transformers==5.9.0",
     "is not a distribution name"),
    ("reason: \"{}\"".format(REASON), "reason: \"{}\\u0007 bell\"".format(REASON), "reason",
     "control"),
]


@pytest.mark.parametrize("old,new,key,message", BAD,
                         ids=["short-reason", "unknown-key", "bad-version", "contradicts-pin",
                              "not-a-name", "control-character"])
def test_a_bad_override_is_one_line_naming_file_line_key(
        workdir: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, key: str,
        message: str) -> None:
    text = (GOOD + OVERRIDE).replace(old, new)
    code, _, err = _run(workdir, text, "check", capsys=capsys)
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    m = re.match(r"error: matrix\.yaml:(\d+): targets\.t\.overrides\.(\S+?):", lines[0])
    assert m and int(m.group(1)) >= _line_of(text, "overrides:"), lines[0]
    assert key in m.group(2) and message in lines[0], lines[0]


def test_a_missing_reason_is_refused(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = GOOD + OVERRIDE.replace(f'        reason: "{REASON}"\n', "")
    code, _, err = _run(workdir, text, "check", capsys=capsys)
    assert code == 2
    assert re.search(r"matrix\.yaml:\d+: targets\.t\.overrides\.transformers: .*missing key "
                     r"'reason'", err), err


def test_without_the_override_check_fails_on_sglangs_pin(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The conflict is real: without the reviewed override `check` fails naming it; with it,
    `check` passes and says what the override replaces and why."""
    code, _, err = _run(workdir, GOOD, "check", capsys=capsys)
    assert code == 1
    assert ("conflict on transformers: sglang 0.5.12 requires transformers==5.6.0 but verl 0.9.1 "
            "requires transformers!=5.6.0") in err, err
    code, out, err = _run(workdir, GOOD + OVERRIDE, "check", "--json", capsys=capsys)
    assert code == 0, err
    result = json.loads(out)["targets"][0]
    assert result["overrides"] == [{
        "name": "transformers", "version": "5.9.0", "reason": REASON,
        "replaces": ["sglang 0.5.12 requires transformers==5.6.0"]}]
    code, _, err = _run(workdir, GOOD + OVERRIDE, "check", capsys=capsys)
    assert ("override: t: transformers==5.9.0 replaces sglang 0.5.12 requires "
            f"transformers==5.6.0 ({REASON})") in err


def test_the_override_replaces_only_its_own_package(workdir: Path) -> None:
    """Any other unmet requirement still fails: an override of transformers does not excuse
    sglang's torch pin."""
    (workdir / "matrix.yaml").write_text(GOOD.replace('torch: "2.11.0"', 'torch: "2.10.0"')
                                         + OVERRIDE)
    t = load_matrix(workdir / "matrix.yaml").target("t")
    problems = [str(p) for p in check_target(t, load_snapshot(
        workdir / "metadata" / "pypi-snapshot.json"))]
    assert any("sglang 0.5.12's requirement torch==2.11.0" in p for p in problems), problems
    assert not any("transformers" in p for p in problems), problems


def test_list_shows_the_shipped_sglang_override(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--matrix", str(REPO / "matrix.yaml")]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith(SGL + " "))
    assert "sglang 0.5.12" in row and "5.9.0" in row
    assert re.search(rf"^{SGL}: override transformers==5\.9\.0 \(sglang 0\.5\.12 pins "
                     r"transformers==5\.6\.0", out, re.M), out
    assert main(["list", "--json", "--matrix", str(REPO / "matrix.yaml")]) == 0
    entry = json.loads(capsys.readouterr().out)["targets"][SGL]
    assert entry["overrides"]["transformers"]["version"] == "5.9.0"
    assert "verl 0.9.1 excludes" in entry["overrides"]["transformers"]["reason"]


def test_the_shipped_lock_records_the_override_under_its_digest() -> None:
    """The committed lock: the override line in the header, the body digest covering it, the
    lock current for the matrix (no re-resolution)."""
    matrix = load_matrix(REPO / "matrix.yaml")
    t = matrix.target(SGL)
    path = REPO / "locks" / f"{SGL}.txt"
    text = path.read_text()
    header, body, _ = lockbody.split(text)
    assert overrides.recorded(header) == {"transformers": "5.9.0"}
    assert lockbody.COVERED_KEY == overrides.LOCK_KEY
    snapshot = load_snapshot(REPO / "metadata" / "pypi-snapshot.json")
    assert lockmod.stale_reason(t, snapshot, path) is None
    assert "#   --override overrides.txt" in body  # uv says which entry the override moved
    pins = lockmod.parse_lock(body)
    assert pins["transformers"].version == "5.9.0" and pins["sglang"].version == "0.5.12"
    assert "flash-attn" not in pins and "flash-attn-4" in pins


def test_an_edited_override_line_is_an_edit(tmp_path: Path) -> None:
    text = (REPO / "locks" / f"{SGL}.txt").read_text()
    edited = text.replace("# override: transformers==5.9.0", "# override: transformers==5.6.0")
    assert edited != text
    found = lockbody.problems(tmp_path / "x.txt", edited, "build-env lock --target x")
    assert found and "`# override:` lines are not the ones" in found[0], found
    assert lockbody.problems(tmp_path / "x.txt", text, "build-env lock --target x") == []


def test_the_input_hash_covers_the_override(workdir: Path) -> None:
    (workdir / "matrix.yaml").write_text(GOOD + OVERRIDE)
    t = load_matrix(workdir / "matrix.yaml").target("t")
    snap = load_snapshot(workdir / "metadata" / "pypi-snapshot.json")
    other = load_matrix_text(workdir, GOOD + OVERRIDE.replace("excludes", "refuses"))
    assert lockmod.input_hash(t, snap) == lockmod.input_hash(other, snap)  # reason: not resolved
    (workdir / "matrix.yaml").write_text(GOOD)
    assert lockmod.input_hash(load_matrix(workdir / "matrix.yaml").target("t"), snap) \
        != lockmod.input_hash(t, snap)


def load_matrix_text(workdir: Path, text: str):  # type: ignore[no-untyped-def]
    (workdir / "m2.yaml").write_text(text)
    return load_matrix(workdir / "m2.yaml").target("t")


def test_lock_passes_exactly_the_override_to_uv(monkeypatch: pytest.MonkeyPatch,
                                               workdir: Path) -> None:
    """`lock` gives uv the override file with the reviewed requirement and nothing else."""
    seen: list[tuple[list[str], str | None]] = []

    def fake_run(cmd, **kw):  # type: ignore[no-untyped-def]
        cwd = Path(kw["cwd"])
        forced = (cwd / "overrides.txt").read_text() if "--override" in cmd else None
        seen.append((cmd, forced))
        (cwd / "lock.txt").write_text("transformers==5.9.0 \\\n    --hash=sha256:" + "a" * 64
                                      + "\n    # via -r requirements.in\n")

        class P:
            returncode, stderr = 0, ""
        return P()

    monkeypatch.setattr(lockmod.children, "run", fake_run)
    (workdir / "matrix.yaml").write_text(GOOD + OVERRIDE)
    t = load_matrix(workdir / "matrix.yaml").target("t")
    snap = load_snapshot(workdir / "metadata" / "pypi-snapshot.json")
    out = workdir / "locks" / "t.txt"
    lockmod.compile_lock(t, snap, out)
    cmd, forced = seen[0]
    assert cmd.count("--override") == 1 and forced == "transformers==5.9.0\n"
    header = lockbody.split(out.read_text())[0]
    assert f"# override: transformers==5.9.0 ({REASON})\n" in header
    (workdir / "matrix.yaml").write_text(GOOD)
    lockmod.compile_lock(load_matrix(workdir / "matrix.yaml").target("t"), snap, out)
    assert "--override" not in seen[1][0] and "# override:" not in out.read_text()


def test_manifest_and_labels_carry_the_override() -> None:
    t = load_matrix(REPO / "matrix.yaml").target(SGL)
    m = manifest(t, "sha256:m", "sha256:l")
    assert m["overrides"]["transformers"]["version"] == "5.9.0"
    assert m["imports"]["sglang"] == "sglang" and m["imports"]["sglang-kernel"] == "sgl_kernel"
    assert "flash-attn" not in m["imports"]
    lab = labels(t, "sha256:m", "sha256:l", None)
    assert lab["org.verl-env.dep-override.transformers"].startswith("5.9.0 (sglang 0.5.12 pins")
    plain = load_matrix(REPO / "matrix.yaml").target("cuda-x86_64")
    assert "overrides" not in manifest(plain, "sha256:m", "sha256:l")
    assert not any("dep-override" in k for k in labels(plain, "sha256:m", "sha256:l", None))


def test_a_set_build_keeps_the_override() -> None:
    """An override build (--set python=3.11, as the acceptance script does) re-locks with the
    same reviewed override."""
    t = load_matrix(REPO / "matrix.yaml").target(SGL)
    o = apply_overrides(t, ["python=3.11"])
    assert o.override and o.overrides == t.overrides
    assert o.package("sglang-kernel").module == "sgl_kernel"  # the gate still imports it
    assert manifest(o, "sha256:m", "sha256:l")["imports"]["sglang-kernel"] == "sgl_kernel"
