"""The apptainer backend through spython, against a stand-in ``singularity`` that records its
arguments and fails on demand (apptainer cannot be installed here), and against the real
apptainer where one exists (marked ``apptainer``; skipped visibly here)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from builder import sif as sif_mod
from builder.sif import format as sif_format
from builder.engine import Engine
from builder.errors import SifError
from tests.conftest import run_build_env
from tests.sif.conftest import need_tools
from tests.sif.images import LAYERED_TAG

pytestmark = [pytest.mark.docker, pytest.mark.heavy]

# Stand-in: logs "$0 <TAB> args..." per call; `build ... IMAGE RECIPE` then does what
# $FAKE_SINGULARITY_MODE says: ok (check the docker-archive, copy $FAKE_SINGULARITY_SIF to
# IMAGE), fail (stderr + exit 255), nooutput (exit 0 without writing IMAGE).
STANDIN = r"""#!/bin/sh
{ printf '%s' "$0"; for a in "$@"; do printf '\t%s' "$a"; done; echo; } >>"$FAKE_SINGULARITY_LOG"
case "$1" in
  --version|version) echo "apptainer version 0.0.0-standin"; exit 0 ;;
  build) ;;
  *) echo "standin: unexpected command $1" >&2; exit 255 ;;
esac
image="" recipe=""
for a in "$@"; do image=$recipe; recipe=$a; done
case "${FAKE_SINGULARITY_MODE:-ok}" in
  fail)
    echo "INFO:    Starting build..." >&2
    echo "FATAL:   While performing build: simulated failure (no space left on device)" >&2
    exit 255 ;;
  nooutput) echo "INFO:    nothing written" >&2; exit 0 ;;
esac
archive=${recipe#docker-archive://}
[ "$archive" != "$recipe" ] || { echo "FATAL: not a docker-archive source: $recipe" >&2; exit 255; }
tar -tf "$archive" | grep -qx manifest.json \
  || { echo "FATAL: $archive is no docker save" >&2; exit 255; }
echo "archive-ok $archive" >>"$FAKE_SINGULARITY_LOG"
cp "$FAKE_SINGULARITY_SIF" "$image"
"""


@pytest.fixture
def standin(tmp_path: Path, layered_sif: Path) -> dict[str, Any]:
    """A stand-in ``singularity`` (or ``apptainer``) first on PATH, with its log."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "singularity.log"
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_SINGULARITY_LOG": str(log),
           "FAKE_SINGULARITY_SIF": str(layered_sif)}

    def install(name: str = "singularity") -> None:
        script = bindir / name
        script.write_text(STANDIN)
        script.chmod(0o755)

    return {"env": env, "log": log, "install": install, "bindir": bindir}


def _calls(log: Path) -> list[list[str]]:
    return [line.split("\t") for line in log.read_text().splitlines()]


def test_success_through_spython(standin: dict[str, Any], layered: Any, tmp_path: Path) -> None:
    standin["install"]()
    out = tmp_path / "out" / "a.sif"
    proc = run_build_env("sif", "--image", LAYERED_TAG, "--force", "--no-run", "--output",
                         str(out), env={**standin["env"], "FAKE_SINGULARITY_MODE": "ok"},
                         timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "(apptainer," in proc.stdout
    calls = _calls(standin["log"])
    builds = [c for c in calls if len(c) > 1 and c[1] == "build"]
    assert len(builds) == 1
    argv = builds[0]
    assert argv[0].endswith("/singularity") and "sudo" not in argv
    assert argv[1:3] == ["build", "--force"] and argv[3] == "--tmpdir"
    partial, recipe = Path(argv[-2]), argv[-1]
    assert partial.parent == out.parent and partial.name.startswith(".a.sif.partial-")
    assert recipe.startswith("docker-archive://") and recipe.endswith("/image.tar")
    assert any(line[0].startswith("archive-ok") for line in calls)
    assert sif_format.is_sif(out) and not partial.exists()
    assert not Path(recipe[len("docker-archive://"):]).exists()  # scratch removed
    assert sorted(p.name for p in out.parent.iterdir()) == ["a.sif"]


@pytest.mark.parametrize("mode,message", [
    ("fail", "simulated failure (no space left on device)"),
    ("nooutput", "apptainer build wrote no image"),
])
def test_failures_are_reported(standin: dict[str, Any], layered: Any, tmp_path: Path,
                               mode: str, message: str) -> None:
    standin["install"]()
    outdir = tmp_path / "out"
    outdir.mkdir()
    proc = run_build_env("sif", "--image", LAYERED_TAG, "--force", "--no-run", "--output",
                         str(outdir / "a.sif"),
                         env={**standin["env"], "FAKE_SINGULARITY_MODE": mode}, timeout=300)
    assert proc.returncode == 1
    assert message in proc.stderr
    assert list(outdir.iterdir()) == []


def test_stale_output_is_not_mistaken_for_success(standin: dict[str, Any], layered: Any,
                                                  layered_sif: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """spython returns the path whenever the file exists: a leftover from an earlier run must
    be deleted first, so a build that writes nothing still fails."""
    standin["install"]()
    for key, value in {**standin["env"], "FAKE_SINGULARITY_MODE": "nooutput"}.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "b.sif"
    stale = tmp_path / f".b.sif.partial-{os.getpid()}"
    shutil.copy(layered_sif, stale)
    engine = Engine.connect()
    with pytest.raises(SifError, match="wrote no image"):
        sif_mod.convert(engine, engine.image(LAYERED_TAG), output=out, source=LAYERED_TAG,
                        backend="apptainer", force=True, run=False)
    assert not out.exists() and not stale.exists()


def test_apptainer_without_singularity_link(standin: dict[str, Any], layered: Any,
                                            tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Only ``apptainer`` installed: spython still runs ``singularity``, through a shim link."""
    if shutil.which("singularity"):
        pytest.skip("a real singularity is installed; the shim is not needed")
    standin["install"]("apptainer")
    for key, value in standin["env"].items():
        monkeypatch.setenv(key, value)
    engine = Engine.connect()
    report = sif_mod.convert(engine, engine.image(LAYERED_TAG), output=tmp_path / "c.sif",
                             source=LAYERED_TAG, backend="auto", force=True, run=False)
    assert report["backend"] == "apptainer"
    builds = [c for c in _calls(standin["log"]) if len(c) > 1 and c[1] == "build"]
    assert builds and builds[0][0].endswith("/shim/singularity")
    assert "/shim" not in os.environ["PATH"].split(os.pathsep)[0]


@pytest.mark.apptainer
def test_real_apptainer_build(layered: Any, tmp_path: Path) -> None:
    """Where apptainer exists: the real build from the docker-archive passes our verification
    (structure and contents; the layered image has no python for the self-test)."""
    if not (shutil.which("apptainer") or shutil.which("singularity")):
        pytest.skip("apptainer is not installed on this host (no Debian/PyPI package)")
    need_tools("siftool", "unsquashfs")
    engine = Engine.connect()
    report = sif_mod.convert(engine, engine.image(LAYERED_TAG), output=tmp_path / "real.sif",
                             source=LAYERED_TAG, backend="apptainer", force=True, run=False)
    assert report["verification"]["overall"] == "incomplete"
    checks = report["verification"]["checks"]
    assert [c["id"] for c in checks if c["status"] != "pass"] == ["selftest"]


def test_export_archive_is_a_loadable_docker_archive(docker_client: Any, layered: Any,
                                                     tmp_path: Path) -> None:
    """The apptainer backend's input, written from the export: ``docker load`` accepts it, and
    the loaded image has the same filesystem and config as the original."""
    from builder.sif.convert import export_archive
    from tests.sif.images import export_tree

    engine = Engine(docker_client)
    path = tmp_path / "image.tar"
    export_archive(engine, engine.image(LAYERED_TAG), "verl-env-test/reloaded:1", path)
    with open(path, "rb") as f:
        loaded = docker_client.images.load(f.read())
    try:
        assert [i.tags for i in loaded] == [["verl-env-test/reloaded:1"]]
        image = loaded[0]
        assert image.attrs["Config"]["Entrypoint"] == layered.attrs["Config"]["Entrypoint"]
        assert image.attrs["Config"]["Env"] == layered.attrs["Config"]["Env"]
        again = export_tree(docker_client, "verl-env-test/reloaded:1")
        assert again == export_tree(docker_client, LAYERED_TAG)
    finally:
        docker_client.images.remove("verl-env-test/reloaded:1", force=True)
