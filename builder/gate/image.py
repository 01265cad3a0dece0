"""The gate of an image: run the self-test in a fresh container of the engine and read its JSON
report.

The image's own baked self-test runs when present (``/opt/verl-env/verl_env_selftest``); for any
other image the host's copy is copied in and run instead, so ``build-env verify`` works on images
this tool did not build. Exit code of the self-test: 0 pass, 1 fail, 2 incomplete, 3 error.

Beyond the plan (:mod:`builder.gate.plan`: GPUs expected, release scope, architecture):

- **Entrypoint.** The image's ENTRYPOINT and CMD are replaced (vendor images start shells or
  launchers).
- **No bind mounts.** The self-test, the manifest and the report travel through the engine, so
  a remote engine (``DOCKER_HOST=ssh://...``) verifies like a local one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

from builder import shipped
from builder.engine import ContainerEngine, ImageInfo, faults
from builder.errors import EngineError
from builder.gate import ending
from builder.gate.plan import (EMULATION_FACTOR, GpuPlan, SelftestPlan, arch_plan, expected_gpus,
                               family_of, plan_selftest)
from builder.gate.record import GateGpus, GateRecord, ImageRun, SeenGpus
from builder.gate.verdicts import PARTIAL, RELEASE, Verdict

# told the gate's record and the kill-switch timeout just before the self-test's container starts
Started = Callable[[GateRecord, float], None]

OUT_DIR, HOST_DIR = "/verl-env-out", "/verl-env-host"
REPORT = f"{OUT_DIR}/report.json"
EMULATED_ENV = "VERL_ENV_EMULATED"  # the self-test's --emulated FACTOR, as verify passes it
# Runs under /bin/sh in the image: prefer the baked self-test, else the copied-in host copy.
# A vendor base names its interpreter in /opt/verl-env/interpreter (builder.resolve.vendor).
_LAUNCH = ('PY=$(cat /opt/verl-env/interpreter 2>/dev/null); [ -x "$PY" ] || '
           'PY=$(command -v python || command -v python3) || { echo "no python in image" >&2; '
           'exit 3; }; [ -d /opt/verl-env/verl_env_selftest ] || '
           f'export PYTHONPATH={HOST_DIR}${{PYTHONPATH:+:$PYTHONPATH}}; '
           'exec "$PY" -m verl_env_selftest "$@"')
ENTRYPOINT = ["/bin/sh", "-c", _LAUNCH, "verl-env-selftest"]


def verify_image(engine: ContainerEngine, image: str, *, expect_gpus: int | None = None,
                 timeout: float = 900, gpus: str | None = "auto",
                 extra_args: Sequence[str] | None = None, phases: str | None = None,
                 network: str = "none", manifest: dict[str, Any] | None = None,
                 dev_root: str | None = None, emulated: bool | None = None,
                 started: Started | None = None) -> Verdict:
    """Run the self-test in a fresh container of ``image``; never raises for a failed verdict.

    ``expect_gpus``: GPUs the self-test must see (None: what the engine's host shows for the
    family; see :mod:`builder.gate.plan`). ``gpus``: which devices the container gets (``auto``:
    the family's vendor when GPUs are expected; ``nvidia``, ``amd``; None: none). ``extra_args``
    and ``phases`` narrow the run (a partial verdict). ``manifest`` (a target's rendered
    manifest) replaces the image's baked one: it holds any image, e.g. one built elsewhere, to a
    matrix target's pins. An image whose architecture is not the target's is refused without
    running it (a fail verdict); ``emulated`` (None: when the image's architecture is not the
    engine host's) runs the self-test under QEMU with its timeouts scaled by EMULATION_FACTOR.
    ``started`` is called just before the container starts (``verify``'s progress line).
    Raises VerifyError for bad self-test arguments, EngineError for an image the engine does not
    have; every other problem is an error or fail verdict.
    """
    img = engine.image(image)
    family = family_of(manifest, img.labels)
    plan = plan_selftest(family, extra_args or (), phases)
    arch = arch_plan(engine, img, manifest, emulated)
    gate = GateRecord(family, plan.phases, plan.required, plan.args,
                      ImageRun(tuple(ENTRYPOINT[:2]), arch))
    if arch.refused:
        check = {"id": "gate.arch", "phase": "gate", "status": "fail", "required": True,
                 "applies": True, "value": arch.image, "reason": arch.refused}
        return ending.refused(image, dataclasses.replace(gate, scope=RELEASE), code=1,
                              error=arch.refused, check=check)
    if arch.emulated:
        if arch.image != arch.engine_host:
            engine.require_emulation(arch.image or "")
        timeout *= EMULATION_FACTOR
    try:
        gpu = expected_gpus(engine, img.id, family, expect_gpus=expect_gpus,
                            image_arch=img.architecture, dev_root=dev_root)
    except EngineError as exc:
        raise_engine_fault(engine, exc, "counting the engine host's GPUs")
        why = f"could not count the engine host's GPUs: {exc.args[0]}"
        gate = dataclasses.replace(gate, scope=PARTIAL,
                                   partial_reason="the GPU expectation is unknown",
                                   gpus=GateGpus(None, why))
        return ending.refused(image, gate, code=3, error=why)
    reasons = [r for r in (plan.partial_reason, gpu.narrowed) if r]
    gate = dataclasses.replace(gate, scope=PARTIAL if reasons else RELEASE,
                               partial_reason="; ".join(reasons) or None)
    return _run(engine, img, image, gate, plan, gpu, gpus=gpus, manifest=manifest, network=network,
                timeout=timeout, started=started)


def _handed(gpus: str | None, gpu: GpuPlan) -> str | None:
    """Whose devices the container gets: ``auto`` hands the family's when GPUs are expected."""
    if gpus == "auto":
        return gpu.vendor if (gpu.expected or 0) > 0 else None
    return gpus


def _run(engine: ContainerEngine, img: ImageInfo, image: str, gate: GateRecord, plan: SelftestPlan,
         gpu: GpuPlan, *, gpus: str | None, manifest: dict[str, Any] | None, network: str,
         timeout: float, started: Started | None = None) -> Verdict:
    """Copy the self-test (and the manifest) in, run it, and read its report out."""
    kind = _handed(gpus, gpu)
    command = ["--json", REPORT, *plan.args]
    emulated = gate.arch is not None and gate.arch.emulated
    # An environment variable, not --emulated: a self-test baked by an older builder ignores it
    # (and runs with its own timeouts) instead of refusing an unknown argument.
    environment = {EMULATED_ENV: f"{EMULATION_FACTOR:g}"} if emulated else {}
    if gpu.expected is not None:
        command += ["--expect-gpus", str(gpu.expected)]
    files = {f"{HOST_DIR}/verl_env_selftest/{rel}": data for rel, data in shipped.selftest_files()}
    if manifest is not None:
        files[f"{HOST_DIR}/manifest.json"] = json.dumps(manifest, indent=2).encode()
        command += ["--manifest", f"{HOST_DIR}/manifest.json"]
    gate = dataclasses.replace(gate, run=ImageRun(tuple(ENTRYPOINT[:2]), gate.arch,
                                                  tuple(command)), gpus=gpu.record(kind))
    if started is not None:
        started(gate, timeout)
    try:
        result = engine.run(img.id, command, entrypoint=ENTRYPOINT, timeout=timeout,
                            network=network, gpus=kind, files=files, dirs=[OUT_DIR],
                            collect=[REPORT], environment=environment)
    except EngineError as exc:
        raise_engine_fault(engine, exc, f"the self-test of {img.id[:19]}")
        if kind is None:
            raise
        # the engine could not hand the expected GPUs over: they are not visible, a fail
        seen = SeenGpus(None, "the container did not start")
        gate = dataclasses.replace(gate, gpus=dataclasses.replace(gpu.record(kind),
                                                                  in_image=seen))
        return ending.refused(image, gate, code=1, error=f"the engine could not give the "
                              f"container the {kind} GPUs: {exc.args[0]}")
    return ending.finish(image, gate, exit_code=result.exit_code,
                         report=_parse(result.files.get(REPORT)), logs=result.logs,
                         seconds=result.seconds, timeout=timeout)


def _parse(raw: bytes | None) -> dict[str, Any]:
    """The report the self-test wrote ({} when none, or not a JSON object)."""
    if not raw:
        return {}
    try:
        report = json.loads(raw)
    except json.JSONDecodeError:
        return {}
    return report if isinstance(report, dict) else {}


def raise_engine_fault(engine: ContainerEngine, exc: EngineError, what: str) -> None:
    """An engine that died or filled up is the run's error, never a verdict about the image."""
    fault = faults.translate(engine, exc, stage="verify", what=what)
    if fault is None and not engine.alive():
        fault = faults.engine_down(engine, stage="verify", what=what)
    if fault is not None:
        raise fault from None
