"""The exit-code contract where an engine answers (the test session's private dockerd): an image
that is not there, or no image reference at all, is bad input (2), one line, no traceback."""

from __future__ import annotations

import pytest

from tests.conftest import run_build_env

pytestmark = pytest.mark.docker


@pytest.mark.parametrize("ref,says", [
    ("verl-env-test/no-such-image:0", "no such image: verl-env-test/no-such-image:0"),
    ("Not A Reference!", "is no image reference"),
    ("sha256:" + "0" * 64, "no such image"),
])
def test_verify_an_image_that_is_not_there(docker_host: str, ref: str, says: str) -> None:
    proc = run_build_env("verify", ref, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
