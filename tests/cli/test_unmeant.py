"""Issue 37 item 2, as a new user types it, through the installed ``build-env`` on a small site:
an override of a package the target does not install, an override that repeats its pin, an
extra the pinned package does not declare. Each is said at `check` naming file:line: key; the
two that cannot be meant are refused (exit 2) by `check` and by `lock`, which writes nothing."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import FIXTURE, run_build_env

T = "cpu-x86_64"
PINS_END = '      uvicorn: "0.54.0"\n\n  # The same'
LEFTPAD = ('      uvicorn: "0.54.0"\n    overrides:\n      leftpad:\n        version: "1.0.0"\n'
           '        reason: "a new user trying an override of something\"\n\n  # The same')
ECHO = ('      uvicorn: "0.54.0"\n    overrides:\n      transformers:\n        version: "5.9.0"\n'
        '        reason: "the version the pin already says\"\n\n  # The same')
VERL = '      verl: "0.9.1"\n      # verl.trainer'
TYPO = '      verl: {version: "0.9.1", extras: [vllmx]}\n      # verl.trainer'


def _site(tmp: Path, old: str, new: str, locks: bool = True) -> Path:
    site = tmp / "site"
    site.mkdir()
    text = FIXTURE.read_text()
    assert text.count(old) == 1
    (site / "matrix.yaml").write_text(text.replace(old, new))
    shutil.copytree(FIXTURE.parent / "metadata", site / "metadata")
    if locks:
        shutil.copytree(FIXTURE.parent / "locks", site / "locks")
    return site


def _files(site: Path) -> dict[str, bytes]:
    return {str(p.relative_to(site)): p.read_bytes() for p in sorted(site.rglob("*"))
            if p.is_file()}


def _line_of(site: Path, needle: str) -> int:
    lines = (site / "matrix.yaml").read_text().splitlines()
    return next(i for i, ln in enumerate(lines, 1) if needle in ln)


def _one_error(stderr: str) -> str:
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


@pytest.mark.parametrize("argv", [["check"], ["check", "--locked"],
                                  ["lock", "--offline", "--no-fetch"],
                                  ["render", "--output", "{tmp}/ctx"]],
                         ids=["check", "check-locked", "lock", "render"])
def test_an_override_of_a_package_the_target_does_not_install(tmp_path: Path,
                                                               argv: list[str]) -> None:
    site = _site(tmp_path, PINS_END, LEFTPAD)
    before = _files(site)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    proc = run_build_env(*argv, "--matrix", str(site / "matrix.yaml"), "--target", T)
    assert proc.returncode == 2, proc.stderr
    assert not (tmp_path / "ctx").exists()
    line = _line_of(site, "leftpad:")
    assert _one_error(proc.stderr).startswith(
        f"error: {site / 'matrix.yaml'}:{line}: targets.{T}.overrides.leftpad: leftpad is not "
        f"installed by this target (not in locks/{T}.txt"), proc.stderr
    assert _files(site) == before  # nothing written: the lock is the one it was


def test_before_the_first_lock_check_says_it_cannot_tell(tmp_path: Path) -> None:
    site = _site(tmp_path, PINS_END, LEFTPAD, locks=False)
    proc = run_build_env("check", "--matrix", str(site / "matrix.yaml"), "--target", T)
    assert proc.returncode == 0, proc.stderr
    line = _line_of(site, "leftpad:")
    assert re.search(rf"^warning: {re.escape(str(site / 'matrix.yaml'))}:{line}: "
                     rf"targets\.{T}\.overrides\.leftpad: cannot tell whether this target "
                     r"installs leftpad \(no locks/.*`build-env lock` refuses", proc.stderr,
                     re.M), proc.stderr


def test_an_override_equal_to_the_pin_warns_in_one_line(tmp_path: Path) -> None:
    site = _site(tmp_path, PINS_END, ECHO)
    proc = run_build_env("check", "--matrix", str(site / "matrix.yaml"), "--target", T)
    assert proc.returncode == 0, proc.stderr
    line = _line_of(site, "    overrides:") + 1  # the override's key, not the pin's
    warned = [ln for ln in proc.stderr.splitlines()
              if ln.startswith(f"warning: {site / 'matrix.yaml'}:{line}: "
                               f"targets.{T}.overrides.transformers: ")]
    assert len(warned) == 1 and "packages.transformers pins" in warned[0], proc.stderr


@pytest.mark.parametrize("argv", [["check"], ["lock", "--offline", "--no-fetch"]],
                         ids=["check", "lock"])
def test_an_unknown_extra_names_the_extras_that_exist(tmp_path: Path, argv: list[str]) -> None:
    site = _site(tmp_path, VERL, TYPO)
    before = _files(site)
    proc = run_build_env(*argv, "--matrix", str(site / "matrix.yaml"), "--target", T)
    assert proc.returncode == 2, proc.stderr
    error = _one_error(proc.stderr)
    line = _line_of(site, "vllmx")
    assert error.startswith(f"error: {site / 'matrix.yaml'}:{line}: targets.{T}.packages.verl."
                            "extras: verl 0.9.1 has no extra 'vllmx' (it declares: "), error
    declared = error.split("it declares: ", 1)[1].split(";", 1)[0].split(", ")
    assert {"vllm", "sglang", "fsdp", "megatron", "verl-core"} <= set(declared), error
    assert _files(site) == before
