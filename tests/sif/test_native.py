"""The native backend on real images from the real Docker Engine: the flattened tree equals what
the engine itself shows (``docker export``), the SIF passes siftool/unsquashfs checks, it runs
under a real runtime (charliecloud ``ch-run``), and the command line places the SIF atomically
(nothing at the output path when verification fails)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from builder import sif_format
from builder.sif_layers import Spool, flatten, read_saved
from builder.sif_native import feed, pieces
from builder.sif_verify import verify_sif
from tests.conftest import run_build_env
from tests.sif.conftest import need_tools
from tests.sif.images import (ADDED, EXPECTED_FILES, EXPECTED_GONE, EXPORT_ONLY, EXPORT_REWRITES,
                              LAYERED_TAG, export_tree, tree_of)

pytestmark = pytest.mark.docker


def _kind(entry: tuple) -> tuple:
    return ("f" if entry[0] == "h" else entry[0], *entry[1:])  # a hardlink is a file, too


def test_flattened_tree_equals_docker_export(docker_client: Any, layered: Any,
                                             tmp_path: Path) -> None:
    spool = Spool(layered.save(chunk_size=1 << 20), tmp_path / "spool")
    try:
        tree = flatten(spool, read_saved(spool))
        with open(tmp_path / "merged.tar", "wb") as f:
            feed(f.fileno(), spool.fd, pieces(tree, []))
    finally:
        spool.close()
    assert not (tmp_path / "spool").exists()
    with tarfile.open(tmp_path / "merged.tar") as tar:
        ours = tree_of(tar)
        contents = {name: tar.extractfile(name).read().decode()  # type: ignore[union-attr]
                    for name in EXPECTED_FILES}
    theirs = export_tree(docker_client, LAYERED_TAG)
    skip = EXPORT_ONLY | EXPORT_REWRITES | {"etc", "dev", "proc", "sys"}
    theirs = {k: _kind(v) for k, v in theirs.items() if k not in skip}
    ours = {k: _kind(v) for k, v in ours.items() if k not in skip}
    assert ours == theirs
    assert contents == EXPECTED_FILES
    assert not set(EXPECTED_GONE) & set(ours)
    assert ours["data/keep"][1] == 0o750 and ours["data/keep/a"][2:4] == (1234, 4321)


def test_native_sif_verifies_and_runs(layered_sif: Path, mount_sif: Any) -> None:
    need_tools("siftool", "unsquashfs", "ch-run")
    report = verify_sif(layered_sif, run=False)
    failed = [c for c in report["checks"] if c["status"] != "pass"]
    assert [c["id"] for c in failed] == ["selftest"] and failed[0]["status"] == "skip"
    assert report["arch"] == "amd64"
    listing = subprocess.run(["siftool", "list", str(layered_sif)], capture_output=True,
                             text=True, check=True).stdout
    assert "FS (Squashfs/*System/amd64)" in listing and listing.count("Def.FILE") == 1
    root = mount_sif(layered_sif)
    env = {"USER": "root", "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}

    def ch_run(*args: str, extra: dict[str, str] | None = None) -> str:
        proc = subprocess.run(["ch-run", "--no-passwd", str(root), "--", *args],
                              env={**env, **(extra or {})}, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    # the runscript: ENTRYPOINT + CMD, arguments replace CMD and are re-evaluated, --no-eval not
    assert ch_run("/.singularity.d/runscript") == "it's default arg\n"
    assert ch_run("/.singularity.d/runscript", "a", "$HOME") == "it's a /nonexistent\n"
    assert ch_run("/.singularity.d/runscript", "$HOME",
                  extra={"SINGULARITY_NO_EVAL": "1"}) == "it's $HOME\n"
    # the image ENV through the exec action (image values win over unset host ones)
    out = ch_run("/.singularity.d/actions/exec", "/bin/sh", "-c",
                 'echo "$GREETING|$PLAIN|$LD_LIBRARY_PATH"')
    assert out == 'hello "world" $HOME it\'s|1|/.singularity.d/libs\n'
    assert ch_run("/bin/cat", "/data/h2") == "orig\n"


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_cli_refuses_an_unverified_image(layered: Any, tmp_path: Path) -> None:
    out = tmp_path / "out" / "x.sif"
    proc = run_build_env("sif", "--image", LAYERED_TAG, "--output", str(out), timeout=300)
    assert proc.returncode == 1
    assert "no passing verdict" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_cli_failed_verification_leaves_nothing(layered: Any, tmp_path: Path) -> None:
    """The SIF builds, but the self-test cannot run in it (no python in this image): exit 1,
    the reason printed, and no SIF, partial file or scratch directory left."""
    need_tools("mksquashfs", "siftool", "unsquashfs", "ch-run")
    outdir = tmp_path / "out"
    outdir.mkdir()
    proc = run_build_env("sif", "--image", LAYERED_TAG, "--force", "--backend", "native",
                         "--output", str(outdir / "x.sif"), "--phases", "preflight", timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "did not verify" in proc.stderr and "selftest" in proc.stderr
    assert "no python in image" in proc.stderr
    assert _leftovers(outdir) == []


def test_cli_no_run_places_sif_and_report(layered: Any, tmp_path: Path) -> None:
    need_tools("mksquashfs", "siftool", "unsquashfs")
    out = tmp_path / "x.sif"
    (tmp_path / "x.sif").write_bytes(b"stale")  # replaced only once the new one verified
    proc = run_build_env("sif", "--image", LAYERED_TAG, "--force", "--no-run", "--output",
                         str(out), "--report", str(tmp_path / "r.json"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["backend"] == "native" and report["source"] == LAYERED_TAG
    assert report["verification"]["overall"] == "incomplete"
    assert sif_format.is_sif(out) and report["size"] == out.stat().st_size
    assert os.access(out, os.X_OK)
    assert _leftovers(tmp_path) == ["r.json", "x.sif"]
    build = report["build"]
    assert build["save_format"] == "docker-legacy" and build["whiteouts"] >= 4
    assert "incomplete" in proc.stdout


def test_interrupt_leaves_nothing_behind(layered: Any, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGINT/SIGTERM (KeyboardInterrupt) while mksquashfs runs: no output, partial or scratch."""
    from builder import sif as sif_mod
    from builder import sif_native
    from builder.engine import Engine

    def interrupted(*args: Any, **kw: Any) -> str:
        raise KeyboardInterrupt("signal 15")

    monkeypatch.setattr(sif_native, "run_mksquashfs", interrupted)
    engine = Engine.connect()
    with pytest.raises(KeyboardInterrupt):
        sif_mod.convert(engine, engine.image(LAYERED_TAG), output=tmp_path / "i.sif",
                        source=LAYERED_TAG, backend="native", force=True)
    assert _leftovers(tmp_path) == []


def test_pipeline_entry_converts_only_verified_images(layered: Any, tmp_path: Path) -> None:
    """``convert_verified`` (``build-env --target T --sif PATH``) refuses an image without a
    verdict, and otherwise runs the full verification, self-test included."""
    from builder import sif as sif_mod
    from builder import verdicts
    from builder.errors import SifError

    need_tools("mksquashfs", "siftool", "unsquashfs", "ch-run")
    out = tmp_path / "v.sif"
    with pytest.raises(SifError, match="no passing verdict"):
        sif_mod.convert_verified(layered.id, out, target="layers")
    verdicts.record(layered.id, {"overall": "pass", "target": "layers"})
    try:
        with pytest.raises(SifError, match="selftest") as err:
            sif_mod.convert_verified(layered.id, out, target="layers")
    finally:
        os.unlink(verdicts.state_dir() / f"{layered.id.split(':')[1]}.json")
    assert str(err.value).startswith("sif: [layers] ")
    assert "from: verl-env-test/sif-layers:1" not in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
