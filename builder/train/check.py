"""The train check's host side: run ``incheck.py`` in a container of the image through the
engine (no network, no GPUs) with the model and data it needs, and read its verdict back.

The engine API copies files into the container (it may be remote: nothing of this machine is
bind-mounted), so the model directory's small files (config, tokenizer, chat template: what the
check reads) and the data files go in at the same absolute paths the command names; weights are
left out (the check never loads them) and the whole is capped at :data:`COPY_LIMIT`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from builder.engine import ContainerEngine
from builder.errors import BuildEnvError, InfraError
from builder.train.shapes import hydra_overrides, parse_override

CHECKER = Path(__file__).resolve().parent / "incheck.py"
SCHEMA = "verl-env/train-check/v1"
IN_DIR, OUT_DIR = "/verl-env-train-check", "/verl-env-out"
REPORT = f"{OUT_DIR}/train-check.json"
# weights: the check loads the model's config and tokenizer, never its tensors
WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx")
COPY_LIMIT = 1 << 30
# Runs under /bin/sh in the image: a vendor base names its interpreter (builder.vendor).
_LAUNCH = ('PY=$(cat /opt/verl-env/interpreter 2>/dev/null); [ -x "$PY" ] || '
           'PY=$(command -v python3 || command -v python) || { echo "no python in image" >&2; '
           f'exit 3; }}; exec "$PY" {IN_DIR}/incheck.py "$@"')
ENTRYPOINT = ["/bin/sh", "-c", _LAUNCH, "verl-env-train-check"]
STATUS_EXIT = {"pass": 0, "rejected": 1, "error": 3}


class TrainCheckError(BuildEnvError):
    """The check's inputs are unusable (exit 2): a missing model or data file, too much to copy."""


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
        key, text = parse_override(word)
        if key in ("data.train_files", "data.val_files"):
            value = text.split("=", 1)[1].strip().strip("'\"")
            items = value[1:-1].split(",") if value.startswith("[") else [value]
            found[key] = [i.strip().strip("'\"") for i in items if i.strip()]
    return [f for files in found.values() for f in files]


def model_path(argv: Sequence[str]) -> str | None:
    """``actor_rollout_ref.model.path`` of a trainer argv (the last one wins)."""
    out = None
    for word in hydra_overrides(argv):
        key, text = parse_override(word)
        if key == "actor_rollout_ref.model.path":
            out = text.split("=", 1)[1].strip().strip("'\"")
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
    files[f"{IN_DIR}/incheck.py"] = CHECKER.read_bytes()
    command = ["--nnodes", str(nnodes), "--gpus-per-node", str(gpus_per_node),
               "--json", REPORT, "--", *hydra_overrides(argv)]
    result = engine.run(image, command, entrypoint=ENTRYPOINT, timeout=timeout, network="none",
                        files=files, dirs=[OUT_DIR, "/tmp"], collect=[REPORT],
                        environment={"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"},
                        role="train-check")
    raw = result.files.get(REPORT)
    report = _parse(raw)
    if result.exit_code is None:
        raise InfraError(f"the train check in {image} ran past {timeout:g} s and was killed; "
                         f"its last words: {_tail(result.logs)}")
    if not report or report.get("schema") != SCHEMA or report.get("status") not in STATUS_EXIT:
        raise InfraError(f"the train check in {image} wrote no report (exit "
                         f"{result.exit_code}): {_tail(result.logs)}")
    status = str(report["status"])
    if STATUS_EXIT[status] != result.exit_code:
        raise InfraError(f"the train check in {image} said {status} but exited "
                         f"{result.exit_code}: {_tail(result.logs)}")
    return TrainCheck(image, status, report, result.seconds, result.logs,
                      tuple(report.get("stages") or ()))


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
                out.append(f"         fix:  --override {s['fix']}"
                           if "=" in str(s["fix"]).split(" ")[0] else f"         fix:  {s['fix']}")
    if check.status == "error":
        out.append(f"  error: {check.report.get('error', '')}")
    return out
