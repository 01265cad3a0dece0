"""`propose --build` on the CPU fixture through the real engine and gate (the session's engine,
on top of the fixture build's layers and uv cache): a proposal is proven only when the gate
passes, one whose gate fails is reported and not proposed, and only a proven one is applied."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import docker
import pytest

from tests.conftest import REPO, run_build_env

pytestmark = [pytest.mark.docker, pytest.mark.network]
FIXTURE = REPO / "tests" / "fixtures" / "cpu.yaml"
PREFIX = "verl-env-proposal-test"


def _propose(target: str, package: str, out: Path, ca_bundle: Path) -> tuple[int, dict, str]:
    proc = run_build_env("propose", "--matrix", str(FIXTURE), "--target", target,
                         "--package", package, "--output", str(out), "--build",
                         "--ca-bundle", str(ca_bundle), "--tag-prefix", PREFIX, "--json")
    doc = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, doc, proc.stderr


def _site_copy(dest: Path) -> Path:
    """A site holding only the fixture's cpu-x86_64 target (its own lines, no shared anchor)."""
    text = FIXTURE.read_text()
    own = text.split("\n  # The same environment with a wrong claim")[0].replace(": &cpu", ":")
    dest.mkdir()
    (dest / "matrix.yaml").write_text(own + "\n")
    shutil.copytree(FIXTURE.parent / "metadata", dest / "metadata")
    (dest / "locks").mkdir()
    shutil.copy2(FIXTURE.parent / "locks" / "cpu-x86_64.txt", dest / "locks")
    return dest / "matrix.yaml"


def test_a_proposal_is_proven_by_the_gate_and_applied(cpu_image: dict, ca_bundle: Path,
                                                       tmp_path: Path) -> None:
    out = tmp_path / "proposal"
    # transformers moves 5.9.0 -> 5.10.4 (the newest verl 0.9.1 allows in the fixture's snapshot)
    code, doc, err = _propose("cpu-x86_64", "transformers", out, ca_bundle)
    assert code == 0, err
    (p,) = doc["targets"]
    assert p["status"] == "proven", p
    assert {x["name"]: (x["old"], x["new"]) for x in p["pins"] if x["old"] != x["new"]} == {
        "transformers": ("5.9.0", "5.10.4")}
    assert p["lock"]["moved"] == [{"name": "transformers", "old": "5.9.0", "new": "5.10.4"}]
    gate = p["gate"]
    assert gate["result"] == "pass" and gate["overall"] == "pass" and not gate["failed"]
    assert gate["coverage"]["imports"].get("pass", 0) > 0
    assert gate["image_id"] != cpu_image["image_id"]  # a new image: the deps layer moved
    report = json.loads(Path(gate["report"]).read_text())
    checks = {c["id"]: c for c in report["verification"]["checks"]}
    assert checks["versions.pin.transformers"]["status"] == "pass"
    md = (out / "PROPOSAL.md").read_text()
    assert "Status: **proven**" in md and "## Gate" in md and "| imports |" in md
    client = docker.from_env()
    assert client.images.get(f"{PREFIX}:cpu-x86_64").id == gate["image_id"]
    assert client.images.get("verl-env:cpu-x86_64").id == cpu_image["image_id"]  # untouched

    # --apply writes it into a site: the matrix line, the lock; the site then checks --locked
    matrix = _site_copy(tmp_path / "site")
    applied = run_build_env("propose", "--matrix", str(matrix), "--apply", str(out))
    assert applied.returncode == 0, applied.stderr
    assert 'transformers: "5.10.4"' in matrix.read_text()
    assert (matrix.parent / "locks" / "cpu-x86_64.txt").read_text() == (
        out / "locks" / "cpu-x86_64.txt").read_text()
    check = run_build_env("check", "--matrix", str(matrix), "--locked")
    assert check.returncode == 0, check.stderr
    # applied once, the proposal no longer starts from the site's pins
    again = run_build_env("propose", "--matrix", str(matrix), "--apply", str(out))
    assert again.returncode != 0 and "moved since the proposal was made" in again.stderr
    for tag in {t for i in client.images.list(PREFIX) for t in i.tags}:
        client.images.remove(tag)


def test_a_proposal_whose_gate_fails_is_reported_not_proposed(cpu_image: dict, ca_bundle: Path,
                                                               tmp_path: Path) -> None:
    out = tmp_path / "proposal"
    # the badimport target builds (its import claim is wrong, not its pins): the gate refuses it.
    # Only ray may move, and it is at its newest: the lock and every layer are the fixture's
    # (cached), so only the gate's run costs time.
    code, doc, err = _propose("cpu-x86_64-badimport", "ray", out, ca_bundle)
    assert code == 1, err
    (p,) = doc["targets"]
    assert p["status"] == "gate-failed" and p["lock"] is not None
    assert any(f.startswith("imports.hydra-core") for f in p["gate"]["failed"]), p["gate"]
    assert "the gate refused the candidate image" in p["error"]
    assert json.loads((out / "proposal.json").read_text())["status"] == "gate-failed"
    assert "Status: **gate-failed**" in (out / "PROPOSAL.md").read_text()
    client = docker.from_env()
    assert not [t for i in client.images.list(PREFIX) for t in i.tags
                if "badimport" in t]  # no tag for a refused candidate
    refused = run_build_env("propose", "--matrix", str(FIXTURE), "--apply", str(out))
    assert refused.returncode == 1 and "not proven" in refused.stderr
