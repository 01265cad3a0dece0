"""``build-env.toml`` typed by the options it sets: every key checked against the argparse
action's own type, range, choices, flag-ness and nargs, whatever the command; errors name
file:line:key (exit 2, no traceback, nothing run). Through the installed ``build-env``, and the
typing itself against a parser of its own (so it follows the options, not a hand list)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from builder import config
from builder.argtypes import positive_int
from builder.commands import _config
from builder.errors import SpecError
from tests.conftest import FIXTURE, run_build_env


def _site(tmp_path: Path, toml: str) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(FIXTURE, site / "matrix.yaml")
    shutil.copytree(FIXTURE.parent / "metadata", site / "metadata")
    shutil.copytree(FIXTURE.parent / "locks", site / "locks")
    (site / "build-env.toml").write_text(toml)
    return site


# (id, build-env.toml, what stderr must say: file:line: key: why)
CASES = [
    ("roce-string-false", '# site\n[slurm]\nroce = "false"\n',
     "build-env.toml:3: slurm.roce: expected true or false, got 'false'"),
    ("nodes-two", '[slurm]\nnodes = "two"\n',
     "build-env.toml:2: slurm.nodes: expected an integer, got 'two'"),
    ("nodes-float", '[slurm]\nnodes = 2.5\n',
     "build-env.toml:2: slurm.nodes: expected an integer"),
    ("nodes-flag", '[slurm]\nnodes = true\n', "build-env.toml:2: slurm.nodes: expected an integer"),
    ("runtime-choice", '[slurm]\npartition = "gpu"\nruntime = "docker"\n',
     "build-env.toml:3: slurm.runtime: expected one of 'apptainer'"),
    ("bind-not-strings", '[slurm]\nbind = [1]\n',
     "build-env.toml:2: slurm.bind: expected a string"),
    ("unknown-slurm-key", '[slurm]\npartition = "gpu"\n\nbogus = 1\n',
     "build-env.toml:4: slurm.bogus: `build-env slurm` has no option --bogus"),
    ("unknown-top-key", 'tag_prefix = "x"\nwhat = 1\n', "build-env.toml:2: what: unknown key"),
    ("require-choice", 'require = "gpux"\n',
     "build-env.toml:1: require: expected one of 'build', 'gpu', got 'gpux'"),
]


@pytest.mark.parametrize("name,toml,says", CASES, ids=[c[0] for c in CASES])
def test_a_bad_config_value_names_file_line_and_key(tmp_path: Path, name: str, toml: str,
                                                    says: str) -> None:
    site = _site(tmp_path, toml)
    before = sorted(p.name for p in site.rglob("*"))
    # `list` never reads [slurm]: the file is checked as a whole, whatever the command
    proc = run_build_env("list", cwd=site, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert sorted(p.name for p in site.rglob("*")) == before


def test_good_values_reach_the_job_script(tmp_path: Path) -> None:
    site = _site(tmp_path, '[slurm]\nnodes = 2\nroce = true\nexclusive = false\n'
                           'bind = ["/scratch:/scratch"]\n')
    out = tmp_path / "job.sbatch"
    proc = run_build_env("slurm", "--target", "cpu-x86_64", "--runtime", "ch-run", "--sif",
                         str(tmp_path), "--data", str(tmp_path), "--model", "m", "--train-cmd",
                         "python3 train.py", "--output", str(out), cwd=site, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --exclusive" not in text
    assert "/scratch:/scratch" in text


def _parser() -> argparse.ArgumentParser:
    """A parser the config code has never seen: the typing comes from its actions."""
    top = argparse.ArgumentParser(prog="t")
    sub = top.add_subparsers(dest="command")
    p = sub.add_parser("slurm")
    p.add_argument("--matrix", type=Path, default=None)
    p.add_argument("--workers", type=positive_int, default=1)
    p.add_argument("--mode", choices=("a", "b"), default="a")
    p.add_argument("--fast", action="store_true")
    p.add_argument("--no-wait", dest="wait", action="store_false")
    p.add_argument("--tags", nargs="+", default=None)
    p.add_argument("--verbose", "-v", action="count", default=0)
    return top


def _apply(tmp_path: Path, toml: str, argv: list[str]) -> argparse.Namespace:
    (tmp_path / "matrix.yaml").write_text("")
    (tmp_path / "build-env.toml").write_text(toml)
    parser = _parser()
    full = ["slurm", "--matrix", str(tmp_path / "matrix.yaml"), *argv]
    args = parser.parse_args(full)
    _config.apply(parser, args, full)
    return args


def test_the_typing_follows_the_actions(tmp_path: Path) -> None:
    args = _apply(tmp_path, '[slurm]\nworkers = 3\nmode = "b"\nfast = true\nwait = false\n'
                            'tags = ["x", "y"]\nverbose = 2\n', [])
    assert (args.workers, args.mode, args.fast, args.wait, args.tags, args.verbose) == (
        3, "b", True, False, ["x", "y"], 2)
    args = _apply(tmp_path, '[slurm]\nworkers = 3\nfast = true\n', ["--workers", "5"])
    assert args.workers == 5 and args.fast is True  # a flag on the command line wins


@pytest.mark.parametrize("toml,says", [
    ('[slurm]\nworkers = 0\n', "expected an integer >= 1"),  # the type's own range check
    ('[slurm]\nmode = "c"\n', "expected one of 'a', 'b'"),
    ('[slurm]\nfast = "yes"\n', "expected true or false"),
    ('[slurm]\nwait = 0\n', "expected true or false"),
    ('[slurm]\ntags = [1]\n', "expected a string"),
    ('[slurm]\nverbose = -1\n', "expected an integer >= 0"),
])
def test_a_value_the_action_would_refuse(tmp_path: Path, toml: str, says: str) -> None:
    with pytest.raises(SpecError, match=says) as caught:
        _apply(tmp_path, toml, [])
    assert caught.value.line == 2 and caught.value.key and caught.value.key.startswith("slurm.")


def test_key_lines() -> None:
    text = 'a = 1\n# x\n[slurm]\n"nodes" = 2\nroce = true  # c\n[other]\nnodes = 3\n'
    assert config.key_lines(text) == {"a": 1, "slurm.nodes": 4, "slurm.roce": 5,
                                      "other.nodes": 7}
