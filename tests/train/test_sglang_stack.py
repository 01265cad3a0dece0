"""The shipped SGLang stack built and gated in CI (issue 37 item 6), so a regression in that
stack fails a submission: `cuda-x86_64-sglang` from the shipped matrix (verl[sglang,fsdp]:
sglang, sglang-kernel, flashinfer, torch's CUDA 13.0 wheels, cupy-cuda13x, trl, liger-kernel,
flash-linear-attention), built by the installed build-env on a real Docker Engine and gated;
then verl's own train check inside it with the SGLang rollout, which imports verl's SGLang
rollout code (ServerAdapter and its replica: sglang.srt's engine and server modules).

How it differs from the shipped target: the base is the debootstrap Debian 12 base (no public
image registry is reachable; torch's wheels bring their own CUDA runtime) and python is that
base's 3.11 (``--set python=3.11``; the lock is resolved again for 3.11 with the same pins and
override). The GPU boundary: no GPU and no driver here, so ``import sgl_kernel`` (every variant
links the driver's libcuda.so.1) is a skip naming the driver, and the rollout import stops at
the same library; the device checks skip with ``--expect-gpus 0``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.matrix.spec import load_matrix
from builder.selftest.phases import allowpath
from tests.conftest import run_build_env
from tests.support import engine_space

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow, pytest.mark.heavy]
REPO = Path(__file__).resolve().parents[2]
TARGET = "cuda-x86_64-sglang"
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def built(debian_base: str, ca_bundle: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[dict]:
    """The stack built and gated; afterwards its image (about 10 GB) and the build cache are
    removed from the group's engine, so the later heavy tests run with that disk back. Before
    it, the engine is cleared of what the group's earlier modules built (their images and the
    build cache: about 20 GB in a whole run, which the machine's other groups need too); only
    the debootstrap base stays. The heavy group's modules after this one (tests/vendor) build
    their own images from that base."""
    engine = engine_space.client()
    base = {engine.images.get(debian_base).id}
    engine_space.clear(engine, base, "engine cleared before the SGLang build")
    report = _build(debian_base, ca_bundle, tmp_path_factory)
    try:
        yield report
    finally:
        engine_space.clear(engine, base, f"{TARGET} built and checked")


def _build(debian_base: str, ca_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    workdir = tmp_path_factory.mktemp("sglang-build")
    t0 = time.monotonic()
    proc = run_build_env("--target", TARGET, "--matrix", str(REPO / "matrix.yaml"),
                         "--base-image", debian_base, "--set", "python=3.11",
                         "--tag-prefix", "verl-env-ci", "--ca-bundle", str(ca_bundle),
                         "--workdir", str(workdir), "--json", timeout=3600)
    TIMINGS["pipeline"] = time.monotonic() - t0
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"no report (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    stages = {k: v.get("seconds") for k, v in report["stages"].items() if isinstance(v, dict)}
    print(f"{TARGET}: built and gated in {TIMINGS['pipeline']:.0f} s, stages {stages}")
    return report


def _checks(report: dict) -> dict[str, dict]:
    return {c["id"]: c for c in report["verification"]["checks"]}


def test_the_sglang_stack_passes_the_gate_with_verls_extras(built: dict) -> None:
    assert built["result"] == "pass", (built.get("error"), [
        (c["id"], c.get("reason")) for c in built.get("verification", {}).get("checks", [])
        if c["status"] == "fail"])
    assert built["tags"] and built["tags"][-1].startswith(f"verl-env-ci:{TARGET}")
    checks = _checks(built)
    # verl's extras, imported by the gate (catalogue `locked: true` entries)
    for dist, module in (("sglang", "sglang"), ("cupy-cuda13x", "cupy"), ("trl", "trl"),
                         ("liger-kernel", "liger_kernel"), ("flash-linear-attention", "fla.layers"),
                         ("fla-core", "fla"), ("verl", "verl"), ("torch", "torch")):
        c = checks[f"imports.{dist}"]
        assert c["status"] == "pass" and c["reason"] == f"import {module}", c
    # the one import that needs the GPU driver: a skip naming it, never a pass
    kernel = checks["imports.sglang-kernel"]
    assert kernel["status"] == "skip" and "libcuda.so" in kernel["reason"], kernel
    # the reviewed override holds in the image (sglang pins transformers==5.6.0)
    assert checks["versions.pin.transformers"]["status"] == "pass"


def test_every_shipped_allowance_is_used_in_the_image(built: dict) -> None:
    """Exact lists read from the image: each `abi_allow` glob excuses at least one object that
    would fail here and every excused object is one of the matrix's; the same for
    `coverage_allow` and `record_shared` (no stale entry; the one shared path is named)."""
    target = load_matrix(REPO / "matrix.yaml").targets[TARGET]
    checks = _checks(built)
    abi = checks["abi.allowances"]
    assert abi["status"] == "pass" and abi["value"]["stale"] == [], abi
    excused = abi["value"]["excused"]
    globs = dict(target.abi_allow)
    assert {g for g in globs if any(allowpath.matches(g, p) for p in excused)} == set(globs)
    assert all(allowpath.reason(p, globs) for p in excused), excused
    cov = checks["coverage.allowances"]
    assert cov["status"] == "pass" and cov["value"] == {
        "allowances": len(target.coverage_allow), "stale": []}, cov
    records = checks["abi.records"]
    assert records["status"] == "pass", records
    assert records["value"]["collisions"] == {} and records["value"]["stale"] == []
    assert set(records["value"]["allowed"]) == {g for g, _ in target.record_shared}


def test_train_check_imports_verls_sglang_rollout_code(built: dict, tiny: dict) -> None:
    image = built["tags"][-1]
    t0 = time.monotonic()
    proc = run_build_env("train-check", "--image", image, "--model", tiny["model"], "--data",
                         tiny["data"], "--nodes", "1", "--gpus-per-node", "2", "--json",
                         timeout=900)
    print(f"train check in the SGLang image: {time.monotonic() - t0:.1f} s")
    report = json.loads(proc.stdout)
    stages = {s["name"]: s for s in report["stages"]}
    assert proc.returncode == 0 and report["status"] == "pass", (report, proc.stderr[-3000:])
    assert "All configuration checks passed" in stages["validate"]["verl_says"]
    # verl's SGLang rollout code imported until the GPU driver's library (sgl_kernel), not
    # merely found: a broken sglang import, or one verl cannot use, fails this stage
    rollout = stages["trainer"]["rollout"]
    assert rollout.startswith("sglang: verl's rollout code imported up to sgl_kernel, which "
                              "needs the GPU driver's libcuda.so.1"), rollout
    assert stages["gpu"]["status"] == "stop"
