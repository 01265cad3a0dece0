"""The gate tests' base image: the CPU fixture target as the pipeline builds it.

Built with ``--keep-candidate`` so that the image exists whatever the pipeline's own verification
said (on a heavily loaded machine its default per-phase timeouts can run out); the gate tests
verify images derived from it themselves, with longer timeouts, and assert their own verdicts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, run_build_env
from tests.support import shared_image


@pytest.fixture(scope="session")
def gate_base(debian_base: str, ca_bundle: Path, docker_host: str, pytestconfig: pytest.Config,
              tmp_path_factory: pytest.TempPathFactory) -> str:
    workdir = tmp_path_factory.mktemp("gate-base")
    # in a whole run, the image another group built (tests/support/shared_image.py)
    print(f"CPU fixture image: {shared_image.receive(pytestconfig, 'cpu-x86_64', docker_host)}")
    proc = run_build_env("--target", "cpu-x86_64", "--matrix",
                         str(REPO / "tests" / "fixtures" / "cpu.yaml"), "--ca-bundle",
                         str(ca_bundle), "--workdir", str(workdir), "--keep-candidate")
    report_path = workdir / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    if not report.get("image_id") or not report.get("tags"):
        pytest.fail(f"fixture build failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return str(report["image_id"])
