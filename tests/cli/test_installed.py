"""The tool as users have it: the wheel installed into a fresh venv, run from outside the checkout.

Everything here goes through the installed ``build-env`` executable (``run_build_env``), whose
working directory is a temporary directory that holds no part of this repository. A data file
the wheel forgets to carry (templates, the self-test, the reference matrix, its snapshot and
locks) fails these tests.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from builder.resolve.lock import parse_lock
from tests.conftest import FIXTURE, OUTSIDE, REPO, installed_build_env, run_build_env

GOLDEN = REPO / "tests" / "golden"


def _wheel_files() -> set[str]:
    venv = installed_build_env().parent.parent
    site = next(venv.glob("lib/python3*/site-packages"))
    record = next(site.glob("verl_env-*.dist-info")) / "RECORD"
    return {line.split(",")[0] for line in record.read_text().splitlines()}


# The top-level reference files and where the wheel carries them (pyproject's package-dir).
SHIPPED = {"matrix.yaml": "builder/reference/", "metadata": "builder/reference/",
           "locks": "builder/reference/", "dockerfiles": "builder/"}


def _tracked(*paths: str) -> list[str]:
    return subprocess.run(["git", "-C", str(REPO), "ls-files", *paths], check=True,
                          capture_output=True, text=True).stdout.split()


def test_the_installed_package_carries_every_file_of_builder() -> None:
    """Every tracked file under builder/ (code and data), and the top-level reference site and
    Dockerfile templates, are in the installed package, and nothing else of the checkout is."""
    tracked = _tracked("builder")
    assert tracked, "git ls-files found nothing (not a checkout?)"
    wheel = _wheel_files()
    missing = sorted(set(tracked) - wheel)
    assert missing == [], f"the wheel lacks {missing}: list them in pyproject's package-data"
    shipped = {SHIPPED[p.split("/")[0]] + p for p in _tracked(*SHIPPED)}
    assert shipped and sorted(shipped - wheel) == [], sorted(shipped - wheel)
    stray = sorted(f for f in wheel if f.startswith("builder/reference/") and f not in shipped)
    assert stray == [], f"the wheel carries checkout files it should not: {stray}"


def test_runs_outside_the_checkout_without_the_source_tree() -> None:
    assert not (OUTSIDE / "builder").exists() and REPO not in OUTSIDE.parents
    proc = subprocess.run([str(installed_build_env().parent / "python"), "-c",
                           "import builder; print(builder.__file__)"], cwd=OUTSIDE,
                          capture_output=True, text=True, check=True)
    assert "site-packages" in proc.stdout and str(REPO) not in proc.stdout


def test_list_and_check_use_the_shipped_reference_matrix() -> None:
    proc = run_build_env("list")
    assert proc.returncode == 0, proc.stderr
    for name in ("cuda-x86_64", "cuda-arm64", "rocm-mi300"):
        assert name in proc.stdout
    proc = run_build_env("check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cuda-x86_64: ok" in proc.stdout


@pytest.mark.parametrize("name", ["cuda-x86_64", "cuda-arm64", "rocm-mi300"])
def test_render_from_the_wheel_matches_the_golden_file(tmp_path: Path, name: str) -> None:
    # --no-fetch: cuda-arm64's tensordict comes from GitHub, out of reach here (the Dockerfile
    # names its recorded commit either way)
    proc = run_build_env("render", "--target", name, "--output", str(tmp_path / "ctx"),
                         "--no-fetch")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ctx" / "Dockerfile").read_text() == (GOLDEN / f"{name}.Dockerfile"
                                                             ).read_text()
    assert (tmp_path / "ctx" / "selftest" / "__main__.py").is_file()


def test_init_writes_a_site_that_checks_and_renders(tmp_path: Path) -> None:
    site = tmp_path / "site"
    proc = run_build_env("init", str(site))
    assert proc.returncode == 0, proc.stderr
    assert {"matrix.yaml", "README.md", "metadata", "locks"} <= {p.name for p in site.iterdir()}
    proc = run_build_env("check", cwd=site)  # ./matrix.yaml is the site's own
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (site / "tpl").mkdir()
    shipped = (site / "tpl" / "Dockerfile.j2")
    src = next(installed_build_env().parent.parent.glob(
        "lib/python3*/site-packages/builder/dockerfiles/Dockerfile.j2"))
    shipped.write_text("# site template: extra line\n" + src.read_text())
    proc = run_build_env("render", "--target", "cuda-x86_64", "--templates", str(site / "tpl"),
                         "--output", str(tmp_path / "ctx"), cwd=site)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ctx" / "Dockerfile").read_text().startswith("# site template")
    # render --output . inside the site refuses and leaves the site as it was (it once wiped it)
    (site / ".git").mkdir()
    listing = sorted(str(p.relative_to(site)) for p in site.rglob("*"))
    proc = run_build_env("render", "--target", "cuda-x86_64", "--output", ".", cwd=site)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "did not write" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(str(p.relative_to(site)) for p in site.rglob("*")) == listing
    # a second init never overwrites a site
    before = (site / "matrix.yaml").read_text()
    proc = run_build_env("init", str(site))
    assert proc.returncode == 2 and "refusing to overwrite" in proc.stderr
    assert (site / "matrix.yaml").read_text() == before


def test_a_site_without_snapshot_gets_one_error_naming_the_command(tmp_path: Path) -> None:
    shutil.copy(REPO / "matrix.yaml", tmp_path / "matrix.yaml")
    proc = run_build_env("check", cwd=tmp_path)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert "build-env check --online" in errors[0] and "pypi-snapshot.json" in errors[0]
    proc = run_build_env("render", "--target", "cuda-x86_64", "--output",
                         str(tmp_path / "ctx"), cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "ctx").exists()


def test_a_site_without_locks_is_told_to_lock(tmp_path: Path) -> None:
    shutil.copy(REPO / "matrix.yaml", tmp_path / "matrix.yaml")
    shutil.copytree(REPO / "metadata", tmp_path / "metadata")
    proc = run_build_env("render", "--target", "cuda-x86_64", "--output",
                         str(tmp_path / "ctx"), cwd=tmp_path)
    assert proc.returncode != 0
    assert "build-env lock --target cuda-x86_64" in proc.stderr, proc.stderr
    assert not (tmp_path / "ctx").exists()


def test_templates_dir_without_templates_is_refused(tmp_path: Path) -> None:
    proc = run_build_env("render", "--target", "cuda-x86_64", "--templates", str(tmp_path),
                         "--output", str(tmp_path / "ctx"))
    assert proc.returncode == 2 and "--templates" in proc.stderr, proc.stderr


@pytest.mark.network
def test_lock_a_site_copy_of_the_fixture(tmp_path: Path) -> None:
    shutil.copy(FIXTURE, tmp_path / "matrix.yaml")
    shutil.copytree(FIXTURE.parent / "metadata", tmp_path / "metadata")
    proc = run_build_env("lock", "--target", "cpu-x86_64", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    ours = (tmp_path / "locks" / "cpu-x86_64.txt").read_text()
    assert "verl==0.9.1" in ours and "--hash=sha256:" in ours
    proc = run_build_env("check", "--target", "cpu-x86_64", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # stable: a re-lock with no change is byte-identical, and says so
    proc = run_build_env("lock", "--target", "cpu-x86_64", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "unchanged" in proc.stdout and (tmp_path / "locks/cpu-x86_64.txt").read_text() == ours
    # an older pin the matrix allows is kept (the existing lock is uv's preference) ...
    newest = re.search(r"^idna==(\S+) ", ours, re.M).group(1)
    lock = tmp_path / "locks/cpu-x86_64.txt"
    lock.write_text(ours.replace(f"idna=={newest} ", "idna==3.10 "))
    proc = run_build_env("lock", "--target", "cpu-x86_64", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0 and "idna==3.10 " in lock.read_text(), proc.stderr
    kept = lock.read_text()
    # ... until asked: --upgrade-package moves only what it names, and prints the move
    proc = run_build_env("lock", "--target", "cpu-x86_64", "--upgrade-package", "idna",
                         "--json", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    [result] = json.loads(proc.stdout)["targets"]
    [move] = result["moved"]
    assert move["name"] == "idna" and move["old"] == "3.10" and move["new"] != "3.10"
    assert json.loads(proc.stdout)["schema"] == "verl-env/lock/v1"
    before, after = parse_lock(kept), parse_lock(lock.read_text())
    assert {n for n in before.keys() | after.keys()
            if getattr(before.get(n), "version", None) != getattr(after.get(n), "version", None)
            } == {"idna"}
    proc = run_build_env("lock", "--target", "cpu-x86_64", "--upgrade-package", "no-such-pkg",
                         cwd=tmp_path)
    assert proc.returncode == 2 and "no-such-pkg" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.network
def test_check_online_on_a_fresh_init_site_and_a_new_target(tmp_path: Path) -> None:
    """The README's site workflow starts with `check --online`: on an unchanged init site it
    passes (the ROCm target's provided, vendor-local torch/vLLM are never looked up on the
    index), and a target just added with no lock yet is named for `lock`, not failed."""
    site = tmp_path / "site"
    assert run_build_env("init", str(site)).returncode == 0
    proc = run_build_env("check", "--online", cwd=site)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "is not on the index" not in proc.stderr
    matrix = site / "matrix.yaml"
    text = matrix.read_text()
    block = text.split("\n  cuda-x86_64:\n", 1)[1].split("\n  cuda-arm64:\n", 1)[0]
    block = re.sub(r" &[A-Za-z0-9_]+", "", block)  # a YAML anchor may be defined once only
    added = text.replace("\n  cuda-arm64:\n", "\n  cuda-x86_64-copy:\n" + block
                         + "\n  cuda-arm64:\n", 1)
    assert added != text
    matrix.write_text(added)
    proc = run_build_env("check", "--online", "--target", "cuda-x86_64-copy",
                         "--target", "rocm-mi300", cwd=site)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cuda-x86_64-copy: ok, not locked" in proc.stdout
    assert "build-env lock --target cuda-x86_64-copy" in proc.stdout
    assert "rocm-mi300: ok" in proc.stdout  # both named targets are checked
    proc = run_build_env("check", "--locked", "--target", "cuda-x86_64-copy", cwd=site)
    assert proc.returncode == 1 and "no lock at" in proc.stderr
