"""An unchanged ``lock`` answers from the recorded inputs (issue 38, item 2): a lock made from the
inputs the target has now is kept without running uv; ``--refresh`` resolves again, and so does
any change of the target's inputs. uv here is a stand-in on PATH that records each call and
fails, so a test sees exactly when the tool resolved (the real uv is exercised by the network
tests of tests/cli/test_installed.py)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.conftest import run_build_env

TARGET = "cuda-x86_64"


@pytest.fixture
def site(tmp_path: Path) -> tuple[Path, dict[str, str], Path]:
    proc = run_build_env("init", str(tmp_path / "site"))
    assert proc.returncode == 0, proc.stderr
    bin_dir, calls = tmp_path / "bin", tmp_path / "uv-calls"
    bin_dir.mkdir()
    fake = bin_dir / "uv"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\necho 'stand-in uv: no resolution here' >&2\n"
                    "exit 2\n")
    fake.chmod(0o755)
    return tmp_path / "site", {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, calls


def test_an_unchanged_lock_is_kept_without_resolving(site: tuple[Path, dict[str, str], Path]
                                                      ) -> None:
    root, env, calls = site
    lock = root / "locks" / f"{TARGET}.txt"
    before = lock.read_bytes()
    proc = run_build_env("lock", "--target", TARGET, "--json", env=env, cwd=root)
    assert proc.returncode == 0, proc.stderr
    [result] = json.loads(proc.stdout)["targets"]
    assert result["unchanged"] is True and result["resolved"] is False, result
    assert not calls.exists(), calls.read_text()  # uv never ran
    assert lock.read_bytes() == before
    proc = run_build_env("lock", "--target", TARGET, env=env, cwd=root)
    assert "unchanged: locked from the inputs the target has now (--refresh resolves again)" \
        in proc.stdout, proc.stdout + proc.stderr


def test_refresh_resolves_again(site: tuple[Path, dict[str, str], Path]) -> None:
    root, env, calls = site
    lock = root / "locks" / f"{TARGET}.txt"
    before = lock.read_bytes()
    proc = run_build_env("lock", "--target", TARGET, "--refresh", env=env, cwd=root)
    assert calls.read_text().startswith("pip compile"), calls.read_text()
    assert proc.returncode != 0 and "stand-in uv" in proc.stderr, proc.stderr
    assert lock.read_bytes() == before  # a failed resolution writes nothing


def test_a_changed_input_resolves_again(site: tuple[Path, dict[str, str], Path]) -> None:
    """An edited lock body is not the inputs the header records: resolved again (uv keeps the
    other pins), not kept."""
    root, env, calls = site
    lock = root / "locks" / f"{TARGET}.txt"
    text = lock.read_text()
    newest = re.search(r"^idna==(\S+) ", text, re.M).group(1)
    lock.write_text(text.replace(f"idna=={newest} ", "idna==3.10 ", 1))
    proc = run_build_env("lock", "--target", TARGET, env=env, cwd=root)
    assert calls.exists(), proc.stdout + proc.stderr
    assert proc.returncode != 0 and "stand-in uv" in proc.stderr, proc.stderr
