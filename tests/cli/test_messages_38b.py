"""Issue 38's messages through the installed ``build-env``: a ``[slurm]`` number out of range in
``build-env.toml`` is refused by every command when the file is read (``list`` too), naming
``file:line: key``, exit 2, nothing run; the matrix messages (a defaults key, ``gpus: []``, an
empty ``megatron:``, a NUL byte) are one line ``file:line: key: ...``, exit 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import FIXTURE, run_build_env


def _site(tmp_path: Path, toml: str | None = None, matrix: bytes | None = None) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    if matrix is None:
        shutil.copy(FIXTURE, site / "matrix.yaml")
    else:
        (site / "matrix.yaml").write_bytes(matrix)
    shutil.copytree(FIXTURE.parent / "metadata", site / "metadata")
    shutil.copytree(FIXTURE.parent / "locks", site / "locks")
    if toml is not None:
        (site / "build-env.toml").write_text(toml)
    return site


def _refused(site: Path, *args: str) -> str:
    before = sorted(p.relative_to(site) for p in site.rglob("*"))
    proc = run_build_env(*args, cwd=site, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert sorted(p.relative_to(site) for p in site.rglob("*")) == before
    return proc.stderr.strip()


# (id, build-env.toml, its line and key, what the message says)
TOML = [
    ("nodes-negative", "# site\n[slurm]\nnodes = -3\n", "3: slurm.nodes",
     "nodes must be a whole number from 1 to 4096, not -3"),
    ("nodes-too-many", '[slurm]\npartition = "gpu"\nnodes = 5000\n', "3: slurm.nodes",
     "from 1 to 4096, not 5000"),
    ("gpus-per-node", "[slurm]\ngpus_per_node = 65\n", "2: slurm.gpus_per_node",
     "from 0 to 64, not 65"),
    ("dotted-key", 'tag_prefix = "x"\n\nslurm.cpus_per_task = 0\n', "3: slurm.cpus_per_task",
     "from 1 to 8192, not 0"),
    ("inline-table", '# x\nslurm = { partition = "gpu", ray_wait_timeout = -1 }\n',
     "2: slurm.ray_wait_timeout", "not -1"),
]


@pytest.mark.parametrize("name,toml,where,says", TOML, ids=[c[0] for c in TOML])
@pytest.mark.parametrize("command", [("list",), ("check",)], ids=["list", "check"])
def test_a_number_out_of_range_is_refused_when_the_file_is_read(
        tmp_path: Path, command: tuple[str, ...], name: str, toml: str, where: str,
        says: str) -> None:
    site = _site(tmp_path, toml)
    err = _refused(site, *command)
    assert err.startswith(f"error: {site / 'build-env.toml'}:{where}: "), err
    assert says in err, err


def test_numbers_a_job_takes_still_pass(tmp_path: Path) -> None:
    # gpus_per_node = 0 fits a cpu job, nodes = 4 any: what depends on the family is the job's
    site = _site(tmp_path, "[slurm]\nnodes = 4\ngpus_per_node = 0\ncpus_per_task = 8\n")
    proc = run_build_env("list", cwd=site, timeout=120)
    assert proc.returncode == 0, proc.stderr


def _matrix(edit: str, new: str) -> bytes:
    text = FIXTURE.read_text()
    assert edit in text
    return text.replace(edit, new, 1).encode()


def test_a_defaults_value_is_named_at_the_defaults(tmp_path: Path) -> None:
    matrix = _matrix("targets:\n", 'defaults:\n  apt: [procps, "curl && id"]\ntargets:\n')
    site = _site(tmp_path, matrix=matrix)
    # the fixture's targets write their own apt: one without it inherits the defaults'
    text = matrix.decode().replace("    apt: [procps]\n", "", 1)
    (site / "matrix.yaml").write_text(text)
    err = _refused(site, "check", "--matrix", str(site / "matrix.yaml"))
    line = text.splitlines().index('  apt: [procps, "curl && id"]') + 1
    assert err.startswith(f"error: {site / 'matrix.yaml'}:{line}: defaults.apt[1]: "), err
    assert "inherited by target cpu-x86_64" in err, err


def test_a_nul_byte_is_one_line_with_its_line(tmp_path: Path) -> None:
    matrix = _matrix("schema: 1\n", "schema: 1\x00\n")
    site = _site(tmp_path, matrix=matrix)
    line = matrix.split(b"\x00")[0].count(b"\n") + 1
    err = _refused(site, "list", "--matrix", str(site / "matrix.yaml"))
    assert err.startswith(f"error: {site / 'matrix.yaml'}:{line}: YAML syntax error: "), err
    assert "U+0000" in err, err
