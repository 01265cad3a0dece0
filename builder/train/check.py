"""The train check's host side: run the checker (``incheck.pyz``) in a container of the image
through the engine (no network, no GPUs) with the model and data it needs, and read its verdict
back; or from a local SIF through apptainer, singularity or ch-run (:func:`run_check_sif`).

The engine API copies files into the container (it may be remote: nothing of this machine is
bind-mounted), so the model directory's small files (config, tokenizer, chat template: what the
check reads) and the data files go in at the same absolute paths the command names; weights are
left out (the check never loads them) and the whole is capped at :data:`COPY_LIMIT`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from builder.engine import ContainerEngine
from builder.errors import BuildEnvError, InfraError, SifError
from builder.train import CHECKER_NAME, SCHEMA, checker_bytes
from builder.train import overrides as hydra
from builder.train.shapes import engine_args, hydra_overrides, parse_override

IN_DIR, OUT_DIR = "/verl-env-train-check", "/verl-env-out"
REPORT = f"{OUT_DIR}/train-check.json"
# weights: the check loads the model's config and tokenizer, never its tensors
WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx")
COPY_LIMIT = 1 << 30
# the scratch directory under /tmp of a check from a SIF (its runtime mounts the SIF below it)
SIF_SCRATCH = "verl-env-train-check-"


def launch(checker: str) -> list[str]:
    """The argv that runs ``checker`` with the image's python under /bin/sh: a vendor base names
    its interpreter (builder.resolve.vendor). Arguments follow it."""
    return ["/bin/sh", "-c", 'PY=$(cat /opt/verl-env/interpreter 2>/dev/null); [ -x "$PY" ] || '
            'PY=$(command -v python3 || command -v python) || { echo "no python in image" >&2; '
            f'exit 3; }}; exec "$PY" {checker} "$@"', "verl-env-train-check"]


ENTRYPOINT = launch(f"{IN_DIR}/{CHECKER_NAME}")
STATUS_EXIT = {"pass": 0, "rejected": 1, "error": 3}


class TrainCheckError(BuildEnvError):
    """The check's inputs are unusable (exit 2): a missing model or data file, too much to copy,
    an image the engine does not have."""

    stage = "train-check"


@dataclass(frozen=True)
class TrainCheck:
    """One check's verdict: ``status`` pass | rejected | error, the checker's report."""

    image: str
    status: str
    report: Mapping[str, Any]
    seconds: float
    logs: str = ""
    stages: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)

    @property
    def exit_code(self) -> int:
        return STATUS_EXIT.get(self.status, 3)

    def failures(self) -> list[Mapping[str, Any]]:
        return [s for s in self.stages if s.get("status") == "fail"]


def data_files(argv: Sequence[str]) -> list[str]:
    """The train and val files a trainer argv names (``data.train_files=``/``val_files=``, a
    path or a hydra list ``[a,b]``; the last value of a key wins, as in hydra)."""
    found: dict[str, list[str]] = {}
    for word in hydra_overrides(argv):
        if word.startswith("-"):  # hydra's own flags (--config-name=...)
            continue
        key, text = parse_override(word)
        if key in ("data.train_files", "data.val_files"):
            found[key] = [i for i in hydra.items(text.split("=", 1)[1]) if i]
    return [f for files in found.values() for f in files]


def model_path(argv: Sequence[str]) -> str | None:
    """``actor_rollout_ref.model.path`` of a trainer argv (the last one wins)."""
    out = None
    for word in hydra_overrides(argv):
        if word.startswith("-"):
            continue
        key, text = parse_override(word)
        if key == "actor_rollout_ref.model.path":
            out = hydra.unquote(text.split("=", 1)[1])
    return out


def inputs(argv: Sequence[str]) -> dict[str, bytes]:
    """What the container needs, by its absolute path: the model directory's files but its
    weights, and the data files. TrainCheckError for a missing one or too much."""
    files: dict[str, bytes] = {}
    model = model_path(argv)
    if model and (model.startswith("/") or model.startswith("~")):
        root = Path(os.path.expanduser(model))
        if not root.is_dir():
            raise TrainCheckError(f"actor_rollout_ref.model.path={model}: no such directory")
        for p in sorted(root.rglob("*")):
            if p.is_file() and not p.name.endswith(WEIGHTS) and ".cache" not in p.parts:
                files[str(p)] = b""
    for name in data_files(argv):
        p = Path(os.path.expanduser(name))
        if not p.is_file():
            raise TrainCheckError(f"data file {name}: no such file")
        files[str(p)] = b""
    size = sum(Path(p).stat().st_size for p in files)
    if size > COPY_LIMIT:
        raise TrainCheckError(
            f"the model's small files and the data come to {size >> 20} MiB, over the "
            f"{COPY_LIMIT >> 20} MiB the check copies into the container (the engine API "
            "binds nothing): check with a data file holding a sample")
    return {p: Path(p).read_bytes() for p in files}


def run_check(engine: ContainerEngine, image: str, argv: Sequence[str], *, nnodes: int,
              gpus_per_node: int, timeout: float = 300) -> TrainCheck:
    """Run the checker on the trainer ``argv`` in a container of ``image``. Never raises for
    a rejected command; InfraError when the checker could not run (exit 3)."""
    files = inputs(argv)
    files[f"{IN_DIR}/{CHECKER_NAME}"] = checker_bytes()
    command = ["--nnodes", str(nnodes), "--gpus-per-node", str(gpus_per_node),
               "--json", REPORT, *engine_args(), "--", *hydra_overrides(argv)]
    result = engine.run(image, command, entrypoint=ENTRYPOINT, timeout=timeout, network="none",
                        files=files, dirs=[OUT_DIR, "/tmp"], collect=[REPORT],
                        environment={"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"},
                        role="train-check")
    return _verdict(image, result.files.get(REPORT), result.exit_code, result.logs,
                    result.seconds, timeout)


def _verdict(image: str, raw: bytes | None, exit_code: int | None, logs: str, seconds: float,
             timeout: float) -> TrainCheck:
    """The checker's report read back and held to its exit code; InfraError when it could not
    run (killed, no report, a report its exit contradicts)."""
    report = _parse(raw)
    if exit_code is None:
        raise InfraError(f"the train check in {image} ran past {timeout:g} s and was killed; "
                         f"its last words: {_tail(logs)}")
    if not report or report.get("schema") != SCHEMA or report.get("status") not in STATUS_EXIT:
        raise InfraError(f"the train check in {image} wrote no report (exit "
                         f"{exit_code}): {_tail(logs)}")
    status = str(report["status"])
    if STATUS_EXIT[status] != exit_code:
        raise InfraError(f"the train check in {image} said {status} but exited "
                         f"{exit_code}: {_tail(logs)}")
    return TrainCheck(image, status, report, seconds, logs, tuple(report.get("stages") or ()))


def relocate(words: Sequence[str], roots: Sequence[str], prefix: str) -> list[str]:
    """The overrides with every path value at or under one of ``roots`` (absolute) moved under
    ``prefix`` (where the check copied those files), quoted for hydra again; a hydra list
    ``[a,b]`` item by item. Every other word is kept as it is."""
    bases = [r.rstrip("/") or "/" for r in roots]

    def under(path: str) -> bool:
        return any(path == b or path.startswith(b + "/") for b in bases)

    out = []
    for word in words:
        head, eq, value = word.partition("=")
        paths = [os.path.expanduser(i) for i in hydra.items(value)] if eq else []
        if not any(under(p) for p in paths):
            out.append(word)
            continue
        moved = [hydra.quote(f"{prefix}{p}" if under(p) else p) for p in paths]
        body = value.strip()
        out.append(f"{head}=[{','.join(moved)}]" if body.startswith("[") and body.endswith("]")
                   else f"{head}={moved[0]}")
    return out


# (sif, argv, scratch under /tmp, timeout) -> (runtime name, its process; None: killed at the
# timeout); SifError when it cannot run: builder.sif.checks.argv_runner (the commands pass it in)
SifRunner = Callable[[Path, list[str], Path, float],
                     tuple[str, "subprocess.CompletedProcess[str] | None"]]


def run_check_sif(sif: Path, argv: Sequence[str], *, nnodes: int, gpus_per_node: int,
                  runner: SifRunner, timeout: float = 300) -> TrainCheck:
    """Run the checker on the trainer ``argv`` from the local SIF ``sif`` with ``runner``
    (apptainer, singularity or ch-run; no GPUs handed in). The model's small files and the data
    files are copied read-only into a scratch directory under /tmp (which the runtime shares)
    and the command's paths moved there; the report names the paths as given. Never raises for
    a rejected command; InfraError when it could not run (no runtime here, killed, no
    report)."""
    files = inputs(argv)
    with tempfile.TemporaryDirectory(prefix=SIF_SCRATCH, dir="/tmp") as tmp:
        scratch = Path(tmp)
        root = scratch / "in"
        for name, data in files.items():
            dest = root / name.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            dest.chmod(0o444)
        checker, report = scratch / CHECKER_NAME, scratch / "out" / "train-check.json"
        checker.write_bytes(checker_bytes())
        (scratch / "out").mkdir()
        (scratch / "home").mkdir()
        model = model_path(argv)
        roots = [os.path.expanduser(p) for p in [*data_files(argv), *([model] if model else [])]]
        words = relocate(hydra_overrides(argv), [r for r in roots if r.startswith("/")],
                         str(root))
        inner = ["env", f"HOME={scratch / 'home'}", "PYTHONDONTWRITEBYTECODE=1",
                 "HF_HUB_OFFLINE=1", *launch(str(checker)), "--nnodes", str(nnodes),
                 "--gpus-per-node", str(gpus_per_node), "--json", str(report), *engine_args(),
                 "--", *words]
        start = time.monotonic()
        try:
            name, proc = runner(sif, inner, scratch, timeout)
        except SifError as exc:
            raise InfraError(f"the train check from {sif} could not run: "
                             f"{exc.args[0] if exc.args else exc}") from exc
        seconds = time.monotonic() - start
        raw = report.read_bytes().replace(str(root).encode(), b"") if report.is_file() else None
    code, logs = (None, "") if proc is None else (proc.returncode, proc.stdout + proc.stderr)
    return _verdict(f"{sif} ({name})", raw, code, logs.replace(str(root), ""), seconds, timeout)


def _parse(raw: bytes | None) -> dict[str, Any]:
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _tail(logs: str, n: int = 600) -> str:
    return " ".join(logs.strip()[-n:].split()) or "(no output)"


def summary_lines(check: TrainCheck) -> list[str]:
    """What a person reads: one line per stage, verl's message and the fix under a failure."""
    out = [f"train check of {check.image}: {check.status} (level config: verl's configuration "
           f"checks, never GPU-proven; {check.seconds:.1f} s)"]
    for s in check.stages:
        name, status = s.get("name", "?"), s.get("status", "?")
        what = s.get("verl_says") or s.get("reason") or s.get("trainer") or ""
        out.append(f"  {status:<6} {name}{': ' + str(what) if what else ''}")
        if status == "fail":
            out.append(f"         verl: {s.get('message', '')}")
            if s.get("fix"):
                out.append(f"         fix:  {fix_options(str(s['fix']))}")
    if check.status == "error":
        out.append(f"  error: {check.report.get('error', '')}")
    return out


def fix_options(fix: str) -> str:
    """A stage's fix as the options to type: ``--override KEY=VALUE`` for each override of an
    override-only fix (``a=1 b=2`` -> ``--override a=1 --override b=2``), else as said."""
    words = fix.split(" ")
    if all(re.match(r"^[+~]*[A-Za-z_][\w.\-]*=\S*$", w) for w in words):
        return " ".join(f"--override {w}" for w in words)
    return fix
