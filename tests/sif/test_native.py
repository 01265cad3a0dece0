"""The native backend on real images from the real Docker Engine: the SIF's filesystem is what the
engine itself shows (``docker export``) plus apptainer's tree, with every whiteout of the image's
layers applied; the SIF passes siftool/unsquashfs checks, it runs under a real runtime
(charliecloud ``ch-run``), the export container never outlives the conversion, and the command
line places the SIF atomically (nothing at the output path when verification fails)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from builder.engine import Engine
from builder.errors import EngineError
from tests.support.engine_probe import leftover_containers
from builder.sif import format as sif_format
from builder.sif import meta as sif_meta
from builder.sif.checks import verify_sif
from tests.conftest import run_build_env
from tests.sif.conftest import need_tools
from tests.sif.images import (ADDED, EXPECTED_FILES, EXPECTED_GONE, LAYERED_TAG, export_tree)

pytestmark = [pytest.mark.docker, pytest.mark.heavy]


def _kind(entry: tuple) -> tuple:
    return ("f" if entry[0] == "h" else entry[0], *entry[1:])  # a hardlink is a file, too


def walk(root: Path) -> dict[str, tuple[str, int, int, int, str]]:
    """path -> (kind, mode, uid, gid, link target) of a mounted tree."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            kind = ("d" if stat.S_ISDIR(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode)
                    else "f" if stat.S_ISREG(st.st_mode) else "o")
            out[str(path.relative_to(root))] = (kind, st.st_mode & 0o7777, st.st_uid, st.st_gid,
                                                os.readlink(path) if kind == "l" else "")
    return out


def _containers(engine: Engine) -> list[str]:
    return [n for n in leftover_containers(engine) if n.startswith("verl-env-export-")]


def test_sif_tree_is_the_export_plus_apptainers(docker_client: Any, layered_sif: Path,
                                                mount_sif: Any) -> None:
    root = mount_sif(layered_sif)
    ours = {k: _kind(v) for k, v in walk(root).items()}
    theirs = {k: _kind(v) for k, v in export_tree(docker_client, LAYERED_TAG).items()}
    generated = ADDED | set(sif_meta.DIRECTORIES) | set(sif_meta.TRUNCATED)
    assert set(ours) - set(theirs) <= generated
    assert set(theirs) - set(ours) == {".dockerenv", "dev/console"}  # export-only, dropped
    assert {k: v for k, v in ours.items() if k not in generated} == \
        {k: v for k, v in theirs.items() if k in ours and k not in generated}
    assert ours["etc/hosts"][:2] == ("f", 0o644) and (root / "etc/hosts").read_bytes() == b""


def test_whiteouts_of_later_layers_are_applied(layered_sif: Path, mount_sif: Any) -> None:
    """Files and directories a later layer deletes (``.wh.`` and opaque whiteouts) are not in
    the SIF; a file re-created after its deletion, a directory replaced by a file, and a
    hardlink whose original was overwritten later hold their final content."""
    root = mount_sif(layered_sif)
    assert [p for p in EXPECTED_GONE if os.path.lexists(root / p)] == []
    assert {p: (root / p).read_text() for p in EXPECTED_FILES} == EXPECTED_FILES
    keep = (root / "data/keep").lstat()
    assert keep.st_mode & 0o7777 == 0o750
    a = (root / "data/keep/a").lstat()
    assert (a.st_uid, a.st_gid) == (1234, 4321)


def test_export_removes_its_container(layered: Any, docker_host: str) -> None:
    engine = Engine.connect()
    with engine.export(LAYERED_TAG, chunk_size=4096) as chunks:
        assert len(_containers(engine)) == 1
        first = next(iter(chunks))  # stop early: the container still goes
    assert first and _containers(engine) == []
    with pytest.raises(EngineError, match="no such image: verl-env-test/none:0"):
        with engine.export("verl-env-test/none:0"):
            pass
    assert _containers(engine) == []


def test_native_sif_verifies_and_runs(layered_sif: Path, mount_sif: Any) -> None:
    need_tools("siftool", "unsquashfs", "ch-run")
    report = verify_sif(layered_sif, run=False)
    failed = [c for c in report["checks"] if c["status"] != "pass"]
    assert [c["id"] for c in failed] == ["selftest"] and failed[0]["status"] == "skip"
    assert report["arch"] == "amd64"
    # gzip at zlib's default level, not mksquashfs's 9 (a third of the CPU, 0.7 % larger)
    [squashfs] = [c for c in report["checks"] if c["id"] == "contents.squashfs"]
    assert squashfs["detail"] == "gzip (level 6), 128 KiB blocks", squashfs
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
    assert build["source"] == "docker-export" and build["members"] > 20
    assert build["dropped"] == [".dockerenv", "dev/console"] and build["arch"] == "amd64"
    assert set(build["replaced"]) == {"etc/hosts", "etc/resolv.conf"}
    assert "incomplete" in proc.stdout


def test_an_uncompressed_sif_is_read_as_the_gzip_one(layered: Any, layered_sif: Path,
                                                     mount_sif: Any, tmp_path: Path) -> None:
    """``--compression none``: the same files in a squashfs whose every block is stored as it
    is (unsquashfs says so; the SIF's check names it), larger than the gzip SIF, mounted by
    squashfuse and run by ch-run like it; the report and the summary line say what it is."""
    need_tools("mksquashfs", "siftool", "unsquashfs", "ch-run")
    out = tmp_path / "x.sif"
    proc = run_build_env("sif", "--image", LAYERED_TAG, "--force", "--no-run", "--compression",
                         "none", "--output", str(out), "--report", str(tmp_path / "r.json"),
                         timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["compression"] == "none" and report["backend"] == "native"
    assert "SIF (native, nothing compressed, " in proc.stdout, proc.stdout
    [squashfs] = [c for c in report["verification"]["checks"] if c["id"] == "contents.squashfs"]
    assert squashfs["status"] == "pass"
    assert squashfs["detail"] == "gzip superblock, nothing compressed, 128 KiB blocks"
    part = sif_format.read_info(out).primary_partition()
    assert part is not None
    sb = subprocess.run(["unsquashfs", "-o", str(part.offset), "-s", str(out)],
                        capture_output=True, text=True, check=True).stdout
    assert "Data is uncompressed" in sb and "Inodes are uncompressed" in sb
    assert out.stat().st_size > layered_sif.stat().st_size
    assert walk(mount_sif(out)) == walk(mount_sif(layered_sif))
    proc = subprocess.run(["ch-run", "--no-passwd", str(mount_sif(out)), "--",
                           "/.singularity.d/runscript"],
                          env={"USER": "root", "PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "it's default arg\n", proc.stderr


def test_interrupt_leaves_nothing_behind(layered: Any, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGINT/SIGTERM (KeyboardInterrupt) in the middle of the stream, mksquashfs running: no
    output, partial or scratch file, no mksquashfs process and no export container left."""
    from builder import sif as sif_mod
    from builder.sif import overlay

    real = overlay.Overlay.stream
    seen: list[int] = []

    def interrupted(self: Any, chunks: Any) -> Any:
        for n, piece in enumerate(real(self, chunks)):
            if n == 50:
                seen.append(n)
                raise KeyboardInterrupt("signal 15")
            yield piece

    monkeypatch.setattr(overlay.Overlay, "stream", interrupted)
    engine = Engine.connect()
    with pytest.raises(KeyboardInterrupt):
        sif_mod.convert(engine, engine.image(LAYERED_TAG), output=tmp_path / "i.sif",
                        source=LAYERED_TAG, backend="native", force=True)
    assert seen == [50]
    assert _leftovers(tmp_path) == [] and _containers(engine) == []
    ps = subprocess.run(["pgrep", "-P", str(os.getpid()), "mksquashfs"], capture_output=True)
    assert ps.stdout == b""


def test_broken_stream_is_a_sif_error(layered: Any, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """An export that breaks off mid-file: a SifError naming the target, nothing left."""
    from builder import sif as sif_mod
    from builder.errors import SifError

    real = Engine.export

    def truncated(self: Engine, image: str, **kw: Any) -> Any:
        import contextlib

        @contextlib.contextmanager
        def cm() -> Any:
            with real(self, image, chunk_size=1 << 16) as chunks:
                yield (c for _, c in zip(range(3), chunks))
        return cm()

    monkeypatch.setattr(Engine, "export", truncated)
    engine = Engine.connect()
    with pytest.raises(SifError, match=r"^sif: \[layers\] native conversion failed: tar stream "
                                       r"ends"):
        sif_mod.convert(engine, engine.image(LAYERED_TAG), output=tmp_path / "t.sif",
                        source=LAYERED_TAG, target="layers", backend="native", force=True)
    assert _leftovers(tmp_path) == [] and _containers(engine) == []


def test_pipeline_entry_converts_only_verified_images(layered: Any, tmp_path: Path) -> None:
    """``convert_verified`` (``build-env --target T --sif PATH``) refuses an image without a
    verdict, and otherwise runs the full verification, self-test included."""
    from builder import sif as sif_mod
    from builder.gate import verdicts
    from builder.errors import SifError

    need_tools("mksquashfs", "siftool", "unsquashfs", "ch-run")
    out = tmp_path / "v.sif"
    engine = Engine.connect()
    image = engine.image(layered.id)
    with pytest.raises(SifError, match="no passing verdict"):
        sif_mod.convert_verified(engine, image, out, target="layers", verdict=None)
    # a passing release verdict, as the gate records one (scope: the full phase set), handed
    # over as the pipeline does
    recorded = verdicts.record(layered.id, verdicts.Verdict(
        layered.id, 0, {"overall": "pass", "gate": {"scope": "release", "family": "cpu"}}),
        target="layers")
    try:
        with pytest.raises(SifError, match="selftest") as err:
            sif_mod.convert_verified(engine, image, out, target="layers", verdict=recorded)
    finally:
        os.unlink(verdicts.state_dir() / f"{layered.id.split(':')[1]}.json")
    assert str(err.value).startswith("sif: [layers] ")
    assert "from: verl-env-test/sif-layers:1" not in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
