"""What a gate run needs, decided before anything runs: the phases and self-test arguments and
the release scope they allow, the target family, the architecture, and the GPUs expected.

The gate fails closed:

- **Expected GPUs.** ``expect_gpus`` (``--expect-gpus N``), or by default the number of GPUs of
  the target's family that the ENGINE's host shows (the daemon's machine, which may be remote),
  counted through the engine from the device nodes (``/dev/nvidia<N>``; ``/dev/kfd`` plus
  ``/dev/dri/renderD*``); 0 with the reason when the image's architecture is not the daemon's
  (an emulated build) or the target is a cpu one. For a SIF, the node's: Slurm's count, else its
  devices. The self-test gets ``--expect-gpus N``: fewer GPUs visible inside is a fail, never a
  skip.
- **Release scope.** Only the full required phase set of the family, with no argument that
  changes what the checks demand, is a ``release`` verdict; anything narrower is ``partial`` and
  unlocks no tag, SIF or publish (:mod:`builder.gate.verdicts`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.engine import ContainerEngine, ImageInfo
from builder.errors import VerifyError
from builder.matrix.families import FAMILIES, VENDORS
from builder.gate.record import HOST, NODE, ArchRecord, GateGpus
from builder.selftest.cli import ParsedArgs, UsageError, parse_phases, read_args

# The daemon host's device directory the GPU probe mounts (tests point it at a fake tree).
HOST_DEV_ENV = "VERL_ENV_HOST_DEV"
# Family data of the gate (builder.matrix.families): the phases a release verdict needs (every phase
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
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
SLURM_GPU_VARS = ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE")


@dataclass(frozen=True)
class GpuPlan:
    """What the image gate expects of GPUs, and why."""

    expected: int | None  # None: the family is unknown, the self-test decides (auto)
    source: str  # --expect-gpus | engine host | emulated | cpu target | unknown family
    reason: str
    vendor: str | None = None  # nvidia | amd: whose devices are handed to the container
    host_count: int | None = None
    host_devices: tuple[str, ...] = ()
    dev_root: str | None = None
    narrowed: str | None = None  # why an explicit count makes the run partial

    def record(self, handed: str | None) -> GateGpus:
        """The gate's record of this plan (``handed``: whose devices the container got)."""
        return GateGpus(self.expected, self.reason, HOST, source=self.source,
                        vendor=self.vendor, dev_root=self.dev_root, narrowed=self.narrowed,
                        host_count=self.host_count, host_devices=self.host_devices,
                        handed=handed)


@dataclass(frozen=True)
class SelftestPlan:
    """The self-test arguments, the phases they select and the release scope they allow."""

    args: tuple[str, ...]
    phases: tuple[str, ...]
    required: tuple[str, ...]
    partial_reason: str | None


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
    common: dict[str, Any] = {"vendor": vendor, "host_count": host_count,
                              "host_devices": devices,
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


def _read_selftest_args(extra_args: Sequence[str]) -> ParsedArgs:
    """The self-test's own reading of ``extra_args`` (its parser, in its module)."""
    if {"-h", "--help", "--version"} & set(extra_args):
        raise VerifyError("--selftest-args: --help and --version do not verify anything")
    try:
        return read_args(list(extra_args))
    except UsageError as exc:
        raise VerifyError(f"--selftest-args: {exc}") from None
    except SystemExit:
        raise VerifyError("--selftest-args: --help and --version do not verify anything") from None


def plan_selftest(family: str | None, extra_args: Sequence[str] = (),
                  phases: str | None = None) -> SelftestPlan:
    """Validate the self-test arguments here (before any container runs) and decide the scope.

    Raises VerifyError for an argument the self-test would refuse or that verify owns.
    """
    parsed = _read_selftest_args(extra_args)
    changed, flag = parsed.changed, parsed.flags
    for dest in sorted(changed & OWNED.keys()):
        raise VerifyError(f"--selftest-args: {flag[dest]} is set by verify; {OWNED[dest]}")
    text = parsed.values["phases"]
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


# --------------------------------------------------------------------------- the engine's host


def host_dev_root() -> str:
    return os.environ.get(HOST_DEV_ENV) or "/dev"


def expected_gpus(engine: ContainerEngine, image_id: str, family: str | None, *,
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


def arch_plan(engine: ContainerEngine, img: ImageInfo, manifest: Mapping[str, Any] | None,
              emulated: bool | None = None) -> ArchRecord:
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
    return ArchRecord(found, wanted, host, bool(emulated),
                      EMULATION_FACTOR if emulated else 1.0, refused)


# --------------------------------------------------------------------------- a SIF's node


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


def list_devices(vendor: str, dev_root: str) -> list[str]:
    """The device nodes of ``vendor`` under ``dev_root`` (relative to it), sorted."""
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
    gpus: GateGpus
    refused: str | None  # why it cannot run here (a fail verdict, never a skip)


def _node_expectation(family: str | None, expect_gpus: int | None, environ: Mapping[str, str],
                      devices: Sequence[str] | None, dev_root: str) -> GateGpus:
    fam = FAMILIES.get(family or "")
    vendor = fam.vendor.name if fam and fam.vendor else None
    if vendor is None:
        if fam:
            return GateGpus(0, f"target family {family} has no GPUs", NODE, source="cpu target",
                            dev_root=dev_root)
        return GateGpus(None, "the SIF names no target family (no org.verl-env.accelerator "
                        "label): the self-test decides from what it sees", NODE,
                        source="unknown family", dev_root=dev_root)
    count, source, reason = node_gpus(vendor, environ, devices, dev_root)
    node = GateGpus(count, reason, NODE, source=source, vendor=vendor, dev_root=dev_root,
                    node_count=count, node_source=source)
    if expect_gpus is None:
        return node
    narrowed = f"--expect-gpus {expect_gpus} while {reason}" if expect_gpus < count else None
    return dataclasses.replace(node, expected=expect_gpus, reason=f"--expect-gpus {expect_gpus}",
                               source="--expect-gpus", narrowed=narrowed)


def plan_sif_gate(family: str | None, *, runtime: tuple[str, str] | None,
                  expect_gpus: int | None, environ: Mapping[str, str],
                  devices: Sequence[str] | None, dev_root: str = "/dev") -> SifGatePlan:
    """Pure: the runtime flags (:mod:`builder.matrix.families`), the GPU expectation from the node and
    whether this runtime can honour it (fails closed: GPUs expected and a runtime that cannot
    hand them in is a refusal)."""
    fam = FAMILIES.get(family or "")
    gpus = _node_expectation(family, expect_gpus, environ, devices, dev_root)
    flags = fam.apptainer_flags if fam else ()
    env = {k: environ[k] for k in (fam.visible_devices if fam else ()) if environ.get(k)}
    refused = None
    if runtime is None:
        refused = ("no container runtime to run the SIF (apptainer or singularity; ch-run for "
                   "cpu images)")
    elif runtime[0] == "ch-run" and flags and (gpus.expected or 0) > 0:
        refused = (f"{gpus.expected} GPU(s) expected, but ch-run cannot hand them in: "
                   f"{fam.chrun_refusal if fam else ''}")
    if runtime is not None and runtime[0] == "ch-run":
        flags = ()  # ch-run takes no --nv/--rocm; with no GPU expected the GPU phases pend
    return SifGatePlan(family if fam else None, runtime, flags, env, gpus, refused)


__all__ = ["EMULATION_FACTOR", "GpuPlan", "HOST_DEV_ENV", "RELEASE_PHASES",
           "SelftestPlan", "SifGatePlan", "arch_plan", "count_gpus", "decide_gpus",
           "expected_gpus", "family_of", "host_dev_root", "list_devices", "node_gpus",
           "plan_selftest", "plan_sif_gate"]
