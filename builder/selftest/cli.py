"""Command line: ``python -m verl_env_selftest [options]``.

Runs the selected phases, each in its own subprocess with its own timeout, then (under
torchrun/srun) the collective across all ranks with one agreed verdict. Prints a compact
table, writes the JSON report, exits 0 pass, 1 fail, 2 incomplete, 3 self-test error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from . import DEFAULT_MANIFEST, SCHEMA, __version__
from .phases.bandwidth import FAIL_FRAC, WARN_FRAC, BwRefError, load_reference
from .launch.distributed import run_distributed
from .phases.gpu import decide_device_count
from .phases import rayphase
from .launch.launcher import LauncherError, RankInfo, detect
from .manifest import (ManifestError, load_manifest, needs_detection, parse_expect,
                       parse_size, resolve_expectation)
from .report import (EXIT_ERROR, Check, ReportMeta, apply_strict, build_report, exit_code,
                     render_coverage, render_table, verdict, worst)
from .runner import PhaseResult, kill_active, run_phase, run_worker

EMULATED_ENV = "VERL_ENV_EMULATED"
PHASES = ("preflight", "env", "imports", "versions", "coverage", "abi", "cpu", "gpu",
          "collective", "ray")
DISTRIBUTED_DEFAULT = ("preflight", "env", "collective")
RANK0_FIRST = 15.0  # s the other ranks wait beyond rank 0 for a hung collective
TIMEOUTS = {"detect": 90.0, "preflight": 30.0, "env": 30.0, "imports": 240.0,
            "versions": 60.0, "coverage": 120.0, "abi": 120.0, "cpu": 120.0, "gpu": 180.0,
            "collective": 300.0, "ray": 180.0}


class UsageError(Exception):
    """Bad command line or inputs: exit 3."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


@dataclass(frozen=True)
class ParsedArgs:
    """The self-test's reading of an argument list, as plain data (for a caller that validates
    arguments before they reach an image: ``build-env verify --selftest-args``)."""

    values: dict[str, Any]  # destination -> value
    changed: frozenset[str]  # the destinations the arguments set away from their defaults
    flags: dict[str, str]  # destination -> its first option string


def read_args(args: list[str]) -> ParsedArgs:
    """Parse ``args`` as the self-test would; UsageError (or SystemExit for --help/--version)
    as it would refuse them."""
    parser = build_parser()
    ns, defaults = parser.parse_args(list(args)), parser.parse_args([])
    changed = frozenset(d for d in vars(ns) if getattr(ns, d) != getattr(defaults, d))
    flags = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}
    return ParsedArgs(dict(vars(ns)), changed, flags)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (usage errors raise UsageError instead of exiting 2)."""
    p = _Parser(prog="python -m verl_env_selftest",
                description="verl-env in-image self-test (exit 0 pass, 1 fail, 2 incomplete, "
                            "3 self-test error)")
    p.add_argument("--phases", default="all",
                   help=f"comma list of {','.join(PHASES)} or 'all' (under torchrun/srun the "
                        f"default is {','.join(DISTRIBUTED_DEFAULT)})")
    p.add_argument("--expect-gpus", default="auto", help="auto or N (default auto)")
    p.add_argument("--strict", action="store_true",
                   help="every skip of a check that applies to the target counts as incomplete")
    p.add_argument("--json", metavar="PATH", help="write the JSON report here")
    p.add_argument("--manifest", default=DEFAULT_MANIFEST, metavar="PATH")
    p.add_argument("--bw-size", metavar="BYTES",
                   help="all-reduce message for the bandwidth test, e.g. 1G, 256M "
                        "(default 1G on GPUs, 16M over gloo)")
    p.add_argument("--bw-iters", type=int, default=20)
    p.add_argument("--bw-warmup", type=int, default=5)
    p.add_argument("--bw-ref", metavar="FILE", help="site reference table (JSON), consulted "
                                                    "before the shipped one")
    p.add_argument("--bw-warn-frac", type=float, default=WARN_FRAC)
    p.add_argument("--bw-fail-frac", type=float, default=FAIL_FRAC)
    p.add_argument("--gloo-ranks", type=int, default=2, help="ranks of the CPU gloo test")
    p.add_argument("--coverage-root", action="append", metavar="DIR",
                   help="read device code under DIR instead of the interpreter's site "
                        "directories (repeatable; a narrowed run)")
    p.add_argument("--abi-root", action="append", metavar="DIR",
                   help="check the shared objects under DIR instead of the interpreter's site "
                        "directories (repeatable; a narrowed run)")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="per-phase timeout in seconds (default: per phase, 30-300 s)")
    p.add_argument("--emulated", type=float, metavar="FACTOR",
                   help="the image runs under QEMU user emulation: every timeout (the phases', "
                        "the ranks', Ray's startup waits) is multiplied by FACTOR (default: "
                        f"${EMULATED_ENV}, which verify sets)")
    p.add_argument("--jobs", type=int, default=4,
                   help="phases run in parallel (default 4; the collective always runs alone)")
    p.add_argument("--launcher", default="auto",
                   choices=["auto", "standalone", "torchrun", "slurm"])
    p.add_argument("--keep-logs", metavar="DIR", help="keep phase logs in DIR")
    p.add_argument("--version", action="version", version=f"verl-env selftest {__version__}")
    return p


def parse_phases(text: str, distributed: bool) -> list[str]:
    """Phases in run order; ``all`` means every phase (standalone) or the multi-rank
    default. Under torchrun/srun the collective always runs (it carries the verdict)."""
    if text.strip() == "all":
        chosen = set(DISTRIBUTED_DEFAULT if distributed else PHASES)
    else:
        chosen = {p.strip() for p in text.split(",") if p.strip()}
        bad = chosen - set(PHASES)
        if bad or not chosen:
            raise UsageError(f"unknown phase(s) {sorted(bad)}; choose from {', '.join(PHASES)}")
    if distributed:
        chosen.add("collective")
    return [p for p in PHASES if p in chosen]


# Phases run in one worker, in this order: the cpu phase's tensordict and torch are already
# imported by the imports phase (about 2 s of CPU a gate). Each still has its own time budget,
# checks and crash report (runner.run_worker).
SHARED_WORKERS: tuple[tuple[str, ...], ...] = (("imports", "cpu"),)


def worker_units(phases: list[str]) -> list[list[str]]:
    """The phases grouped by worker, in phase order (a shared worker at its first phase)."""
    units: list[list[str]] = []
    placed: set[str] = set()
    for p in phases:
        if p in placed:
            continue
        group = next((g for g in SHARED_WORKERS if p in g), (p,))
        unit = [q for q in group if q in phases]
        placed.update(unit)
        units.append(unit)
    return units


def run_phases(phases: list[str], ctx_path: str, timeouts: dict[str, float], workdir: str,
               jobs: int) -> list[PhaseResult]:
    """Run phases in subprocesses (:func:`worker_units`), up to ``jobs`` at a time; results
    come back in phase order. The collective runs alone after the others (bandwidth is
    timed)."""
    first = [p for p in phases if p != "collective"]
    results: dict[str, PhaseResult] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_worker, unit, ctx_path, timeouts, workdir)
                   for unit in worker_units(first)]
        for fut in futures:
            results.update(fut.result())
    if "collective" in phases:
        results["collective"] = run_phase("collective", ctx_path, timeouts["collective"],
                                          workdir)
    return [results[p] for p in phases]


def _options(a: argparse.Namespace, timeouts: dict[str, float]) -> dict[str, Any]:
    if a.gloo_ranks < 1 or a.bw_iters < 1 or a.bw_warmup < 0:
        raise UsageError("--gloo-ranks and --bw-iters must be >= 1, --bw-warmup >= 0")
    if not 0 < a.bw_fail_frac <= a.bw_warn_frac:
        raise UsageError("need 0 < --bw-fail-frac <= --bw-warn-frac")
    try:
        bw_size = parse_size(a.bw_size) if a.bw_size else None
    except ValueError as e:
        raise UsageError(f"--bw-size: {e}") from None
    for flag, roots in (("--coverage-root", a.coverage_root), ("--abi-root", a.abi_root)):
        for root in roots or []:
            if not os.path.isdir(root):
                raise UsageError(f"{flag} {root}: not a directory")
    try:
        ref = load_reference(a.bw_ref)
    except BwRefError as e:
        raise UsageError(str(e)) from None
    return {"bw_size": bw_size, "bw_iters": a.bw_iters, "bw_warmup": a.bw_warmup,
            "bw_ref": ref, "bw_warn_frac": a.bw_warn_frac, "bw_fail_frac": a.bw_fail_frac,
            "gloo_ranks": a.gloo_ranks, "strict": a.strict, "timeouts": timeouts,
            "coverage_roots": [os.path.abspath(r) for r in a.coverage_root or []],
            "abi_roots": [os.path.abspath(r) for r in a.abi_root or []]}


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def _meta_from_facts(meta: ReportMeta, facts: dict[str, Any], manifest: dict[str, Any],
                     visible: int | None) -> None:
    meta.platform.update(accelerator=manifest["accelerator"], arch=manifest.get("arch"),
                         gpu_count=visible)
    for key, value in facts.items():
        group, _, name = key.partition(".")
        if group == "platform":
            meta.platform[name] = value
        elif group == "versions" and value is not None:
            meta.versions[name] = value
    if "gpus" in meta.platform:
        meta.platform["gpu_count"] = len(meta.platform["gpus"])
    meta.transport = facts.get("report.transport") or facts.get("cpu.gloo_transport")
    meta.world_size = int(facts.get("report.world_size") or facts.get("cpu.gloo_world")
                          or meta.world_size)


def run(a: argparse.Namespace, started: str, t0: float) -> int:
    """The self-test proper (errors raise UsageError/ManifestError...)."""
    manifest = _load(a)
    try:
        expect_n = parse_expect(a.expect_gpus)
    except ValueError as e:
        raise UsageError(f"--expect-gpus: {e}") from None
    try:
        info = detect(os.environ, a.launcher)
    except LauncherError as e:
        raise UsageError(str(e)) from None
    phases = parse_phases(a.phases, info.distributed)
    if a.emulated is None and os.environ.get(EMULATED_ENV):
        try:
            a.emulated = float(os.environ[EMULATED_ENV])
        except ValueError:
            raise UsageError(f"{EMULATED_ENV}={os.environ[EMULATED_ENV]!r}: not a factor") from None
    if a.emulated is not None and a.emulated < 1:
        raise UsageError("--emulated FACTOR must be >= 1")
    scale = a.emulated or 1.0
    timeouts = {k: (a.timeout if a.timeout else v) * scale for k, v in TIMEOUTS.items()}
    options = _options(a, timeouts)
    options["emulated"] = a.emulated
    workdir = tempfile.mkdtemp(prefix="verl-env-selftest-", dir=a.keep_logs)
    # Ray's sockets need a short path, so its temp dir is not under workdir; made and removed
    # here so that a Ray phase killed on timeout leaves nothing behind.
    options["ray_tmp"] = rayphase.ray_tmp()
    try:
        return _run(a, started, t0, manifest, expect_n, info, phases, options, workdir)
    finally:
        shutil.rmtree(options["ray_tmp"], ignore_errors=True)
        if not a.keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)


def _load(a: argparse.Namespace) -> dict[str, Any]:
    try:
        return load_manifest(a.manifest)
    except ManifestError as e:
        raise UsageError(str(e)) from None


def _run(a: argparse.Namespace, started: str, t0: float, manifest: dict[str, Any],
         expect_n: int | None, info: RankInfo, phases: list[str], options: dict[str, Any],
         workdir: str) -> int:
    timeouts = options["timeouts"]
    ctx: dict[str, Any] = {"manifest": manifest, "options": options, "launcher": info.to_dict(),
                           "workdir": workdir}
    ctx_path = os.path.join(workdir, "ctx.json")
    checks: list[Check] = []
    facts: dict[str, Any] = {}
    visible: int | None = None
    if needs_detection(expect_n, manifest["accelerator"]):
        ctx["expect"] = resolve_expectation(None, manifest["accelerator"], None).to_dict()
        _write_json(ctx_path, ctx)
        det = run_phase("detect", ctx_path, timeouts["detect"], workdir)
        checks += [c for c in det.checks if c.status != "pass"]  # only a failure is news
        visible = det.facts.get("detect.gpu_count")
    expect = resolve_expectation(expect_n, manifest["accelerator"], visible)
    ctx["expect"] = expect.to_dict()
    if expect_n and "gpu" not in phases and not info.distributed:
        # N GPUs are expected but the gpu phase is not selected: still count them (fail closed)
        _write_json(ctx_path, ctx)
        det = run_phase("detect", ctx_path, timeouts["detect"], workdir)
        visible = det.facts.get("detect.gpu_count")
        checks += [c for c in det.checks if c.status != "pass"]
        if visible is not None:
            checks.append(decide_device_count(int(visible), expect))
    local = [p for p in phases if not (info.distributed and p == "collective")]
    if info.distributed and info.local_rank != 0:
        local = []  # node-local phases run once per node, on local rank 0
    node_phases = [p for p in phases if p != "collective"]
    ctx["dist_timeout"] = sum(timeouts[p] for p in node_phases) + timeouts["collective"]
    _write_json(ctx_path, ctx)
    for res in run_phases(local, ctx_path, timeouts, workdir, a.jobs):
        checks += res.checks
        facts.update(res.facts)
    meta = ReportMeta(started=started, duration_s=0.0, host=socket.gethostname(),
                      launcher=info.launcher, world_size=info.world_size,
                      target=manifest.get("target"), manifest=a.manifest)
    if info.distributed:
        margin = min(max(5.0, 0.1 * ctx["dist_timeout"]), 30.0)  # child's own timeout first
        if info.rank != 0:
            # rank 0 writes the report: on a hung collective it gives up first, so that a
            # launcher that stops the other ranks once one exits (torchrun) cannot stop rank 0
            # before its report is written (the ranks can start seconds apart on a loaded host)
            margin += RANK0_FIRST
        out = run_distributed(info, ctx_path, checks, workdir, ctx["dist_timeout"] + margin)
        overall = out["overall"]
        if info.rank != 0:
            print(f"verl-env self-test rank {info.rank}/{info.world_size}: {overall.upper()}")
            return exit_code(overall)
        checks = apply_strict([Check.from_dict(d) for d in out["checks"]], a.strict)
        facts.update(out.get("facts", {}))
        meta.hosts = out.get("hosts", [])
        facts["report.world_size"] = info.world_size
        overall = worst([out["overall"], verdict(checks)])
    else:
        checks = apply_strict(checks, a.strict)
        overall = verdict(checks)
    _meta_from_facts(meta, facts, manifest, visible)
    meta.platform["machine"] = platform.machine()
    if a.emulated:
        meta.platform.update(emulated=True, emulation_factor=a.emulated)
    if info.distributed:
        meta.world_size = info.world_size
    meta.duration_s = time.monotonic() - t0
    print(f"verl-env self-test: target {manifest.get('target')} ({manifest['accelerator']}), "
          f"{info.launcher}, world size {meta.world_size}, GPUs "
          f"{'expected' if expect.expected else 'not expected: ' + str(expect.skip_reason)}")
    print(render_table(checks, overall, meta.duration_s, shutil.get_terminal_size((120, 20))[0]))
    coverage = render_coverage(checks)
    if coverage:
        print(coverage)
    if a.json:
        _write_json(a.json, build_report(meta, checks, overall))
    return exit_code(overall)


def _on_signal(signum: int, _frame: Any) -> None:
    """Terminated (e.g. torchrun stopping the other ranks): take the children with us."""
    kill_active()
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Entry point; never raises (exit 3 on a self-test error, with the reason)."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, _on_signal)
                    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        return _main(argv)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _main(argv: list[str] | None) -> int:
    t0 = time.monotonic()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    json_path = None
    try:
        a = build_parser().parse_args(argv)
        json_path = a.json
        return run(a, started, t0)
    except Exception as e:  # noqa: BLE001 - exit 3 with the reason, never a traceback only
        msg = str(e) if isinstance(e, UsageError) else \
            f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        print(f"verl-env self-test error: {msg}", file=sys.stderr)
        if json_path:
            try:
                _write_json(json_path, {"schema": SCHEMA, "started": started,
                                        "duration_s": round(time.monotonic() - t0, 3),
                                        "host": socket.gethostname(), "checks": [],
                                        "summary": {"pass": 0, "warn": 0, "fail": 0, "skip": 0},
                                        "overall": "error", "error": str(e)})
            except OSError:
                pass
        return EXIT_ERROR
