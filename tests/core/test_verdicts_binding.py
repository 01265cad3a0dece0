"""Verdicts belong to their content: ``build-env list`` shows a target's verdict only when it
was recorded at this site for the target's matrix entry and lock as they are now; never one
from another site's image of the same name, nor one recorded for other pins. Through the
installed ``build-env``, with the per-user verdict store the two sites share."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from builder.gate import verdicts
from builder.files import sha256_text
from builder.matrix.spec import load_matrix
from tests.conftest import REPO, run_build_env
from tests.trust.conftest import CUDA_BUILD_VERDICT

IMAGE = "sha256:" + "c" * 64


def _site(root: Path) -> Path:
    """A site: a copy of the reference matrix, its snapshot and locks."""
    root.mkdir(parents=True)
    shutil.copy(REPO / "matrix.yaml", root / "matrix.yaml")
    shutil.copytree(REPO / "metadata", root / "metadata")
    shutil.copytree(REPO / "locks", root / "locks")
    return root


def _binding(site: Path, target: str = "cuda-x86_64") -> verdicts.Binding:
    t = load_matrix(site / "matrix.yaml").target(target)
    lock = (site / "locks" / f"{target}.txt").read_text()
    return verdicts.Binding(verdicts.site_key(site / "matrix.yaml"), target, t.entry_hash,
                            sha256_text(lock), "verl-env:cuda-x86_64-verl0.7.0-0123456789ab")


def _list(site: Path, state: Path) -> dict:
    proc = run_build_env("list", "--json", cwd=site, env={"XDG_STATE_HOME": str(state)},
                         timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["targets"]


def _row(site: Path, state: Path, target: str) -> str:
    proc = run_build_env("list", cwd=site, env={"XDG_STATE_HOME": str(state)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return next(line for line in proc.stdout.splitlines() if line.startswith(target + " "))


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


def test_a_verdict_by_target_name_alone_reaches_no_site(tmp_path: Path, state: Path) -> None:
    """The finding: a verdict recorded as the pipeline records it (target name only) made
    every site's never-built cuda-x86_64 show `build (gpu pending)`."""
    other = _site(tmp_path / "other")
    verdicts.record(IMAGE, verdicts.Verdict.from_dict(CUDA_BUILD_VERDICT), target="cuda-x86_64")
    assert _list(other, state)["cuda-x86_64"]["verdict"] is None
    assert "gpu pending" not in _row(other, state, "cuda-x86_64")


def test_a_verdict_shows_only_at_its_site_and_for_its_content(tmp_path: Path,
                                                              state: Path) -> None:
    built, other = _site(tmp_path / "built"), _site(tmp_path / "other")
    verdicts.record(IMAGE, verdicts.Verdict.from_dict(CUDA_BUILD_VERDICT), target="cuda-x86_64",
                    binding=_binding(built))
    mine = _list(built, state)
    assert mine["cuda-x86_64"]["verdict"]["level"] == "build"
    assert mine["cuda-arm64"]["verdict"] is None
    assert "build (gpu pending)" in _row(built, state, "cuda-x86_64")
    # the same matrix and lock at another site: not this site's verdict
    assert _list(other, state)["cuda-x86_64"]["verdict"] is None
    # the lock moved since: the verdict was for other content
    lock = built / "locks" / "cuda-x86_64.txt"
    lock.write_text(lock.read_text() + "# relocked\n")
    assert _list(built, state)["cuda-x86_64"]["verdict"] is None
    # no lock at all: nothing can match
    lock.unlink()
    assert _list(built, state)["cuda-x86_64"]["verdict"] is None


def test_the_binding_round_trips_and_an_image_verdict_stays_site_free(tmp_path: Path,
                                                                    state: Path) -> None:
    site = _site(tmp_path / "s")
    bound = _binding(site)
    recorded = verdicts.record(IMAGE, verdicts.Verdict.from_dict(CUDA_BUILD_VERDICT),
                               target="cuda-x86_64", binding=bound)
    assert recorded.binding == bound
    assert verdicts.lookup(IMAGE).binding == bound  # the image's own record (tag, sif, publish)
    assert verdicts.latest_for(bound) is not None
    moved = verdicts.Binding(bound.site, bound.target, "sha256:" + "0" * 64, bound.lock_hash)
    assert verdicts.latest_for(moved) is None
    assert verdicts.Binding.from_dict({"site": 1}) is None


def test_binding_from_labels() -> None:
    labels = {"org.verl-env.target": "cuda-x86_64", "org.verl-env.matrix-hash": "sha256:1",
              "org.verl-env.lock-hash": "sha256:2", "org.verl-env.override": "false"}
    b = verdicts.binding_from_labels("/site/matrix.yaml", labels)
    assert b is not None and (b.target, b.entry_hash, b.lock_hash) == (
        "cuda-x86_64", "sha256:1", "sha256:2")
    assert verdicts.binding_from_labels("/s/matrix.yaml", {**labels,
                                                           "org.verl-env.override": "true"}) is None
    assert verdicts.binding_from_labels("/s/matrix.yaml", {}) is None
