"""End to end on the real CPU fixture image (built, verified and tagged by the pipeline): the
native SIF has exactly the object set apptainer writes, and the image's self-test runs from the
SIF's squashfs under a real container runtime and passes."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from builder.sif import format as sif_format
from tests.conftest import run_build_env
from tests.sif.conftest import need_tools

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_cpu_image_to_sif_runs_its_selftest(cpu_image: dict, cpu_sif: dict, tmp_path: Path
                                           ) -> None:
    """``cpu_sif`` (tests/conftest.py) converted it through a docker context (DOCKER_HOST
    empty), as a login node driving a build node: the export the SIF streams from comes from the
    context's engine."""
    need_tools("mksquashfs", "unsquashfs", "siftool", "ch-run")
    out, report = cpu_sif["path"], cpu_sif["report"]
    assert report["image_id"] == cpu_image["image_id"] and report["backend"] == "native"
    assert report["compression"] == "none"  # the session's SIF (tests/conftest.py: cpu_sif)
    v = report["verification"]
    assert v["overall"] == "pass", v["checks"]
    st = v["selftest"]
    assert st["runtime"] in ("ch-run", "apptainer", "singularity")
    assert st["exit_code"] == 0 and st["overall"] == "pass"
    assert set(st["phases"].split(",")) >= {"preflight", "imports", "versions", "cpu"}

    listing = subprocess.run(["siftool", "list", str(out)], capture_output=True, text=True,
                             check=True).stdout
    rows = [re.split(r"\s*\|\s*", line.strip()) for line in listing.splitlines()
            if re.match(r"^\d+\s*\|", line)]
    assert [(r[0], r[1], r[2], r[4]) for r in rows] == [
        ("1", "1", "NONE", "Def.FILE"), ("2", "1", "NONE", "JSON.Generic"),
        ("3", "1", "NONE", "JSON.Generic"), ("4", "1", "NONE", "FS (Squashfs/*System/amd64)")]
    names = [re.search(r"Name:\s+(\S+)", subprocess.run(["siftool", "info", i, str(out)],
                                                        capture_output=True, text=True).stdout)
             for i in ("2", "3")]
    assert [m.group(1) if m else None for m in names] == ["inspect-metadata.json",
                                                          "oci-config.json"]
    deffile = subprocess.run(["siftool", "dump", "1", str(out)], capture_output=True,
                             check=True).stdout
    assert deffile == b"bootstrap: docker-daemon\nfrom: verl-env:cpu-x86_64\n\n"
    info = sif_format.read_info(out)
    labels = json.loads(sif_format.read_object(out, info.descriptors[1]))["data"]["attributes"][
        "labels"]
    assert labels["org.verl-env.pin.torch"] == "2.13.0+cpu"
    assert labels["org.verl-env.target"] == "cpu-x86_64"
    assert report["size"] < report["image_size"]
    # the verdict travels in the SIF's labels: a cpu image's release verdict, nothing pending
    assert labels["org.verl-env.verdict.level"] == "build"
    assert labels["org.verl-env.verdict.gpu"] == "none"

    # `build-env verify FILE.sif`: every phase of the family, run here from the SIF by a real
    # runtime, recorded as the gate records an image's verdict
    gate_report = tmp_path / "sif-gate.json"
    proc = run_build_env("verify", str(out), "--report", str(gate_report), timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{out}: pass, build verdict (" in proc.stdout, proc.stdout
    gate = json.loads(gate_report.read_text())["gate"]
    assert gate["family"] == "cpu" and gate["scope"] == "release"
    assert gate["runtime"] in ("ch-run", "apptainer", "singularity")
    assert set(gate["required_phases"]) <= set(gate["phases"])  # every phase ran
    assert gate["gpus"]["expected"] == 0 and gate["runtime_flags"] == []
    assert gate["subject"]["target"] == "cpu-x86_64"
    assert gate["subject"]["digest"].startswith("sha256:")
    # narrowed: partial, and the options that only apply to an engine image are refused
    proc = run_build_env("verify", str(out), "--phases", "preflight", timeout=600)
    assert proc.returncode == 0 and "pass, partial verdict" in proc.stdout, proc.stdout
    proc = run_build_env("verify", str(out), "--gpus", "none", timeout=60)
    assert proc.returncode == 1 and "--gpus applies to an image in the engine" in proc.stderr
