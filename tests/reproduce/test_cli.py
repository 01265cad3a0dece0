"""``build-env reproduce``'s bad input, refused before an engine is asked (exit 2, one line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_build_env


@pytest.mark.parametrize("args, said", [
    ((), "name the image (IMAGE) or --target T, one of them"),
    (("img", "--target", "t"), "name the image (IMAGE) or --target T, one of them"),
    (("--target", "t", "--against-record"), "--against-record: name the image (IMAGE)"),
])
def test_what_to_reproduce_must_be_named_once(args: tuple[str, ...], said: str) -> None:
    proc = run_build_env("reproduce", *args, env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and "Traceback" not in proc.stderr


def test_a_tree_into_a_missing_directory_is_refused_before_the_rebuild(tmp_path: Path) -> None:
    where = tmp_path / "no" / "tree.json"
    proc = run_build_env("reproduce", "img", "--tree", str(where),
                         env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert proc.returncode == 2, proc.stderr
    assert f"no such directory {where.parent}" in proc.stderr
