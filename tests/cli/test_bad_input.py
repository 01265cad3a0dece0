"""Bad input, as users type it, through the installed ``build-env``: each row is one mistake,
the exit code it must give, what the message must name, and that no traceback is printed and
nothing is written. The table is the record of what was tried (issue: clear errors for
everything a user can get wrong)."""

from __future__ import annotations

import os
import signal
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import FIXTURE, REPO, installed_build_env, run_build_env

ALIAS_BOMB = """schema: 1
a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
targets: *h
"""


def _site(tmp: Path, matrix: bytes | None = None) -> Path:
    site = tmp / "site"
    site.mkdir()
    (site / "matrix.yaml").write_bytes(matrix if matrix is not None else FIXTURE.read_bytes())
    shutil.copytree(FIXTURE.parent / "metadata", site / "metadata")
    shutil.copytree(FIXTURE.parent / "locks", site / "locks")
    return site


def _renamed_target() -> bytes:
    return FIXTURE.read_bytes().replace(b"\n  cpu-x86_64:", b'\n  "cuda x86/64:latest":', 1)


def _non_utf8() -> bytes:
    return FIXTURE.read_bytes().replace(b"schema: 1\n", b"schema: 1\n# caf\xe9\n", 1)


NOT_WRITABLE = "/proc/verl-env-not-writable"

# (id, matrix bytes or None, argv with {site}/{tmp}, exit code, what stderr must say)
CASES = [
    ("non-utf8-matrix", _non_utf8(), ["check"], 2, "not UTF-8 text"),
    ("alias-bomb", ALIAS_BOMB.encode(), ["check"], 2, "more than 20000 YAML nodes"),
    ("bad-target-name", _renamed_target(), ["check"], 2, "target name 'cuda x86/64:latest'"),
    ("unknown-second-target", None, ["check", "--target", "cpu-x86_64", "--target", "nope"], 2,
     "unknown target 'nope'"),
    ("render-unwritable", None,
     ["render", "--target", "cpu-x86_64", "--output", NOT_WRITABLE + "/ctx"], 2,
     NOT_WRITABLE),
    ("render-over-a-site", None, ["render", "--target", "cpu-x86_64", "--output", "{site}"], 2,
     "did not write"),
    ("set-enabled-nope", None,
     ["render", "--target", "cpu-x86_64", "--set", "packages.verl.enabled=nope",
      "--output", "{tmp}/ctx"], 2, "expected true or false, got 'nope'"),
    ("expect-gpus-negative", None, ["--target", "cpu-x86_64", "--expect-gpus", "-1"], 2,
     "expected an integer >= 0"),
    ("jobs-zero", None, ["--target", "cpu-x86_64", "--jobs", "0"], 2, "expected an integer >= 1"),
    ("verify-timeout-nan", None, ["--target", "cpu-x86_64", "--verify-timeout", "nan"], 2,
     "expected a number > 0"),
    ("slurm-unwritable", None,
     ["slurm", "--target", "cpu-x86_64", "--runtime", "ch-run", "--sif", "{tmp}/img",
      "--data", "{tmp}", "--model", "m", "--train-cmd", "python3 train.py",
      "--output", NOT_WRITABLE + "/job.sbatch"], 2,
     NOT_WRITABLE),
    ("init-unwritable", None, ["init", NOT_WRITABLE + "/site"], 2, NOT_WRITABLE),
    ("keygen-unwritable", None, ["trust", "keygen", NOT_WRITABLE + "/keys"], 2, NOT_WRITABLE),
    ("upgrade-unknown-package", None,
     ["lock", "--target", "cpu-x86_64", "--upgrade-package", "no-such-pkg"], 2, "no-such-pkg"),
]


@pytest.mark.parametrize("name,matrix,argv,code,says", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_clear_error(tmp_path: Path, name: str, matrix: bytes | None,
                                    argv: list[str], code: int, says: str) -> None:
    site = _site(tmp_path, matrix)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    args = [a.format(site=site, tmp=tmp_path) for a in argv]
    start = time.monotonic()
    proc = run_build_env(*args, cwd=site, timeout=120)
    seconds = time.monotonic() - start
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before, "nothing may be written"
    assert seconds < 110, f"{name}: refused only after {seconds:.0f} s"  # a hang, not speed


@pytest.mark.network
def test_sigterm_during_lock_leaves_no_process_and_no_temporary_file(tmp_path: Path) -> None:
    """SIGTERM while uv resolves: uv is stopped and the temporary directory removed."""
    site = _site(tmp_path)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    env.pop("PYTHONPATH", None)
    proc = subprocess.Popen([str(installed_build_env()), "lock", "--target", "cpu-x86_64",
                             "--upgrade"], cwd=site, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    uv = []
    while time.monotonic() < deadline and not uv:
        uv = subprocess.run(["pgrep", "-P", str(proc.pid), "uv"], capture_output=True,
                            text=True).stdout.split()
        time.sleep(0.1)
    assert uv, "uv never started"
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "terminated" in err, err  # 128 + SIGTERM
    assert "Traceback" not in err
    for pid in uv:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(
            f"/proc/{pid}/status").read_text().lower(), f"uv {pid} still running"
    assert list(scratch.iterdir()) == [], "a temporary directory was left behind"
    assert (site / "locks/cpu-x86_64.txt").read_bytes() == (
        REPO / "tests/fixtures/locks/cpu-x86_64.txt").read_bytes()


WRITERS = [
    ("init", ["init", "{tmp}/out/site"]),
    ("render", ["render", "--target", "cpu-x86_64", "--output", "{tmp}/out/ctx"]),
    ("slurm", ["slurm", "--target", "cpu-x86_64", "--runtime", "ch-run", "--sif", "{tmp}",
               "--data", "{tmp}", "--model", "m", "--train-cmd", "python3 train.py",
               "--output", "{tmp}/out/job.sbatch"]),
    ("keygen", ["trust", "keygen", "{tmp}/out/keys"]),
]


@pytest.mark.parametrize("name,argv", WRITERS, ids=[w[0] for w in WRITERS])
def test_a_command_that_writes_leaves_only_finished_files(tmp_path: Path, name: str,
                                                          argv: list[str]) -> None:
    """Every file is written to a temporary name beside its target and renamed into place: a
    finished run leaves the outputs and nothing half-written or temporary beside them (the
    failing runs above leave nothing at all)."""
    site = _site(tmp_path)
    proc = run_build_env(*[a.format(tmp=tmp_path) for a in argv], cwd=site, timeout=300)
    assert proc.returncode == 0, proc.stderr
    written = [p for p in (tmp_path / "out").rglob("*")]
    assert written, "nothing written"
    leftovers = [p for p in written if p.name.endswith((".part", ".tmp")) or
                 (p.name.startswith(".") and p.name != ".verl-env-context")]
    assert leftovers == []
    assert all(p.stat().st_size > 0 for p in written if p.is_file() and p.suffix != ".txt"
               or p.name == "Dockerfile")
