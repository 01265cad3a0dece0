"""The checks of a SIF: its structure (our own parser and ``siftool``, the reference
implementation: its listing, header and objects), its contents (``unsquashfs`` at the partition
offset), and that it executes: the image's self-test run from the SIF's squashfs by a real
container runtime (apptainer where installed, else charliecloud's ``ch-run`` on a ``squashfuse``
mount of the partition, or on an extracted copy of it).

:func:`verify_sif` returns a report; every check is ``pass``, ``fail`` or ``skip`` with a reason,
and a skipped check makes the verdict ``incomplete``, never ``pass``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder import shipped
from builder.errors import SifError
from builder.sif import format as sif_format
from builder.sif import meta as sif_meta

SCHEMA = "verl-env/sif-verify/v1"
DEFAULT_PHASES = "preflight,env,imports,versions,abi,cpu"
EXPECTED_OBJECTS = [("Def.FILE", ""), ("JSON.Generic", "inspect-metadata.json"),
                    ("JSON.Generic", "oci-config.json")]
_LIST_ROW = re.compile(r"^(\d+)\s*\|(\S+)\s*\|(.+?)\s*\|(\d+)-(\d+)\s*\|(.*)$")
TREE = [".singularity.d/runscript", ".singularity.d/env/10-docker2singularity.sh",
        ".singularity.d/env/90-environment.sh", ".singularity.d/env/99-base.sh",
        ".singularity.d/actions/exec", ".singularity.d/actions/run", ".singularity.d/labels.json",
        ".singularity.d/Singularity", ".singularity.d/libs", "singularity", "environment",
        "etc/hosts", "etc/resolv.conf", "proc", "sys", "dev", "tmp", "home"]
# Runs under the image's /bin/sh after the env scripts: the baked self-test, else the host copy;
# a vendor base's interpreter (/opt/verl-env/interpreter) first, as the image gate does.
_LAUNCH = ('[ -d /opt/verl-env/verl_env_selftest ] || '
           'export PYTHONPATH="$VERL_ENV_HOST_SELFTEST${PYTHONPATH:+:$PYTHONPATH}"; '
           'PY=$(cat /opt/verl-env/interpreter 2>/dev/null); [ -x "$PY" ] || '
           'PY=$(command -v python || command -v python3) || { echo "no python in image" >&2; '
           'exit 3; }; exec "$PY" -m verl_env_selftest "$@"')
HOST_SELFTEST_ENV = "VERL_ENV_HOST_SELFTEST"
RUNTIMES = ("apptainer", "singularity", "ch-run")
# the scratch directory under /tmp of a SIF's self-test run (its runtime mounts the SIF below it)
RUN_SCRATCH = "verl-env-sifrun-"


@dataclass
class Report:
    path: str
    checks: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    selftest: dict[str, Any] | None = None

    def add(self, ident: str, ok: bool | None, detail: str = "") -> bool:
        status = "skip" if ok is None else ("pass" if ok else "fail")
        self.checks.append({"id": ident, "status": status, "detail": detail})
        return bool(ok)

    @property
    def overall(self) -> str:
        statuses = {c["status"] for c in self.checks}
        return "fail" if "fail" in statuses else ("incomplete" if "skip" in statuses else "pass")

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "path": self.path, "overall": self.overall, **self.info,
                "checks": self.checks, "selftest": self.selftest}


def _run(cmd: list[str], timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


# --------------------------------------------------------------------------- structure


def check_structure(path: Path, report: Report) -> sif_format.SifInfo | None:
    """Header and descriptors, parsed here: the object set apptainer writes."""
    try:
        info = sif_format.read_info(path)
    except (OSError, sif_format.SifFormatError) as exc:
        report.add("structure.header", False, str(exc))
        return None
    launch = info.launch_script.strip()
    report.add("structure.header", launch == sif_format.LAUNCH_SCRIPT.decode().strip()
               and info.version == "01", f"launch {launch!r}, version {info.version}")
    objects = [(d.type_name, d.name) for d in info.descriptors]
    part = info.primary_partition()
    report.add("structure.objects", objects[:3] == EXPECTED_OBJECTS and part is not None
               and part.ident == 4, f"{objects}")
    data = [d for d in info.descriptors if d.datatype != sif_format.DATA_SIGNATURE]
    report.add("structure.groups", all(d.group == 1 and d.link == 0 for d in data),
               "all objects in group 1, unlinked (signatures aside)")
    if part is None:
        report.add("structure.partition", False, "no primary system partition")
        return info
    with open(path, "rb") as f:
        f.seek(part.offset)
        sb = f.read(22)
    compression = int.from_bytes(sb[20:22], "little") if len(sb) == 22 else -1
    report.add("structure.partition", part.fstype == sif_format.FS_SQUASH
               and part.offset % 4096 == 0 and sb[:4] == b"hsqs" and compression == 1
               and part.offset + part.size <= path.stat().st_size,
               f"squashfs at {part.offset} ({part.size} bytes), compression id {compression}")
    report.add("structure.arch", part.arch != "unknown" and part.arch == info.arch,
               f"partition {part.arch}, header {info.arch}")
    report.info.update(arch=part.arch, partition_offset=part.offset, partition_size=part.size,
                       size=path.stat().st_size)
    return info


def parse_siftool_list(text: str) -> list[dict[str, str]]:
    """Rows of ``siftool list``."""
    rows = []
    for line in text.splitlines():
        m = _LIST_ROW.match(line.strip())
        if m:
            rows.append({"id": m.group(1), "group": m.group(2), "link": m.group(3).strip(),
                         "start": m.group(4), "end": m.group(5), "type": m.group(6).strip()})
    return rows


def check_siftool(path: Path, info: sif_format.SifInfo, report: Report) -> None:
    """The reference implementation agrees: header, object list, partition and JSON names."""
    siftool = shutil.which("siftool")
    if not siftool:
        report.add("siftool", None, "siftool not installed (apt-get install siftool)")
        return
    head = _run([siftool, "header", str(path)])
    arch = info.arch
    launch = re.search(r"Launch Script:\s+(.*)", head.stdout)
    prim = re.search(r"Primary Architecture:\s+(\S+)", head.stdout)
    report.add("siftool.header", head.returncode == 0 and launch is not None
               and launch.group(1).strip() == "#!/usr/bin/env run-singularity"
               and prim is not None and prim.group(1) == arch,
               f"launch {launch.group(1).strip() if launch else None!r}, primary "
               f"{prim.group(1) if prim else None}" if head.returncode == 0
               else head.stderr.strip()[:300])
    listing = _run([siftool, "list", str(path)])
    rows = parse_siftool_list(listing.stdout)
    types = [r["type"] for r in rows]
    want = ["Def.FILE", "JSON.Generic", "JSON.Generic", f"FS (Squashfs/*System/{arch})"]
    report.add("siftool.list", listing.returncode == 0 and types[:4] == want
               and all(r["group"] == "1" and r["link"] == "NONE" for r in rows[:4]),
               f"{types}" if rows else listing.stderr.strip()[:300])
    names = []
    for row in rows[1:3]:
        out = _run([siftool, "info", row["id"], str(path)]).stdout
        m = re.search(r"Name:\s+(\S+)", out)
        names.append(m.group(1) if m else "")
    fs = _run([siftool, "info", rows[3]["id"], str(path)]).stdout if len(rows) > 3 else ""
    report.add("siftool.info", names == ["inspect-metadata.json", "oci-config.json"]
               and re.search(r"Filesystem Type:\s+Squashfs", fs) is not None
               and re.search(r"Partition Type:\s+\*System", fs) is not None
               and re.search(rf"Architecture:\s+{arch}\b", fs) is not None,
               f"JSON objects {names}")


# --------------------------------------------------------------------------- contents


def _cat(path: Path, offset: int, member: str) -> str | None:
    proc = _run(["unsquashfs", "-o", str(offset), "-cat", str(path), member])
    return proc.stdout if proc.returncode == 0 else None


def _compression(superblock: str) -> str:
    """What ``unsquashfs -s`` says of a gzip squashfs's compression: the level, or which parts
    are stored uncompressed (``--compression none``: all of them)."""
    stored = [part for part in ("Inodes", "Data", "Fragments")
              if f"{part} are uncompressed" in superblock or f"{part} is uncompressed" in superblock]
    if len(stored) == 3:
        return "gzip superblock, nothing compressed"
    level = re.search(r"compression-level (\d+)", superblock)  # listed where not mksquashfs's 9
    parts = f"; {', '.join(stored).lower()} stored uncompressed" if stored else ""
    return f"gzip (level {level.group(1) if level else 9}{parts})"


def check_contents(path: Path, info: sif_format.SifInfo, report: Report) -> None:
    """The squashfs holds the tree apptainer adds, consistent with the SIF's metadata objects."""
    part = info.primary_partition()
    if part is None:
        return
    if not shutil.which("unsquashfs"):
        report.add("contents", None, "unsquashfs not installed (apt-get install squashfs-tools)")
        return
    off = part.offset
    sb = _run(["unsquashfs", "-o", str(off), "-s", str(path)]).stdout
    report.add("contents.squashfs", "Compression gzip" in sb and "Block size 131072" in sb,
               f"{_compression(sb)}, 128 KiB blocks" if "Compression gzip" in sb
               else sb.strip()[:200])
    listing = _run(["unsquashfs", "-o", str(off), "-lln", str(path), *TREE]).stdout
    present = {line.split("squashfs-root/", 1)[1].split(" -> ")[0]
               for line in listing.splitlines() if "squashfs-root/" in line}
    missing = [p for p in TREE if p not in present]
    report.add("contents.tree", not missing, f"missing {missing}" if missing else
               f"{len(TREE)} entries of the /.singularity.d tree and mount points present")
    runscript = _cat(path, off, ".singularity.d/runscript") or ""
    report.add("contents.runscript", sif_meta.RUN_MARKER in runscript.splitlines(),
               "docker runscript marker line present")
    meta = _json_object(path, info, "inspect-metadata.json")
    attrs = (meta or {}).get("data", {}).get("attributes", {})
    env = _cat(path, off, sif_meta.ENV_SCRIPT)
    labels = _cat(path, off, ".singularity.d/labels.json")
    deffile = _cat(path, off, ".singularity.d/Singularity")
    definition = sif_format.read_object(path, info.descriptors[0]).decode(errors="replace")
    try:
        same_labels = labels is not None and json.loads(labels) == attrs.get("labels")
    except ValueError:
        same_labels = False
    consistent = (env is not None and attrs.get("environment", {}).get(
        "/" + sif_meta.ENV_SCRIPT) == env.rstrip("\n") and same_labels
        and deffile == definition and attrs.get("deffile") == definition.rstrip("\n")
        and attrs.get("runscript") == runscript.rstrip("\n"))
    report.add("contents.metadata", consistent,
               "env script, labels, runscript and definition match the SIF's JSON objects")
    report.info["labels"] = attrs.get("labels", {})


def _json_object(path: Path, info: sif_format.SifInfo, name: str) -> dict[str, Any] | None:
    d = info.named(name)
    if d is None:
        return None
    try:
        return json.loads(sif_format.read_object(path, d))
    except (ValueError, sif_format.SifFormatError):
        return None


# --------------------------------------------------------------------------- execution


@contextlib.contextmanager
def squashfs_root(path: Path, offset: int, size: int, scratch: Path) -> Iterator[Path]:
    """The partition as something ``ch-run`` can run: a squashfuse mount at the offset
    (unmounted on exit), or else an extracted ``.sqfs`` copy (removed on exit)."""
    if shutil.which("squashfuse") and Path("/dev/fuse").exists():
        mnt = scratch / "root"
        mnt.mkdir()
        proc = _run(["squashfuse", "-o", f"offset={offset}", str(path), str(mnt)])
        if proc.returncode == 0:
            try:
                yield mnt
            finally:
                unmount(mnt)
                with contextlib.suppress(OSError):
                    mnt.rmdir()
            return
    copy = scratch / "rootfs.sqfs"
    with open(path, "rb") as src, open(copy, "wb") as dst:
        left, pos = size, offset
        while left:
            n = os.copy_file_range(src.fileno(), dst.fileno(), left, pos)
            if n == 0:
                break
            left, pos = left - n, pos + n
    try:
        yield copy
    finally:
        copy.unlink(missing_ok=True)


UNMOUNT_TRIES = 10  # half a second apart


def unmount(mnt: Path) -> None:
    """Unmount a squashfuse mount. A process the self-test left behind (a daemon still exiting)
    can hold it busy for a moment: try again for a few seconds, then detach it lazily (it goes
    when its last user does). Never left mounted: the scratch directory's removal would walk
    into the image's read-only tree and fail there (ENOSYS, naming a file of the image)."""
    for attempt in range(UNMOUNT_TRIES):
        if _run(["umount", str(mnt)]).returncode == 0 or not os.path.ismount(mnt):
            return
        if attempt + 1 < UNMOUNT_TRIES:
            time.sleep(0.5)
    _run(["umount", "--lazy", str(mnt)])


def _selftest_copy(scratch: Path) -> Path:
    host = scratch / "host"
    shipped.copy_selftest(host / "verl_env_selftest")
    return host


def runtime_command(image: Path, home: Path, args: list[str]) -> list[str]:
    """``ch-run`` with a clean environment like ``apptainer exec``: the image's env scripts
    are sourced by its exec action; HOME is a scratch directory (the image is read-only)."""
    return ["env", "-i", "USER=root", f"HOME={home}", "PATH=/usr/bin:/bin", "LANG=C.UTF-8",
            "ch-run", "--no-passwd", str(image), "--", *args]


def apptainer_command(binary: str, sif: Path, inner: list[str], *,
                      flags: tuple[str, ...] = (), env: dict[str, str] | None = None
                      ) -> list[str]:
    """``apptainer exec --cleanenv [--nv|--rocm] --env K=V ... SIF CMD``: the family's runtime
    flags hand the host's GPU stack in; ``env`` (the self-test's copy, the GPU visibility
    variables Slurm set) crosses --cleanenv explicitly."""
    cmd = [binary, "exec", "--cleanenv", *flags]
    for key, value in sorted((env or {}).items()):
        cmd += ["--env", f"{key}={value}"]
    return [*cmd, str(sif), *inner]


def pick_runtime(requested: str | None = None) -> tuple[str, str] | None:
    """(name, path) of the runtime that runs a SIF: ``requested``, else apptainer, singularity,
    then ch-run (which injects no host GPU stack). None when none is installed."""
    for name in ([requested] if requested else RUNTIMES):
        path = shutil.which(name)
        if path:
            return name, path
    return None


@dataclass
class SifRun:
    """One self-test run from a SIF."""

    runtime: str
    command: list[str]
    exit_code: int | None  # None: killed at the timeout
    report: dict[str, Any]
    logs: str
    seconds: float


def run_argv_in_sif(path: Path, inner: list[str], scratch: Path, *, timeout: float,
                    runtime: tuple[str, str] | None = None, flags: tuple[str, ...] = (),
                    env: dict[str, str] | None = None
                    ) -> tuple[str, list[str], subprocess.CompletedProcess[str] | None]:
    """Run the argv ``inner`` from the SIF with a real runtime: apptainer/singularity with
    ``flags`` (``--nv``/``--rocm``) and ``env`` across --cleanenv, or ch-run on the SIF's
    squashfs (``flags`` must be empty: ch-run cannot hand GPUs in). ``scratch``: a directory
    under /tmp (shared with the container by apptainer and ch-run alike) for what the command
    reads and writes, and ch-run's HOME. Returns (runtime name, the command, its process; None
    when killed at ``timeout``). SifError when no runtime is installed or the SIF has no
    partition."""
    runtime = runtime or pick_runtime()
    if runtime is None:
        raise SifError("no container runtime to run the SIF (apptainer, singularity or "
                       "charliecloud's ch-run)")
    name, binary = runtime
    if name != "ch-run":
        cmd = apptainer_command(binary, path, inner, flags=flags, env=env)
        return name, cmd, _run_or_kill(cmd, timeout)
    if flags:
        raise SifError(f"ch-run cannot apply {' '.join(flags)}: it injects no host GPU "
                       "stack (use apptainer or singularity)")
    part = sif_format.read_info(path).primary_partition()
    if part is None:
        raise SifError(f"{path}: no primary system partition")
    with squashfs_root(path, part.offset, part.size, scratch) as image:
        cmd = runtime_command(image, scratch, ["/.singularity.d/actions/exec", "env",
                                               *(f"{k}={v}" for k, v in
                                                 sorted((env or {}).items())), *inner])
        return name, cmd, _run_or_kill(cmd, timeout)


def argv_runner(requested: str | None = None
                ) -> Callable[[Path, list[str], Path, float],
                              tuple[str, subprocess.CompletedProcess[str] | None]]:
    """``run(path, inner, scratch, timeout) -> (runtime name, process)``: :func:`run_argv_in_sif`
    with the runtime installed here (``requested`` when it runs a SIF and is installed, else
    :func:`pick_runtime`'s), no GPU flags. SifError when it runs and no runtime is installed."""

    def run(path: Path, inner: list[str], scratch: Path, timeout: float
            ) -> tuple[str, subprocess.CompletedProcess[str] | None]:
        runtime = (pick_runtime(requested) if requested in RUNTIMES else None) or pick_runtime()
        name, _, proc = run_argv_in_sif(path, inner, scratch, timeout=timeout, runtime=runtime)
        return name, proc

    return run


def run_in_sif(path: Path, args: list[str], *, timeout: float,
               runtime: tuple[str, str] | None = None, flags: tuple[str, ...] = (),
               env: dict[str, str] | None = None) -> SifRun:
    """Run the image's self-test (``args`` after ``--json OUT``) from the SIF with a real
    runtime (:func:`run_argv_in_sif`). Raises SifError when no runtime is installed or the SIF
    has no partition."""
    runtime = runtime or pick_runtime()
    if runtime is None:
        raise SifError("no container runtime to run the SIF (apptainer, singularity or "
                       "charliecloud's ch-run)")
    # /tmp is shared with the container by apptainer and ch-run alike.
    with tempfile.TemporaryDirectory(prefix=RUN_SCRATCH, dir="/tmp") as tmp:
        scratch = Path(tmp)
        out = scratch / "report.json"
        host = _selftest_copy(scratch)
        inner = ["/bin/sh", "-c", _LAUNCH, "selftest", "--json", str(out), *args]
        environment = {HOST_SELFTEST_ENV: str(host), **(env or {})}
        start = time.monotonic()
        name, cmd, proc = run_argv_in_sif(path, inner, scratch, timeout=timeout,
                                          runtime=runtime, flags=flags, env=environment)
        seconds = time.monotonic() - start
        try:
            report = json.loads(out.read_text()) if out.exists() else {}
        except json.JSONDecodeError:
            report = {}
    code, logs = (None, "") if proc is None else (proc.returncode, proc.stdout + proc.stderr)
    return SifRun(name, cmd, code, report if isinstance(report, dict) else {}, logs, seconds)


def _run_or_kill(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
    try:
        return _run(cmd, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def run_selftest(path: Path, info: sif_format.SifInfo, report: Report, *, phases: str,
                 timeout: float, flags: tuple[str, ...] = ()) -> None:
    """Run the image's self-test from the SIF with a real runtime; record its report.
    ``flags``: the family's apptainer flags (ignored by ch-run, which cannot apply them; the
    phases the conversion runs need no GPU)."""
    if info.primary_partition() is None:
        return
    runtime = pick_runtime()
    if runtime is None:
        report.add("selftest", None, "no container runtime (apptainer or charliecloud ch-run)")
        return
    run = run_in_sif(path, ["--phases", phases], timeout=timeout, runtime=runtime,
                     flags=() if runtime[0] == "ch-run" else flags)
    if run.exit_code is None:
        report.add("selftest", False, f"killed after {timeout:.0f} s")
        return
    result = run.report
    overall = result.get("overall", "error")
    report.selftest = {"runtime": run.runtime, "phases": phases, "exit_code": run.exit_code,
                       "overall": overall, "summary": result.get("summary"),
                       "seconds": round(run.seconds, 1), "flags": list(flags),
                       "not_passed": [{k: c.get(k) for k in ("id", "status", "reason")}
                                      for c in result.get("checks", [])
                                      if c.get("status") != "pass"]}
    reason = result.get("error") or ""
    if not result:
        report.selftest["log_tail"] = run.logs[-2000:]
        reason = (run.logs.strip().splitlines() or [""])[-1][:300]
    report.add("selftest", run.exit_code == 0 and overall == "pass",
               f"{run.runtime}: exit {run.exit_code}, {overall}, {run.seconds:.1f} s"
               + (f": {reason}" if reason else ""))


def sif_labels(path: Path) -> dict[str, str]:
    """The labels a SIF carries (its inspect metadata; empty when it has none)."""
    info = sif_format.read_info(path)
    meta = _json_object(path, info, "inspect-metadata.json")
    labels = (meta or {}).get("data", {}).get("attributes", {}).get("labels")
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def verify_sif(path: Path, *, run: bool = True, phases: str = DEFAULT_PHASES,
               timeout: float = 900, flags: tuple[str, ...] = ()) -> dict[str, Any]:
    """Check a SIF's structure, contents and (``run``) that its self-test passes in it
    (``flags``: the family's apptainer flags)."""
    report = Report(str(path))
    info = check_structure(path, report)
    if info is not None and info.primary_partition() is not None:
        check_siftool(path, info, report)
        check_contents(path, info, report)
        if run:
            run_selftest(path, info, report, phases=phases, timeout=timeout, flags=flags)
        else:
            report.add("selftest", None, "not run (--no-run)")
    return report.to_dict()
