"""The gate: run the self-test inside an image and read its JSON report.

The image's own baked self-test runs when present (``/opt/verl-env/verl_env_selftest``); for any
other image the host's copy is mounted read-only and run instead, so ``build-env verify`` works on
images this tool did not build. Exit code of the self-test: 0 pass, 1 fail, 2 incomplete, 3 error.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from builder import verdicts
from builder.engine import Engine

VERDICTS = {0: "pass", 1: "fail", 2: "incomplete", 3: "error"}
# Runs under /bin/sh in the image: prefer the baked self-test, else the mounted host copy.
_LAUNCH = ('PY=$(command -v python || command -v python3) || { echo "no python in image" >&2; '
           'exit 3; }; [ -d /opt/verl-env/verl_env_selftest ] || '
           'export PYTHONPATH=/verl-env-host${PYTHONPATH:+:$PYTHONPATH}; '
           'exec "$PY" -m verl_env_selftest "$@"')


@dataclass(frozen=True)
class Verification:
    image: str
    exit_code: int
    report: dict[str, Any]
    logs: str
    seconds: float

    @property
    def overall(self) -> str:
        return str(self.report.get("overall") or VERDICTS.get(self.exit_code, "error"))

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and self.overall == "pass"

    def failed_checks(self) -> list[dict[str, Any]]:
        return [c for c in self.report.get("checks", [])
                if c.get("status") == "fail" or (c.get("status") == "skip" and c.get("required"))]


def selftest_source() -> Path:
    return Path(str(resources.files("builder") / "selftest"))


def gpu_kind() -> str | None:
    """Which GPUs this host can hand to a container (None on a CPU-only build host)."""
    if os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi"):
        return "nvidia"
    if os.path.exists("/dev/kfd"):
        return "amd"
    return None


def verify_image(engine: Engine, image: str, *, timeout: float = 900, gpus: str | None = "auto",
                 extra_args: list[str] | None = None, network: str = "none",
                 manifest: dict[str, Any] | None = None) -> Verification:
    """Run the self-test in a fresh container of ``image``; never raises for a failed verdict.

    ``manifest`` (a target's rendered manifest) replaces the image's baked one: it holds any
    image, e.g. one built elsewhere, to a matrix target's pins.
    """
    kind = gpu_kind() if gpus == "auto" else gpus
    with tempfile.TemporaryDirectory(prefix="verl-env-verify-") as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        os.chmod(out, 0o777)  # the image may run as another user
        host = Path(tmp) / "host"
        shutil.copytree(selftest_source(), host / "verl_env_selftest",
                        ignore=shutil.ignore_patterns("__pycache__"))
        command = ["/bin/sh", "-c", _LAUNCH, "selftest", "--json", "/verl-env-out/report.json",
                   *(extra_args or [])]
        if manifest is not None:
            (host / "manifest.json").write_text(json.dumps(manifest, indent=2))
            command += ["--manifest", "/verl-env-host/manifest.json"]
        result = engine.run(image, command, timeout=timeout, network=network, gpus=kind,
                            mounts={str(out): {"bind": "/verl-env-out", "mode": "rw"},
                                    str(host): {"bind": "/verl-env-host", "mode": "ro"}})
        report_path = out / "report.json"
        report: dict[str, Any] = {}
        if report_path.exists():
            try:
                report = json.loads(report_path.read_text())
            except json.JSONDecodeError:
                report = {}
    if result.exit_code is None:
        code = 3
        report.setdefault("overall", "error")
        report.setdefault("error", f"self-test killed after {timeout:.0f} s")
    else:
        code = result.exit_code if result.exit_code in VERDICTS else 3
    if not report:
        report = {"overall": "error", "error": "the self-test wrote no report",
                  "log_tail": result.logs[-2000:]}
        code = 3 if code == 0 else code
    return Verification(image, code, report, result.logs, result.seconds)


def summary_lines(v: Verification) -> list[str]:
    """One line per check that failed, warned, or was skipped (with the reason)."""
    lines = []
    for c in v.report.get("checks", []):
        if c.get("status") in ("fail", "warn", "skip"):
            req = " (required)" if c.get("required") else ""
            lines.append(f"  {c.get('status'):4} {c.get('id')}{req}: {c.get('reason') or ''}"
                         .rstrip())
    if v.report.get("error"):
        lines.append(f"  error: {v.report['error']}")
    return lines


# --------------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("image", help="image reference or ID")
    p.add_argument("--json", type=Path, default=None, metavar="PATH",
                   help="write the self-test report here")
    p.add_argument("--timeout", type=float, default=900, help="seconds before the run is killed")
    p.add_argument("--gpus", choices=["auto", "nvidia", "amd", "none"], default="auto")
    p.add_argument("--target", default=None,
                   help="hold the image to this matrix target's pins instead of its baked manifest")
    p.add_argument("--matrix", type=Path, default=Path("matrix.yaml"))
    p.add_argument("--selftest-args", default="", metavar="ARGS",
                   help="extra self-test arguments, one string (e.g. '--strict --phases imports')")


def run(args: argparse.Namespace) -> int:
    engine = Engine.connect()
    extra = shlex.split(args.selftest_args)
    gpus = None if args.gpus == "none" else args.gpus
    image = engine.image(args.image)
    manifest = None
    if args.target:
        from builder.render import manifest as render_manifest
        from builder.spec import load_matrix

        target = load_matrix(args.matrix).target(args.target)
        manifest = render_manifest(target, target.entry_hash, "unknown (verify --target)")
    v = verify_image(engine, image.id, timeout=args.timeout, gpus=gpus, extra_args=extra,
                     manifest=manifest)
    if args.json:
        args.json.write_text(json.dumps(v.report, indent=2) + "\n")
    verdicts.record(image.id, {"overall": v.overall, "exit_code": v.exit_code,
                               "tags": list(image.tags), "report": v.report})
    print(f"{args.image}: {v.overall} ({v.seconds:.1f} s)")
    for line in summary_lines(v):
        print(line)
    if v.exit_code == 3 and v.logs:
        print(v.logs[-1500:], file=sys.stderr)
        if "manifest not found" in v.logs:
            print("hint: this image has no verl-env manifest; hold it to a target's pins with "
                  "--target T", file=sys.stderr)
    return v.exit_code
