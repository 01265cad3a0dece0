"""Issue 38, ``verify``'s messages (the pure part; the CLI and the engine: tests/cli/
test_messages_38c.py): ``--timeout`` refused by the parser, no self-test option suggested to a
user of ``verify``, and the text output saying what the ABI and coverage phases read and how long
each phase took; reports here are made by the real self-test code, never typed in."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

from builder.commands import verify
from builder.gate import ending
from builder.gate.record import GateRecord
from builder.gate.verdicts import Verdict
from builder.selftest import cli as selftest_cli
from builder.selftest.phases import abi
from builder.selftest.phases.coverage import check_coverage
from tests.selftest.test_devcode import make_site, run_for


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="build-env verify")
    verify.add_arguments(p)
    return p


def options(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions for s in a.option_strings}


@pytest.mark.parametrize("value", ["0", "-5", "0.0", "nan", "inf", "soon"])
def test_timeout_not_above_zero_is_refused_by_the_parser(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["img", "--timeout", value])
    assert exc.value.code == 2
    assert f"--timeout: expected a number > 0, got {value!r}" in capsys.readouterr().err
    assert parser().parse_args(["img", "--timeout", "2.5"]).timeout == 2.5


def _no_manifest_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Verdict:
    """What the gate makes of the real self-test run on an image without a manifest."""
    out = tmp_path / "report.json"
    code = selftest_cli.main(["--manifest", str(tmp_path / "none.json"), "--json", str(out)])
    logs = capsys.readouterr().err
    assert code == 3 and "(pass --manifest)" in logs  # the self-test's advice, for its own users
    gate = GateRecord("cpu", ("preflight",), ("preflight",), ())
    return ending.finish("img", gate, exit_code=code, report=json.loads(out.read_text()),
                         logs=logs, seconds=1.0, timeout=900)


@pytest.mark.parametrize("sif", [False, True])
def test_an_image_without_a_manifest_is_told_what_verify_accepts(
        sif: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    v = _no_manifest_verdict(tmp_path, capsys)
    image = "debian:bookworm"
    if sif:
        image = str(tmp_path / "foreign.sif")
        Path(image).write_bytes(b"not built here")
    p = parser()
    args = p.parse_args([image])
    verify._print(args, v, "headline")
    cap = capsys.readouterr()
    text = cap.out + cap.err
    assert "--manifest" not in text, text
    assert "no verl-env manifest" in text
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text))
    assert named and named <= options(p) | {"--sif"}, named  # --sif: build-env's, named so
    assert "--target" in named
    assert "--manifest" not in options(p)
    if not sif:
        assert p.parse_args([image, "--target", "T", "--matrix", "/m.yaml"]).target == "T"
    assert "--manifest" not in json.dumps(v.report)  # the recorded verdict says it too


def _package_site(tmp_path: Path, *packages: str) -> Path:
    """A site directory holding real installed packages with their ELF files and dist-info."""
    site = tmp_path / "site"
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            pytest.skip(f"{name} is not installed here")
        src = Path(next(iter(spec.submodule_search_locations)))
        shutil.copytree(src, site / name)
        for info in src.parent.glob("*.dist-info"):
            record = info / "RECORD"
            if record.is_file() and f"{name}/" in record.read_text():
                shutil.copytree(info, site / info.name)
    return site


def _report(tmp_path: Path) -> dict:
    """A report of the real ABI phase (two installed distributions with extension modules) and
    the real coverage phase (a site with CUDA fat binaries)."""
    site = _package_site(tmp_path, "yaml", "markupsafe")
    checks = abi.check_abi(abi.Run({"manifest": {"accelerator": "cpu"}, "options": {}}),
                           [str(site)])
    checks += check_coverage(run_for(["sm_80", "sm_90"]), [str(make_site(tmp_path))])
    return {"overall": "pass", "checks": [c.to_dict() for c in checks]}


def _value(report: dict, cid: str) -> dict:
    return next(c["value"] for c in report["checks"] if c["id"] == cid)


def test_text_output_says_what_the_abi_and_coverage_phases_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _report(tmp_path)
    a, c = _value(report, "abi.scan"), _value(report, "coverage.scan")
    assert a["distributions"] == 2 and a["objects"] >= 2  # yaml's and markupsafe's extensions
    verify._print(parser().parse_args(["img"]), Verdict("img", 0, report), "img: pass")
    out = capsys.readouterr().out
    abi_line = next(line for line in out.splitlines() if line.strip().startswith("abi:"))
    for part in (f"{a['elf_files']:,} ELF file", f"{a['objects']:,} shared object",
                 f"{a['distributions']} distributions", f"{a['symbols']:,} undefined symbol",
                 f"in {a['seconds']:.2f} s"):
        assert part in abi_line, (part, abi_line)
    cov_line = next(line for line in out.splitlines() if line.strip().startswith("coverage:"))
    for part in (f"{c['elf_files']:,} ELF file", f"{c['libraries']:,} libraries",
                 f"{c['distributions']} distribution", "sm_80, sm_90", f"in {c['seconds']:.2f} s"):
        assert part in cov_line, (part, cov_line)


def test_each_phase_gets_a_progress_line_in_text_mode_only(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _report(tmp_path)
    v = Verdict("sha256:feed", 0, report)
    verify._print(parser().parse_args(["img"]), v, "img: pass")
    err = capsys.readouterr().err
    for phase in ("abi", "coverage"):
        checks = [c for c in report["checks"] if c["phase"] == phase]
        seconds = sum(c["duration_s"] for c in checks)
        line = next(x for x in err.splitlines() if x.startswith(f"[img] {phase} "))
        assert f"{len(checks)} checks" in line and line.endswith(f"{seconds:.1f} s"), line
        statuses = {c["status"] for c in checks}
        word = "fail" if "fail" in statuses else "warn" if "warn" in statuses else "pass"
        assert line.split()[2] == word, line
    verify._print(parser().parse_args(["img", "--json"]), v, "img: pass")
    cap = capsys.readouterr()
    assert json.loads(cap.out)["checks"] == report["checks"]  # stdout: the report, nothing else
    assert "[img]" not in cap.err and "abi:" not in cap.out + cap.err
