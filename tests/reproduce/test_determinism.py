"""What the shipped templates do so that a rebuild gives the same files (docs/reproduce.md):
checked-hash bytecode through SOURCE_DATE_EPOCH in every stage, apt's per-run files removed,
and uv's per-build files tidied; the tidy command itself run on a tree made here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from builder.render.dockerfile import environment
from tests.conftest import REPO

GOLDEN = REPO / "tests" / "golden"


def _stages(dockerfile: str) -> list[str]:
    return re.split(r"^FROM ", dockerfile, flags=re.M)[1:]


def test_every_stage_of_every_golden_sets_a_fixed_source_date_epoch() -> None:
    for golden in sorted(GOLDEN.glob("*.Dockerfile")):
        text = golden.read_text()
        for stage in _stages(text):
            head = stage.split("\n", 3)
            if stage.startswith("source-build AS source-"):
                # a source package's stage: on its wheel build's command line
                assert "    SOURCE_DATE_EPOCH=315532800 \\\n" in stage, (golden.name, head[0])
            else:
                assert head[1:3] == ["ARG SOURCE_DATE_EPOCH=315532800",
                                     "ARG PYC_INVALIDATION_MODE=CHECKED_HASH"], (golden.name,
                                                                                 head[0])


def test_every_apt_and_uv_step_removes_what_differs_per_build() -> None:
    text = (GOLDEN / "cpu-x86_64.Dockerfile").read_text()
    steps = text.split("\nRUN ")[1:]
    apt = [s for s in steps if "apt-get install" in s]
    uv = [s for s in steps if "uv pip install" in s]
    assert apt and uv
    for step in apt:
        assert "apt-get clean" in step and "/var/cache/ldconfig/aux-cache" in step
        assert "/var/log/dpkg.log" in step
    for step in uv:
        assert "uv_cache.json" in step and "rm -rf /tmp/verl-env-uv /tmp/uv-*.lock" in step


def test_the_uv_tidy_command_drops_uv_cache_json_and_its_record_line(tmp_path: Path) -> None:
    tidy = environment().get_template("_macros.j2").module.uv_tidy(str(tmp_path))  # type: ignore[attr-defined]
    site = tmp_path / "python3.11" / "site-packages"
    local = site / "torch-2.13.0+cpu.dist-info"
    other = site / "ray-2.60.0.dist-info"
    for d in (local, other):
        d.mkdir(parents=True)
    lines = ["torch/__init__.py,sha256=abc,10",
             "torch-2.13.0+cpu.dist-info/uv_cache.json,sha256=def,60",
             "torch-2.13.0+cpu.dist-info/RECORD,,"]
    (local / "RECORD").write_text("\n".join(lines) + "\n")
    (local / "uv_cache.json").write_text('{"timestamp":{"secs_since_epoch":1}}')
    (other / "RECORD").write_text("ray/__init__.py,sha256=x,1\n")
    subprocess.run(["bash", "-o", "pipefail", "-c", str(tidy)], check=True)
    assert not (local / "uv_cache.json").exists()
    assert (local / "RECORD").read_text() == f"{lines[0]}\n{lines[2]}\n"
    assert (other / "RECORD").read_text() == "ray/__init__.py,sha256=x,1\n"
