"""Convert a verified image to an Apptainer SIF, then prove the SIF.

Backends: ``apptainer`` (the real one, driven through ``spython`` from a one-layer
``docker-archive`` written from the engine's export of the image) or ``native``
(:mod:`builder.sif.native`: the export streamed through ``mksquashfs``; no apptainer needed).
``auto`` picks apptainer when it is installed. Both read the image only through
:meth:`builder.engine.Engine.export`.

The SIF is built under a temporary name beside the output, verified (:func:`verify_sif`: siftool,
unsquashfs, and the self-test run from it by a real runtime), and only then renamed to the output
path. A failed or interrupted conversion leaves nothing at the output path (a file that was there
before stays untouched) and no temporary files behind; a full disk is named with the space the
conversion needs; two runs writing one path take turns; what a killed run left is removed by the
next run of the same output (:mod:`builder.sif.placement`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from builder.gate import verdicts
from builder.engine import ContainerEngine, ImageInfo, interrupts_raise
from builder.errors import EngineError, InfraError, SifError, UsageError
from builder.matrix.families import family
from builder.files import atomic_write_text
from builder.sif import native as sif_native
from builder.sif.overlay import OverlayError
from builder.sif.placement import Need, is_disk_full, mib, placing
from builder.sif.checks import DEFAULT_PHASES, verify_sif

__all__ = ["convert", "convert_verified", "summary", "verify_sif", "write_report"]
REPORT_SCHEMA = "verl-env/sif-report/v1"


def summary(report: dict[str, Any]) -> list[str]:
    """A few human lines: what was written, how, and what proved it."""
    v = report["verification"]
    stored = ", nothing compressed" if report.get("compression") == "none" else ""
    lines = [f"{report['output']}: {report['size'] / 2**20:.0f} MiB SIF ({report['backend']}"
             f"{stored}, {report['seconds']['convert']:.1f} s) from {report['source']} "
             f"({report['image_size'] / 2**20:.0f} MiB image)",
             "verification: {} ({})".format(v["overall"], ", ".join(
                 f"{n} {s}" for s in ("pass", "fail", "skip")
                 if (n := sum(c["status"] == s for c in v["checks"]))))]
    labels = report.get("verdict") or {}
    if labels:
        level = labels.get(f"{verdicts.LABEL_PREFIX}.level")
        gpu = labels.get(f"{verdicts.LABEL_PREFIX}.gpu")
        why = labels.get(f"{verdicts.LABEL_PREFIX}.gpu.reason") or labels.get(
            f"{verdicts.LABEL_PREFIX}.gpu.evidence")
        lines.append(f"image verdict: {level} level, gpu: {gpu}" + (f" ({why})" if why else ""))
    st = v.get("selftest")
    if st:
        lines.append(f"self-test from the SIF under {st['runtime']}: {st['overall']} "
                     f"(phases {st['phases']}, {st['seconds']} s)")
    if v["overall"] != "pass":
        lines += [f"  {c['status']}: {c['id']} {c['detail']}" for c in v["checks"]
                  if c["status"] != "pass"]
    return lines


# --------------------------------------------------------------------------- conversion


def convert_verified(engine: ContainerEngine, image: ImageInfo, output: Path, *, target: str,
                     verdict: verdicts.Verdict | None, require: str = verdicts.BUILD) -> Path:
    """Pipeline entry (``build-env --target T --sif PATH``): convert the just-verified image,
    with the engine and the verdict the pipeline already holds."""
    tags = list(image.tags)
    source = next((t for t in tags if t.endswith(f":{target}")), tags[0] if tags else image.id)
    convert(engine, image, output=Path(output), source=source, target=target, require=require,
            verdict=verdict)
    return Path(output)


def convert(engine: ContainerEngine, image: ImageInfo, *, output: Path, source: str,
            target: str | None = None, backend: str = "auto", force: bool = False,
            run: bool = True, phases: str = DEFAULT_PHASES, timeout: float = 900,
            tmpdir: Path | None = None, require: str = verdicts.BUILD,
            verdict: verdicts.Verdict | None = None, compression: str = "gzip"
            ) -> dict[str, Any]:
    """Build, verify, then atomically place the SIF. Raises SifError on any failure.

    The image needs a passing release verdict at the ``require`` level (the one release rule,
    :func:`builder.gate.verdicts.release_problem`); the verdict's labels (``org.verl-env.verdict.*``:
    level, ``gpu: pending`` or the GPU evidence) go into the SIF with the native backend.
    ``verdict``: the image's recorded verdict when the caller holds it (else it is read)."""
    if verdict is None:
        verdict = verdicts.lookup(image.id)
    elif verdict.image_id not in (None, image.id):
        raise SifError(f"the verdict handed over is about {verdict.image_id[:19]}, not "
                       f"{image.id[:19]}", target=target)
    problem = verdicts.release_problem(verdict, require)
    if problem and not force:
        raise SifError(f"image {source} ({image.id[7:19]}) has no passing verdict: {problem}; "
                       "run `build-env verify` on it first, or pass --force", target=target)
    labels = verdict.labels() if verdict is not None else {}
    chosen = pick_backend(backend, target, compression)
    output = output.absolute()
    with interrupts_raise(), placing(output, tmpdir, what=f"sif of {source} to {output}",
                                     needs=space_needs(chosen, image.size, compression),
                                     target=target) as work:
        started = time.monotonic()
        details = _build(engine, chosen, image, work.partial, source, work.scratch, target,
                         labels, compression)
        converted = time.monotonic() - started
        verification = verify_sif(work.partial, run=run, phases=phases, timeout=timeout,
                                  flags=_runtime_flags(image))
        _accept(verification, run, target)
        os.replace(work.partial, output)
    return {"schema": REPORT_SCHEMA, "target": target, "image_id": image.id, "source": source,
            "output": str(output), "backend": chosen, "compression": compression,
            "size": output.stat().st_size,
            "image_size": image.size, "build": details,
            "seconds": {"convert": round(converted, 1),
                        "total": round(time.monotonic() - started, 1)},
            "verification": verification, "verdict": labels}


def space_needs(backend: str, image_size: int, compression: str = "gzip") -> list[Need]:
    """What a conversion of an image of ``image_size`` bytes (the engine's uncompressed size)
    needs. The SIF is a gzip squashfs: at most about the image's size, rarely under an eighth of
    it (with nothing compressed, ``none``, rarely under half). The apptainer backend also writes
    the image's export as an archive into the scratch directory (about the image's size, at
    least half of it) and unpacks it there again."""
    kind = "a gzip squashfs" if compression == "gzip" else "an uncompressed squashfs"
    sif = Need("output", sif_native.least_size(image_size, compression), image_size,
               f"the SIF ({kind} of a {mib(image_size)} image)")
    if backend != "apptainer":
        return [sif]
    return [sif, Need("scratch", image_size // 2, 2 * image_size,
                      f"the apptainer backend's scratch (the image archive and its unpacked "
                      f"tree, {mib(image_size)} each)")]


def _runtime_flags(image: ImageInfo) -> tuple[str, ...]:
    """The family's apptainer flags (``--nv``/``--rocm``) from the image's accelerator label."""
    fam = family(image.labels.get("org.verl-env.accelerator"))
    return fam.apptainer_flags if fam else ()


def _accept(verification: dict[str, Any], run: bool, target: str | None) -> None:
    overall = verification["overall"]
    if overall == "pass":
        return
    bad = [c for c in verification["checks"] if c["status"] != "pass"]
    if overall == "incomplete" and not run and [c["id"] for c in bad] == ["selftest"]:
        return  # --no-run: the caller accepted an unexecuted SIF
    st = verification.get("selftest") or {}
    failing = "; ".join(f"{c['id']}: {c['status']} {c['detail']}".strip() for c in bad)
    extra = "".join(f"; {c['id']} {c['status']}" for c in st.get("not_passed", [])
                    if c.get("status") == "fail")
    raise SifError(f"the SIF did not verify ({overall}): {failing}{extra}", target=target)


def _build(engine: ContainerEngine, backend: str, image: ImageInfo, partial: Path, source: str,
           scratch: Path, target: str | None, labels: dict[str, str], compression: str
           ) -> dict[str, Any]:
    try:
        if backend == "native":
            result = sif_native.build(engine, image, partial, source=source, workdir=scratch,
                                      labels=labels, compression=compression)
            st = result.overlay
            return {"arch": result.arch, "source": "docker-export", "members": st.members,
                    "bytes_exported": st.bytes_in, "replaced": st.replaced,
                    "dropped": st.dropped, "added": len(st.added),
                    "seconds": {k: round(v, 2) for k, v in result.timings.items()}}
        return build_apptainer(engine, image, partial, source, scratch)
    except SifError as exc:
        exc.target = exc.target or target
        raise
    except InfraError:
        raise  # the engine died or its disk filled: exit 3, not a failed conversion
    except EngineError as exc:
        raise SifError(exc.args[0], target=target) from None
    except (OSError, ValueError, RuntimeError, OverlayError, tarfile.TarError) as exc:
        if is_disk_full(exc):
            raise  # placing() names the file system that filled
        raise SifError(f"{backend} conversion failed: {exc}", target=target) from None


def refuse_backend_compression(backend: str, compression: str, target: str | None = None
                               ) -> None:
    """A SIF with nothing compressed is the native backend's: apptainer's build always
    compresses with gzip. Bad input (exit 2), before any engine is asked."""
    if compression != "gzip" and backend == "apptainer":
        raise UsageError(f"--compression {compression} needs the native backend: apptainer's "
                         "build always compresses with gzip (pass --backend native or auto)",
                         target=target)


def pick_backend(requested: str, target: str | None = None, compression: str = "gzip") -> str:
    """``auto``: apptainer when installed, else native (which needs mksquashfs); a SIF with
    nothing compressed (``compression`` ``none``) is always the native backend's."""
    refuse_backend_compression(requested, compression, target)
    if requested in ("auto", "apptainer") and compression == "gzip" and apptainer_binary():
        return "apptainer"
    if requested == "apptainer":
        raise SifError("--backend apptainer: neither apptainer nor singularity is installed",
                       target=target)
    why = sif_native.have_tools()
    if why:
        raise SifError(f"native backend unavailable: {why}", target=target)
    return "native"


# --------------------------------------------------------------------------- apptainer backend


def apptainer_binary() -> str | None:
    return shutil.which("singularity") or shutil.which("apptainer")


@contextlib.contextmanager
def _singularity_on_path(scratch: Path) -> Iterator[None]:
    """spython only ever runs ``singularity``; where only ``apptainer`` exists, put a
    ``singularity`` link to it first on PATH for the duration."""
    if shutil.which("singularity"):
        yield
        return
    shim = scratch / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "singularity").symlink_to(shutil.which("apptainer") or "apptainer")
    old = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{shim}{os.pathsep}{old}"
    try:
        yield
    finally:
        os.environ["PATH"] = old


def export_archive(engine: ContainerEngine, image: ImageInfo, source: str, path: Path) -> None:
    """A one-layer ``docker-archive`` (what ``docker save`` writes) for apptainer: the layer is
    the engine's export of the image, streamed into the archive file (its tar header is written
    last, once the size is known); the config carries the image's Config and platform."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        f.write(bytes(tarfile.BLOCKSIZE))
        size = 0
        with engine.export(image.id) as chunks:
            for chunk in chunks:
                digest.update(chunk)
                f.write(chunk)
                size += len(chunk)
        f.write(bytes(-size % tarfile.BLOCKSIZE))
        config = json.dumps({"architecture": image.architecture or "amd64",
                             "os": image.os, "config": dict(image.config),
                             "rootfs": {"type": "layers",
                                        "diff_ids": [f"sha256:{digest.hexdigest()}"]}}).encode()
        config_name = f"{hashlib.sha256(config).hexdigest()}.json"
        tags = [source] if ":" in source.split("/")[-1] and "@" not in source else []
        manifest = json.dumps([{"Config": config_name, "RepoTags": tags,
                                "Layers": ["layer.tar"]}]).encode()
        for name, data in ((config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            f.write(info.tobuf(format=tarfile.GNU_FORMAT))
            f.write(data + bytes(-len(data) % tarfile.BLOCKSIZE))
        f.write(bytes(2 * tarfile.BLOCKSIZE))
        layer = tarfile.TarInfo("layer.tar")
        layer.size, layer.mode = size, 0o644
        head = layer.tobuf(format=tarfile.GNU_FORMAT)
        assert len(head) == tarfile.BLOCKSIZE
        f.seek(0)
        f.write(head)


def build_apptainer(engine: ContainerEngine, image: ImageInfo, partial: Path, source: str,
                    scratch: Path) -> dict[str, Any]:
    """``singularity build --tmpdir S PARTIAL docker-archive://S/image.tar`` through spython
    (the archive: :func:`export_archive`).

    spython discards the exit code and returns the path if the file exists afterwards, so the
    stale output is deleted first and a missing output is the failure signal; its captured
    stderr (spython prints it to stdout) becomes the error message.
    """
    from spython.main import Client  # the apptainer backend only (apptainer is optional)

    archive = scratch / "image.tar"
    t0 = time.monotonic()
    export_archive(engine, image, source, archive)
    exported = time.monotonic() - t0
    partial.unlink(missing_ok=True)
    captured = io.StringIO()
    with _singularity_on_path(scratch), contextlib.redirect_stdout(captured):
        try:
            result = Client.build(recipe=f"docker-archive://{archive}", image=str(partial),
                                  sudo=False, force=True, quiet=False,
                                  options=["--tmpdir", str(scratch)])
        except FileNotFoundError as exc:
            raise SifError(f"apptainer backend: cannot run singularity ({exc})") from None
    archive.unlink(missing_ok=True)
    if not result or not partial.exists():
        tail = captured.getvalue().strip()[-2000:] or "(no output)"
        raise SifError(f"apptainer build wrote no image; its output:\n{tail}")
    return {"seconds": {"export": round(exported, 2), "total": round(time.monotonic() - t0, 2)},
            "log_tail": captured.getvalue()[-1000:]}


def write_report(path: Path, data: dict[str, Any]) -> None:
    """A report as JSON, atomically (a failed write, a full disk included, leaves no temporary
    file)."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
