"""Messages a new user met that were wrong (issue 38), through the installed ``build-env``:
each one says what the user did, in the user's own words and paths, with the documented exit
code, and nothing is written by a refused command."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from tests.conftest import FIXTURE, REPO, run_build_env

SLURM_DOC = REPO / "docs" / "slurm.md"


def _site(tmp: Path) -> Path:
    site = tmp / "site"
    site.mkdir()
    shutil.copy(FIXTURE, site / "matrix.yaml")
    shutil.copytree(FIXTURE.parent / "metadata", site / "metadata")
    shutil.copytree(FIXTURE.parent / "locks", site / "locks")
    return site


def _tree(root: Path) -> list[str]:
    return sorted(str(p) for p in root.rglob("*"))


def _refused(proc: object, code: int = 2) -> str:
    out, err = proc.stdout, proc.stderr  # type: ignore[attr-defined]
    assert proc.returncode == code, out + err  # type: ignore[attr-defined]
    assert "Traceback" not in err, err
    return err


def test_slurm_output_naming_a_directory_names_that_directory(tmp_path: Path) -> None:
    site = _site(tmp_path)
    sif = tmp_path / "img.sif"
    sif.write_bytes(b"not a sif: the script is only written")
    out = tmp_path / "jobs"
    out.mkdir()
    before = _tree(tmp_path)
    proc = run_build_env("slurm", "--target", "cpu-x86_64", "--runtime", "apptainer",
                         "--sif", str(sif), "--train-cmd", "python3 train.py", "--nodes", "1",
                         "--no-train-check", "--output", str(out), cwd=site, timeout=300)
    err = _refused(proc)
    assert f"{out}: cannot write: Is a directory" in err, err
    assert ".part" not in err and f".{out.name}." not in err, "names the tool's temporary file"
    assert _tree(tmp_path) == before, "nothing may be written"


@pytest.mark.parametrize("where", ["/proc/verl-env-38a", "/proc/verl-env-38a/deeper"])
def test_render_output_that_cannot_be_made_names_the_output(tmp_path: Path, where: str) -> None:
    site = _site(tmp_path)
    before = _tree(tmp_path)
    proc = run_build_env("render", "--target", "cpu-x86_64", "--no-fetch", "--output", where,
                         cwd=site, timeout=300)
    err = _refused(proc)
    assert f"{where}: cannot write" in err, err
    assert "/proc/." not in err, "names the tool's staging directory"
    assert _tree(tmp_path) == before


def test_list_quiet_prints_the_target_names_only(tmp_path: Path) -> None:
    site = _site(tmp_path)
    full = run_build_env("list", "--json", cwd=site, timeout=300)
    assert full.returncode == 0, full.stderr
    table = run_build_env("list", cwd=site, timeout=300).stdout.split("\n\n")[0]
    names = [row.split()[0] for row in table.splitlines()[1:]]  # the table's order
    assert sorted(names) == sorted(json.loads(full.stdout)["targets"]) and names
    for flag in ("--quiet", "-q"):
        proc = run_build_env("list", flag, cwd=site, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.splitlines() == names, proc.stdout
        assert proc.stderr == ""


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "inf"])
def test_a_bad_network_timeout_is_refused_naming_the_variable(tmp_path: Path, value: str
                                                              ) -> None:
    site = _site(tmp_path)
    before = _tree(tmp_path)
    proc = run_build_env("list", env={"VERL_ENV_NETWORK_TIMEOUT": value}, cwd=site,
                         timeout=300)
    err = _refused(proc)
    assert "VERL_ENV_NETWORK_TIMEOUT" in err and repr(value) in err, err
    assert "> 0" in err, err
    assert proc.stdout == ""
    assert _tree(tmp_path) == before


def test_a_good_network_timeout_is_taken(tmp_path: Path) -> None:
    proc = run_build_env("list", "-q", env={"VERL_ENV_NETWORK_TIMEOUT": "7.5"},
                         cwd=_site(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("option", ["--matrix", "--snapshot"])
def test_an_empty_site_path_is_named_as_empty(tmp_path: Path, option: str) -> None:
    proc = run_build_env("check", option, "", cwd=tmp_path, timeout=300)
    err = _refused(proc)
    assert f"argument {option}: '' is not a path" in err and "empty" in err, err
    assert "Is a directory" not in err and "cannot read matrix" not in err, err


def test_init_refuses_a_directory_holding_other_files(tmp_path: Path) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("the user's own\n")
    before = _tree(tmp_path)
    proc = run_build_env("init", str(target), cwd=tmp_path, timeout=300)
    err = _refused(proc)
    assert str(target) in err and "notes.txt" in err and "not empty" in err, err
    assert "nothing written" in err
    assert _tree(tmp_path) == before


def test_init_keeps_a_git_directory_and_quotes_the_cd_path(tmp_path: Path) -> None:
    target = tmp_path / "my site"
    (target / ".git").mkdir(parents=True)
    proc = run_build_env("init", str(target), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"cd {shlex.quote(str(target))} && build-env check" in proc.stdout, proc.stdout
    assert (target / "matrix.yaml").is_file() and (target / ".git").is_dir()


def test_lock_refuses_upgrade_with_upgrade_package(tmp_path: Path) -> None:
    site = _site(tmp_path)
    before = {p: p.read_bytes() for p in (site / "locks").iterdir()}
    proc = run_build_env("lock", "--target", "cpu-x86_64", "--upgrade", "--upgrade-package",
                         "torch", cwd=site, timeout=300)
    err = _refused(proc)
    assert "--upgrade-package" in err and "not allowed with" in err and "--upgrade" in err, err
    assert {p: p.read_bytes() for p in (site / "locks").iterdir()} == before


def _doc_doctor_ids() -> list[str]:
    """The ids in docs/slurm.md's `build-env doctor` table (the cluster-node checks)."""
    text = SLURM_DOC.read_text()
    section = text[text.index("## `build-env doctor`"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"^\| `([a-z_.]+)` \|", section, flags=re.M)


def test_doctor_cluster_ids_are_the_documented_ones_and_values_are_rounded(
        tmp_path: Path) -> None:
    env = {"HF_HOME": str(tmp_path / "hf")}
    proc = run_build_env("doctor", "--cluster", "--cuda", "12.8", "--json", env=env,
                         cwd=tmp_path, timeout=300)
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    findings = json.loads(proc.stdout)["findings"]
    assert [f["id"] for f in findings] == _doc_doctor_ids()
    shm = next(f for f in findings if f["id"] == "preflight.shm")
    if shm["status"] == "ok":  # a passing size is the value: rounded, with its unit
        assert re.fullmatch(r"\d+(\.\d{1,2})? GiB \(>= 1 GiB\)", shm["message"]), shm
    text = run_build_env("doctor", "--cluster", "--cuda", "12.8", env=env, cwd=tmp_path,
                         timeout=300).stdout
    line = next(x for x in text.splitlines() if " preflight.shm " in x)
    assert not re.search(r"\d\.\d{3,}", line), line
    rows = [x for x in text.splitlines() if x.startswith("[")]
    message_at = {x.index(x[7:].split(None, 1)[1], 7 + len(x[7:].split(None, 1)[0]))
                  for x in rows}
    assert len(message_at) == 1, "every message starts in one column:\n" + text
