"""The gate: run the self-test inside an image and read its JSON report.

The image's own baked self-test runs when present (``/opt/verl-env/verl_env_selftest``); for any
other image the host's copy is copied in and run instead, so ``build-env verify`` works on images
this tool did not build. Exit code of the self-test: 0 pass, 1 fail, 2 incomplete, 3 error.

The gate fails closed:

- **Expected GPUs.** ``expect_gpus`` (``--expect-gpus N``), or by default the number of GPUs of
  the target's family that the ENGINE's host shows (the daemon's machine, which may be remote),
  counted through the engine from the device nodes (``/dev/nvidia<N>``; ``/dev/kfd`` plus
  ``/dev/dri/renderD*``); 0 with the reason when the image's architecture is not the daemon's
  (an emulated build) or the target is a cpu one. The self-test gets ``--expect-gpus N``: fewer
  GPUs visible inside is a fail, never a skip.
- **Release scope.** The verdict records the phases and self-test arguments it ran (the ``gate``
  section added to the report). Only the full required phase set of the family, with no argument
  that changes what the checks demand, is a ``release`` verdict; anything narrower is
  ``partial`` and unlocks no tag, SIF or publish (:mod:`builder.verdicts`).
- **Entrypoint.** The image's ENTRYPOINT and CMD are replaced (vendor images start shells or
  launchers).
- **No bind mounts.** The self-test, the manifest and the report travel through the engine, so
  a remote engine (``DOCKER_HOST=ssh://...``) verifies like a local one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from builder.engine import Engine, ImageInfo, faults
from builder.errors import EngineError, VerifyError
from builder.families import ALL_PHASES, FAMILIES, VENDORS
from builder.files import atomic_write_text, sha256_file
from builder.verdicts import PARTIAL, RELEASE, Verdict, record

VERDICTS = {0: "pass", 1: "fail", 2: "incomplete", 3: "error"}
GATE_SCHEMA = "verl-env/gate/v1"
# The daemon host's device directory the GPU probe mounts (tests point it at a fake tree).
HOST_DEV_ENV = "VERL_ENV_HOST_DEV"
OUT_DIR, HOST_DIR = "/verl-env-out", "/verl-env-host"
REPORT = f"{OUT_DIR}/report.json"
# Runs under /bin/sh in the image: prefer the baked self-test, else the copied-in host copy.
# A vendor base names its interpreter in /opt/verl-env/interpreter (builder.vendor).
_LAUNCH = ('PY=$(cat /opt/verl-env/interpreter 2>/dev/null); [ -x "$PY" ] || '
           'PY=$(command -v python || command -v python3) || { echo "no python in image" >&2; '
           'exit 3; }; [ -d /opt/verl-env/verl_env_selftest ] || '
           f'export PYTHONPATH={HOST_DIR}${{PYTHONPATH:+:$PYTHONPATH}}; '
           'exec "$PY" -m verl_env_selftest "$@"')
ENTRYPOINT = ["/bin/sh", "-c", _LAUNCH, "verl-env-selftest"]

# Family data of the gate (builder.families): the phases a release verdict needs (every phase
# that can apply: a cpu target has no GPU or NCCL collective to test), the GPU vendor of each
# family and the device nodes that count its GPUs on the engine's host.
RELEASE_PHASES: dict[str, tuple[str, ...]] = {n: f.release_phases for n, f in FAMILIES.items()}
GPU_VENDOR = {n: f.vendor.name for n, f in FAMILIES.items() if f.vendor}
DEVICE_GLOBS = {n: v.device_globs for n, v in VENDORS.items()}
# Self-test arguments that never relax the verdict (anything else makes a run partial).
RELEASE_SAFE = {"strict", "timeout", "jobs", "keep_logs", "phases", "emulated"}
# Arguments verify sets itself.
OWNED = {"json": "the report is collected by verify (use verify's --json)",
         "manifest": "use verify's --target to hold the image to a target's pins",
         "expect_gpus": "use verify's --expect-gpus",
         "emulated": "verify decides it from the image's and the engine host's architectures "
                     "(verify --emulated forces it)"}
# Under QEMU user emulation everything runs about ten times slower (`import torch` alone takes
# about 33 s): the self-test's phase timeouts, Ray's startup waits and verify's own kill-switch
# are multiplied by this.
EMULATION_FACTOR = 10.0
EMULATED_ENV = "VERL_ENV_EMULATED"  # the self-test's --emulated FACTOR, as verify passes it
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


@dataclass(frozen=True)
class GpuPlan:
    """What the gate expects of GPUs, and why."""

    expected: int | None  # None: the family is unknown, the self-test decides (auto)
    source: str  # --expect-gpus | engine host | emulated | cpu target | unknown family
    reason: str
    vendor: str | None = None  # nvidia | amd: whose devices are handed to the container
    host_count: int | None = None
    host_devices: tuple[str, ...] = ()
    dev_root: str | None = None
    narrowed: str | None = None  # why an explicit count makes the run partial


@dataclass(frozen=True)
class SelftestPlan:
    """The self-test arguments, the phases they select and the release scope they allow."""

    args: tuple[str, ...]
    phases: tuple[str, ...]
    required: tuple[str, ...]
    partial_reason: str | None


def selftest_source() -> Path:
    return Path(str(resources.files("builder") / "selftest"))


# --------------------------------------------------------------------------- pure decisions


def normalize_arch(arch: str | None) -> str | None:
    """``x86_64``/``amd64`` -> ``amd64``, ``aarch64``/``arm64`` -> ``arm64``; others as given."""
    if not arch:
        return None
    return _ARCH.get(arch.lower(), arch.lower())


def count_gpus(vendor: str, devices: Sequence[str]) -> int:
    """GPUs from device node names relative to /dev: ``nvidia<N>`` nodes; for AMD the render
    nodes, and none without ``kfd`` (the compute driver)."""
    if vendor == "nvidia":
        return sum(1 for d in devices if re.fullmatch(r"nvidia\d+", d))
    if vendor == "amd":
        if "kfd" not in devices:
            return 0
        return sum(1 for d in devices if re.fullmatch(r"dri/renderD\d+", d))
    raise ValueError(f"unknown GPU vendor {vendor!r}")


def decide_gpus(family: str | None, explicit: int | None, image_arch: str | None,
                daemon_arch: str | None, host_devices: Sequence[str] | None,
                dev_root: str | None = None) -> GpuPlan:
    """The GPU expectation. ``host_devices`` is None when the host was not probed."""
    vendor = GPU_VENDOR.get(family or "")
    host_count = count_gpus(vendor, host_devices) if vendor and host_devices is not None else None
    devices = tuple(host_devices or ())
    common = {"vendor": vendor, "host_count": host_count, "host_devices": devices,
              "dev_root": dev_root if host_devices is not None else None}
    if explicit is not None:
        narrowed = None
        if host_count is not None and explicit < host_count:
            narrowed = (f"--expect-gpus {explicit} while the engine's host shows {host_count} "
                        f"{vendor} GPU(s)")
        return GpuPlan(explicit, "--expect-gpus", f"--expect-gpus {explicit}", narrowed=narrowed,
                       **common)
    if family is None:
        return GpuPlan(None, "unknown family",
                       "the image names no target family (no org.verl-env.accelerator label, no "
                       "--target): the self-test decides from what it sees", **common)
    if vendor is None:
        return GpuPlan(0, "cpu target", f"target family {family} has no GPUs", **common)
    img, host = normalize_arch(image_arch), normalize_arch(daemon_arch)
    if img and host and img != host:
        return GpuPlan(0, "emulated", f"emulated build: the image is {img}, the engine's host "
                       f"{host}, so the image cannot use the host's GPUs", **common)
    if host_count is None:
        raise ValueError("a GPU family on a native engine needs the host's device list")
    return GpuPlan(host_count, "engine host", f"the engine's host shows {host_count} {vendor} "
                   f"GPU(s) under {dev_root or '/dev'}", **common)


def _parser() -> argparse.ArgumentParser:
    from builder.selftest.cli import build_parser

    return build_parser()


def plan_selftest(family: str | None, extra_args: Sequence[str] = (),
                  phases: str | None = None) -> SelftestPlan:
    """Validate the self-test arguments here (before any container runs) and decide the scope.

    Raises VerifyError for an argument the self-test would refuse or that verify owns.
    """
    from builder.selftest.cli import UsageError, parse_phases

    parser = _parser()
    if {"-h", "--help", "--version"} & set(extra_args):
        raise VerifyError("--selftest-args: --help and --version do not verify anything")
    try:
        ns = parser.parse_args(list(extra_args))
    except UsageError as exc:
        raise VerifyError(f"--selftest-args: {exc}") from None
    except SystemExit:
        raise VerifyError("--selftest-args: --help and --version do not verify anything") from None
    defaults = parser.parse_args([])
    changed = {dest for dest in vars(ns) if getattr(ns, dest) != getattr(defaults, dest)}
    flag = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}
    for dest in sorted(changed & OWNED.keys()):
        raise VerifyError(f"--selftest-args: {flag[dest]} is set by verify; {OWNED[dest]}")
    text = ns.phases
    if phases is not None:
        if "phases" in changed:
            raise VerifyError("--phases given twice (in --selftest-args and to verify)")
        text = phases
    try:
        chosen = tuple(parse_phases(text, distributed=False))
    except UsageError as exc:
        raise VerifyError(f"--phases: {exc}") from None
    args = tuple(extra_args) + (("--phases", text) if phases is not None else ())
    required = RELEASE_PHASES.get(family or "", ())
    reasons = []
    if not required:
        reasons.append("the target family is unknown, so no phase set makes a release")
    missing = [p for p in required if p not in chosen]
    if missing:
        reasons.append(f"phases {','.join(missing)} not run (ran {','.join(chosen)})")
    relaxing = sorted(flag[d] for d in changed - RELEASE_SAFE - OWNED.keys())
    if relaxing:
        reasons.append(f"self-test argument(s) {' '.join(relaxing)} change what the checks "
                       "run or demand")
    return SelftestPlan(args, chosen, required, "; ".join(reasons) or None)


def family_of(manifest: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> str | None:
    """The target family: the given manifest's accelerator, else the image's label."""
    acc = (manifest or {}).get("accelerator") or (labels or {}).get("org.verl-env.accelerator")
    return acc if acc in RELEASE_PHASES else None


# --------------------------------------------------------------------------- running it


def host_dev_root() -> str:
    return os.environ.get(HOST_DEV_ENV) or "/dev"


def expected_gpus(engine: Engine, image_id: str, family: str | None, *,
                  expect_gpus: int | None = None, image_arch: str | None = None,
                  dev_root: str | None = None) -> GpuPlan:
    """Decide the GPU expectation, probing the engine's host when the family has GPUs (also with
    an explicit count: a count below what the host shows makes the run partial)."""
    dev_root = dev_root or host_dev_root()
    vendor = GPU_VENDOR.get(family or "")
    daemon_arch = engine.daemon_arch()
    emulated = (normalize_arch(image_arch) or normalize_arch(daemon_arch)) != \
        normalize_arch(daemon_arch)
    devices = None
    if vendor and not emulated:
        devices = engine.host_devices(image_id, DEVICE_GLOBS[vendor], dev_root=dev_root)
    return decide_gpus(family, expect_gpus, image_arch, daemon_arch, devices, dev_root)


def arch_plan(engine: Engine, img: ImageInfo, manifest: Mapping[str, Any] | None,
              emulated: bool | None = None) -> dict[str, Any]:
    """The image's architecture against the target's (the given manifest's, else the image's
    label) and the engine host's: ``refused`` (why the gate refuses it, or None) and
    ``emulated`` (the self-test runs under QEMU user emulation)."""
    found = normalize_arch(img.architecture)
    wanted = normalize_arch((manifest or {}).get("arch")
                            or img.labels.get("org.verl-env.arch"))
    host = normalize_arch(engine.daemon_arch())
    refused = None
    if found and wanted and found != wanted:
        ref = next(iter(img.tags or ()), None) or img.id
        refused = (f"image {ref} ({img.id[:19]}) is built for {found}, the target wants "
                   f"{wanted}: a wrong-architecture image is refused")
    if emulated is None:
        emulated = bool(found and host and found != host)
    return {"image": found, "target": wanted, "engine_host": host, "emulated": bool(emulated),
            "emulation_factor": EMULATION_FACTOR if emulated else 1.0, "refused": refused}


def verify_image(engine: Engine, image: str, *, expect_gpus: int | None = None,
                 timeout: float = 900, gpus: str | None = "auto",
                 extra_args: Sequence[str] | None = None, phases: str | None = None,
                 network: str = "none", manifest: dict[str, Any] | None = None,
                 dev_root: str | None = None, emulated: bool | None = None) -> Verdict:
    """Run the self-test in a fresh container of ``image``; never raises for a failed verdict.

    ``expect_gpus``: GPUs the self-test must see (None: what the engine's host shows for the
    family; see the module doc). ``gpus``: which devices the container gets (``auto``: the
    family's vendor when GPUs are expected; ``nvidia``, ``amd``; None: none). ``extra_args`` and
    ``phases`` narrow the run (a partial verdict). ``manifest`` (a target's rendered manifest)
    replaces the image's baked one: it holds any image, e.g. one built elsewhere, to a matrix
    target's pins. An image whose architecture is not the target's is refused without running it
    (a fail verdict); ``emulated`` (None: when the image's architecture is not the engine host's)
    runs the self-test under QEMU with its timeouts scaled by EMULATION_FACTOR. Raises
    VerifyError for bad self-test arguments, EngineError for an image the engine does not have;
    every other problem is an error or fail verdict.
    """
    img = engine.image(image)
    family = family_of(manifest, img.labels)
    plan = plan_selftest(family, extra_args or (), phases)
    gate: dict[str, Any] = {"schema": GATE_SCHEMA, "family": family, "phases": list(plan.phases),
                            "required_phases": list(plan.required),
                            "selftest_args": list(plan.args), "entrypoint": ENTRYPOINT[:2],
                            "bind_mounts": []}
    arch = arch_plan(engine, img, manifest, emulated)
    gate["arch"] = arch
    if arch["refused"]:
        gate.update(scope=RELEASE, partial_reason=None)
        check = {"id": "gate.arch", "phase": "gate", "status": "fail", "required": True,
                 "applies": True, "value": arch["image"], "reason": arch["refused"]}
        return Verdict(image, 1, {"overall": "fail", "error": arch["refused"],
                                       "checks": [check], "gate": gate}, "", 0.0)
    if arch["emulated"]:
        if arch["image"] != arch["engine_host"]:
            engine.require_emulation(arch["image"])
        timeout *= EMULATION_FACTOR
    try:
        gpu = expected_gpus(engine, img.id, family, expect_gpus=expect_gpus,
                            image_arch=img.architecture, dev_root=dev_root)
    except EngineError as exc:
        _raise_engine_fault(engine, exc, "counting the engine host's GPUs")
        gate.update(scope=PARTIAL, partial_reason="the GPU expectation is unknown",
                    gpus={"expected": None, "reason": f"could not count the engine host's GPUs: "
                          f"{exc.args[0]}"})
        report = {"overall": "error", "error": f"could not count the engine host's GPUs: "
                  f"{exc.args[0]}", "gate": gate}
        return Verdict(image, 3, report, "", 0.0)
    reasons = [r for r in (plan.partial_reason, gpu.narrowed) if r]
    gate.update(scope=PARTIAL if reasons else RELEASE,
                partial_reason="; ".join(reasons) or None)
    kind = gpu.vendor if gpus == "auto" and (gpu.expected or 0) > 0 else \
        (None if gpus == "auto" else gpus)
    command = ["--json", REPORT, *plan.args]
    # An environment variable, not --emulated: a self-test baked by an older builder ignores it
    # (and runs with its own timeouts) instead of refusing an unknown argument.
    environment = {EMULATED_ENV: f"{EMULATION_FACTOR:g}"} if arch["emulated"] else {}
    if gpu.expected is not None:
        command += ["--expect-gpus", str(gpu.expected)]
    files = {f"{HOST_DIR}/verl_env_selftest/{rel}": data for rel, data in _selftest_files()}
    if manifest is not None:
        files[f"{HOST_DIR}/manifest.json"] = json.dumps(manifest, indent=2).encode()
        command += ["--manifest", f"{HOST_DIR}/manifest.json"]
    gate["selftest_argv"] = command
    gpu_record = {k: v for k, v in asdict(gpu).items() if k != "host_devices"}
    gpu_record.update(host_devices=list(gpu.host_devices), handed=kind)
    gate["gpus"] = gpu_record
    try:
        result = engine.run(img.id, command, entrypoint=ENTRYPOINT, timeout=timeout,
                            network=network, gpus=kind, files=files, dirs=[OUT_DIR],
                            collect=[REPORT], environment=environment)
    except EngineError as exc:
        _raise_engine_fault(engine, exc, f"the self-test of {img.id[:19]}")
        if kind is None:
            raise
        # the engine could not hand the expected GPUs over: they are not visible, a fail
        report = {"overall": "fail", "error": f"the engine could not give the container the "
                  f"{kind} GPUs: {exc.args[0]}", "gate": gate}
        gate["gpus"]["in_image"] = {"count": None, "reason": "the container did not start"}
        return Verdict(image, 1, report, "", 0.0)
    report: dict[str, Any] = {}
    raw = result.files.get(REPORT)
    if raw:
        try:
            report = json.loads(raw)
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
    gate["gpus"]["in_image"] = _in_image_gpus(report, plan.phases)
    report["gate"] = gate
    return Verdict(image, code, report, result.logs, result.seconds)


def _raise_engine_fault(engine: Engine, exc: EngineError, what: str) -> None:
    """An engine that died or filled up is the run's error, never a verdict about the image."""
    fault = faults.translate(engine, exc, stage="verify", what=what)
    if fault is None and not engine.alive():
        fault = faults.engine_down(engine, stage="verify", what=what)
    if fault is not None:
        raise fault from None


# --------------------------------------------------------------------------- from a SIF

SLURM_GPU_VARS = ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE")


def node_gpus(vendor: str, environ: Mapping[str, str], devices: Sequence[str] | None,
              dev_root: str = "/dev") -> tuple[int, str, str]:
    """(count, source, reason): the GPUs this node gives the job: Slurm's count for the node
    (``SLURM_GPUS_ON_NODE``, else ``SLURM_GPUS_PER_NODE``, ``type:N`` read as N), else the
    devices the node shows (the image gate's count)."""
    for var in SLURM_GPU_VARS:
        raw = (environ.get(var) or "").strip()
        if raw:
            text = raw.rsplit(":", 1)[-1].split("(", 1)[0]
            if text.isdigit():
                return int(text), "slurm", f"{var}={raw}: Slurm gave this node {int(text)} GPU(s)"
    n = count_gpus(vendor, devices or ())
    return n, "node devices", f"the node shows {n} {vendor} GPU(s) under {dev_root}"


def _list_devices(vendor: str, dev_root: str) -> list[str]:
    root = Path(dev_root)
    found = []
    for pattern in DEVICE_GLOBS[vendor]:
        found += [str(p.relative_to(root)) for p in root.glob(pattern)]
    return sorted(found)


@dataclass(frozen=True)
class SifGatePlan:
    """How a SIF is gated on this node: the runtime, its flags and the GPU expectation."""

    family: str | None
    runtime: tuple[str, str] | None  # (name, path)
    flags: tuple[str, ...]
    env: dict[str, str]  # what crosses --cleanenv: the family's GPU visibility variables
    gpus: dict[str, Any]
    refused: str | None  # why it cannot run here (a fail verdict, never a skip)


def plan_sif_gate(family: str | None, *, runtime: tuple[str, str] | None,
                  expect_gpus: int | None, environ: Mapping[str, str],
                  devices: Sequence[str] | None, dev_root: str = "/dev") -> SifGatePlan:
    """Pure: the runtime flags (:mod:`builder.families`), the GPU expectation from the node and
    whether this runtime can honour it (fails closed: GPUs expected and a runtime that cannot
    hand them in is a refusal)."""
    fam = FAMILIES.get(family or "")
    vendor = fam.vendor.name if fam and fam.vendor else None
    gpus: dict[str, Any] = {"vendor": vendor, "dev_root": dev_root}
    if vendor is None:
        expected: int | None = 0 if fam else None
        gpus.update(expected=expected, source="cpu target" if fam else "unknown family",
                    reason=f"target family {family} has no GPUs" if fam else
                    "the SIF names no target family (no org.verl-env.accelerator label): the "
                    "self-test decides from what it sees")
    else:
        count, source, reason = node_gpus(vendor, environ, devices, dev_root)
        gpus.update(node_count=count, node_source=source)
        if expect_gpus is not None:
            gpus.update(expected=expect_gpus, source="--expect-gpus",
                        reason=f"--expect-gpus {expect_gpus}")
            if expect_gpus < count:
                gpus["narrowed"] = f"--expect-gpus {expect_gpus} while {reason}"
        else:
            gpus.update(expected=count, source=source, reason=reason)
    flags = fam.apptainer_flags if fam else ()
    env = {k: environ[k] for k in (fam.visible_devices if fam else ()) if environ.get(k)}
    refused = None
    if runtime is None:
        refused = ("no container runtime to run the SIF (apptainer or singularity; ch-run for "
                   "cpu images)")
    elif runtime[0] == "ch-run" and flags and (gpus.get("expected") or 0) > 0:
        refused = (f"{gpus['expected']} GPU(s) expected, but ch-run cannot hand them in: "
                   f"{fam.chrun_refusal if fam else ''}")
    if runtime is not None and runtime[0] == "ch-run":
        flags = ()  # ch-run takes no --nv/--rocm; with no GPU expected the GPU phases pend
    return SifGatePlan(family if fam else None, runtime, flags, env, gpus, refused)


def verify_sif_image(path: Path, *, expect_gpus: int | None = None, timeout: float = 900,
                     extra_args: Sequence[str] | None = None, phases: str | None = None,
                     runtime: str | None = None, environ: Mapping[str, str] | None = None,
                     dev_root: str | None = None) -> Verdict:
    """The gate on a SIF, on the node that runs it: every phase of the family (a narrower run
    is partial, as for an image), with the family's runtime flags (``--nv``/``--rocm``), the
    GPU expectation from the node (Slurm's count, else its devices; ``--expect-gpus``), failing
    closed like the image gate. Raises VerifyError for bad arguments or a file that is not a
    SIF; every other problem is a fail or error verdict."""
    from builder.sif import format as sif_format
    from builder.sif import verify as sif_verify

    environ = os.environ if environ is None else environ
    dev_root = dev_root or host_dev_root()
    try:
        labels = sif_verify.sif_labels(path)
    except (OSError, sif_format.SifFormatError) as exc:
        raise VerifyError(f"{path}: not a readable SIF ({exc})") from None
    family = labels.get("org.verl-env.accelerator")
    family = family if family in RELEASE_PHASES else None
    plan = plan_selftest(family, extra_args or (), phases)
    chosen = sif_verify.pick_runtime(runtime)
    if runtime and chosen is None:
        raise VerifyError(f"--runtime {runtime}: not installed on this node")
    fam = FAMILIES.get(family or "")
    devices = _list_devices(fam.vendor.name, dev_root) if fam and fam.vendor else None
    sg = plan_sif_gate(family, runtime=chosen, expect_gpus=expect_gpus, environ=environ,
                       devices=devices, dev_root=dev_root)
    digest = sha256_file(path)
    reasons = [r for r in (plan.partial_reason, sg.gpus.get("narrowed")) if r]
    gate: dict[str, Any] = {
        "schema": GATE_SCHEMA, "subject": {"sif": str(path), "digest": digest,
                                           "target": labels.get("org.verl-env.target")},
        "family": family, "phases": list(plan.phases), "required_phases": list(plan.required),
        "selftest_args": list(plan.args), "runtime": sg.runtime[0] if sg.runtime else None,
        "runtime_flags": list(sg.flags), "passed_env": sorted(sg.env), "gpus": sg.gpus,
        "scope": PARTIAL if reasons else RELEASE, "partial_reason": "; ".join(reasons) or None}
    if sg.refused:
        check = {"id": "gate.runtime", "phase": "gate", "status": "fail", "required": True,
                 "value": gate["runtime"], "reason": sg.refused}
        return Verdict(str(path), 1, {"overall": "fail", "error": sg.refused, "checks": [check],
                                      "gate": gate})
    args = list(plan.args)
    if sg.gpus.get("expected") is not None:
        args += ["--expect-gpus", str(sg.gpus["expected"])]
    run = sif_verify.run_in_sif(path, args, timeout=timeout, runtime=sg.runtime, flags=sg.flags,
                                env=sg.env)
    gate["command"] = run.command
    report = dict(run.report)
    if run.exit_code is None:
        code = 3
        report.setdefault("overall", "error")
        report.setdefault("error", f"self-test killed after {timeout:.0f} s")
    else:
        code = run.exit_code if run.exit_code in VERDICTS else 3
    if not run.report:
        report = {"overall": "error", "error": "the self-test wrote no report",
                  "log_tail": run.logs[-2000:]}
        code = 3 if code == 0 else code
    gate["gpus"]["in_image"] = _in_image_gpus(report, plan.phases)
    report["gate"] = gate
    return Verdict(str(path), code, report, run.logs, run.seconds)


def _in_image_gpus(report: Mapping[str, Any], phases: Sequence[str]) -> dict[str, Any]:
    count = (report.get("platform") or {}).get("gpu_count")
    if count is not None:
        return {"count": count, "reason": "GPUs torch sees inside the container"}
    if "gpu" not in phases:
        return {"count": None, "reason": "not measured: the gpu phase did not run"}
    return {"count": None, "reason": "not measured: GPU checks were not expected"}


def _selftest_files() -> list[tuple[str, bytes]]:
    root = selftest_source()
    return [(str(p.relative_to(root)), p.read_bytes()) for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]


def summary_lines(v: Verdict) -> list[str]:
    """One line per check that failed, warned, or was skipped (with the reason); then the
    GPU expectation and, for a partial run, why it is not a release verdict."""
    lines = []
    for c in v.report.get("checks", []):
        if c.get("status") in ("fail", "warn", "skip"):
            req = " (required)" if c.get("required") else ""
            lines.append(f"  {c.get('status'):4} {c.get('id')}{req}: {c.get('reason') or ''}"
                         .rstrip())
    if v.report.get("error"):
        lines.append(f"  error: {v.report['error']}")
    arch = v.gate.get("arch") or {}
    if arch.get("emulated") and not arch.get("refused"):
        lines.append(f"  emulated: the {arch.get('image')} image ran under QEMU on the "
                     f"{arch.get('engine_host')} engine host (timeouts x"
                     f"{arch.get('emulation_factor'):g})")
    gpus = v.gate.get("gpus") or {}
    if gpus:
        seen = gpus.get("in_image") or {}
        lines.append(f"  GPUs expected: {gpus.get('expected')} ({gpus.get('reason')}); in the "
                     f"image: {seen.get('count')} ({seen.get('reason')})")
    if v.gate and v.scope != RELEASE:
        lines.append(f"  partial verdict, unlocks no tag, SIF or publish: {v.partial_reason}")
    elif v.level is not None and v.gpu.status != "none":
        lines.append(f"  {v.level} verdict; gpu: {v.gpu.describe()}")
    return lines


# --------------------------------------------------------------------------- CLI


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a GPU count: {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return n


def _is_sif(text: str) -> bool:
    from builder.sif import format as sif_format

    path = Path(text)
    return path.is_file() and (path.suffix == ".sif" or sif_format.is_sif(path))


def run_sif(args: argparse.Namespace) -> int:
    """``build-env verify FILE.sif``: the gate on this node (see :func:`verify_sif_image`)."""
    path = Path(args.image).absolute()
    for option, given in (("--target", args.target), ("--gpus", args.gpus != "auto"),
                          ("--emulated", args.emulated)):
        if given:
            raise VerifyError(f"{option} applies to an image in the engine, not to a SIF "
                              f"({path})")
    try:
        v = verify_sif_image(path, expect_gpus=args.expect_gpus, timeout=args.timeout,
                             extra_args=shlex.split(args.selftest_args), phases=args.phases,
                             runtime=args.runtime)
    except VerifyError as exc:
        raise VerifyError(exc.args[0], target=str(path)) from None
    if args.report:
        atomic_write_text(args.report, json.dumps(v.report, indent=2) + "\n")
    subject = v.gate.get("subject") or {}
    record(subject["digest"], v, target=subject.get("target"))
    out = sys.stderr if args.json else sys.stdout
    if args.json:
        print(json.dumps(v.report, indent=2, sort_keys=True))
    how = " ".join([str(v.gate.get("runtime"))] + list(v.gate.get("runtime_flags") or []))
    print(f"{path}: {v.describe()} ({how}, {v.seconds:.1f} s)", file=out)
    for line in summary_lines(v):
        print(line, file=out)
    if v.exit_code == 3 and v.logs:
        print(v.logs[-1500:], file=sys.stderr)
    return v.exit_code


def run(args: argparse.Namespace) -> int:
    if _is_sif(args.image):
        return run_sif(args)
    if args.runtime:
        raise VerifyError(f"--runtime applies to a SIF file; {args.image} is not one")
    engine = Engine.connect()
    with faults.stage(engine, "verify", what=f"the gate of {args.image}"):
        return _run_on_engine(engine, args)


def _run_on_engine(engine: Engine, args: argparse.Namespace) -> int:
    extra = shlex.split(args.selftest_args)
    gpus = None if args.gpus == "none" else args.gpus
    image = engine.image(args.image)
    manifest = None
    if args.target:
        from builder.render import manifest as render_manifest
        from builder.spec import load_matrix

        target = load_matrix(args.matrix).target(args.target)
        manifest = render_manifest(target, target.entry_hash, "unknown (verify --target)")
    try:
        v = verify_image(engine, image.id, expect_gpus=args.expect_gpus, timeout=args.timeout,
                         gpus=gpus, extra_args=extra, phases=args.phases, manifest=manifest,
                         emulated=args.emulated)
    except VerifyError as exc:
        raise VerifyError(exc.args[0], target=args.image) from None
    if args.report:
        atomic_write_text(args.report, json.dumps(v.report, indent=2) + "\n")
    # the verdict is about the target the image was built for, unless held to another one
    target = args.target or (image.labels or {}).get("org.verl-env.target")
    record(image.id, v, target=target, tags=list(image.tags))
    out = sys.stderr if args.json else sys.stdout
    if args.json:
        print(json.dumps(v.report, indent=2, sort_keys=True))
    print(f"{args.image}: {v.describe()} ({v.seconds:.1f} s)", file=out)
    for line in summary_lines(v):
        print(line, file=out)
    if v.exit_code == 3 and v.logs:
        print(v.logs[-1500:], file=sys.stderr)
        if "manifest not found" in v.logs:
            print("hint: this image has no verl-env manifest; hold it to a target's pins with "
                  "--target T", file=sys.stderr)
    return v.exit_code


__all__ = ["ALL_PHASES", "GpuPlan", "RELEASE_PHASES", "SelftestPlan", "Verdict",
           "count_gpus", "decide_gpus", "expected_gpus", "family_of",
           "plan_selftest", "plan_sif_gate", "node_gpus", "run", "selftest_source",
           "summary_lines", "verify_image", "verify_sif_image",
           "HOST_DEV_ENV"]
