"""Pure decisions of the gate: GPU expectation, release scope (verdict records:
test_verdicts.py)."""

from __future__ import annotations


import pytest

from builder.errors import VerifyError
from builder.matrix.families import ALL_PHASES
from builder.selftest.cli import PHASES as SELFTEST_PHASES
from builder.gate.plan import (RELEASE_PHASES, count_gpus, decide_gpus, family_of, normalize_arch,
                               plan_selftest)

NVIDIA = ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-modeset", "nvidia-caps"]
AMD = ["kfd", "dri/renderD128", "dri/renderD129", "dri/card0", "dri/card1"]


def test_count_gpus_per_vendor() -> None:
    assert count_gpus("nvidia", NVIDIA) == 2
    assert count_gpus("nvidia", ["nvidiactl", "nvidia-uvm"]) == 0
    assert count_gpus("amd", AMD) == 2
    assert count_gpus("amd", AMD[1:]) == 0  # render nodes without the compute driver
    with pytest.raises(ValueError):
        count_gpus("intel", [])


def test_expectation_from_the_engine_host() -> None:
    plan = decide_gpus("cuda", None, "amd64", "x86_64", NVIDIA, "/dev")
    assert (plan.expected, plan.source, plan.vendor, plan.host_count) == (2, "engine host",
                                                                          "nvidia", 2)
    assert "2 nvidia GPU(s)" in plan.reason and plan.narrowed is None
    plan = decide_gpus("rocm", None, "amd64", "x86_64", AMD, "/dev")
    assert (plan.expected, plan.vendor) == (2, "amd")
    assert decide_gpus("cuda", None, "amd64", "x86_64", [], "/dev").expected == 0


def test_expectation_emulated_cpu_unknown_and_explicit() -> None:
    emu = decide_gpus("cuda", None, "arm64", "x86_64", None)
    assert emu.expected == 0 and emu.source == "emulated" and "arm64" in emu.reason
    cpu = decide_gpus("cpu", None, "amd64", "x86_64", None)
    assert cpu.expected == 0 and cpu.source == "cpu target"
    unknown = decide_gpus(None, None, "amd64", "x86_64", None)
    assert unknown.expected is None and "no org.verl-env.accelerator" in unknown.reason
    explicit = decide_gpus("cpu", 1, "amd64", "x86_64", None)
    assert explicit.expected == 1 and explicit.source == "--expect-gpus"
    low = decide_gpus("cuda", 1, "amd64", "x86_64", NVIDIA, "/dev")
    assert low.expected == 1 and "shows 2 nvidia" in (low.narrowed or "")
    assert decide_gpus("cuda", 4, "amd64", "x86_64", NVIDIA, "/dev").narrowed is None
    with pytest.raises(ValueError):
        decide_gpus("cuda", None, "amd64", "x86_64", None)  # a GPU family must be probed


def test_arch_and_family() -> None:
    assert normalize_arch("x86_64") == normalize_arch("amd64") == "amd64"
    assert normalize_arch("aarch64") == normalize_arch("arm64") == "arm64"
    assert family_of({"accelerator": "rocm"}, {"org.verl-env.accelerator": "cpu"}) == "rocm"
    assert family_of(None, {"org.verl-env.accelerator": "cuda"}) == "cuda"
    assert family_of(None, {}) is None


def test_release_scope() -> None:
    full = plan_selftest("cuda")
    assert full.phases == SELFTEST_PHASES and full.partial_reason is None
    assert ALL_PHASES == full.phases and "abi" in full.required  # the families name every phase
    assert all("abi" in phases for phases in RELEASE_PHASES.values())
    no_abi = plan_selftest("cpu", ["--phases", "preflight,env,imports,versions,cpu,ray"])
    assert "phases abi not run" in (no_abi.partial_reason or "")
    assert plan_selftest("cpu", ["--strict", "--timeout", "60", "--jobs", "2"]).partial_reason \
        is None
    cpu = plan_selftest("cpu", [], ",".join(RELEASE_PHASES["cpu"]))
    assert cpu.partial_reason is None and "gpu" not in cpu.phases
    narrow = plan_selftest("cpu", ["--phases", "preflight"])
    assert "env,imports,versions,abi,cpu,ray not run" in (narrow.partial_reason or "")
    assert "gpu,collective" in (plan_selftest("rocm", [], "preflight,env,imports,versions,cpu,"
                                              "ray").partial_reason or "")
    relaxed = plan_selftest("cuda", ["--bw-fail-frac", "0.01", "--gloo-ranks", "1"])
    assert "--bw-fail-frac --gloo-ranks" in (relaxed.partial_reason or "")
    assert "unknown" in (plan_selftest(None).partial_reason or "")


@pytest.mark.parametrize("args, phases, needle", [
    (["--json", "/x"], None, "--json is set by verify"),
    (["--expect-gpus", "2"], None, "verify's --expect-gpus"),
    (["--manifest", "/m"], None, "--target"),
    (["--phases", "cpu"], "imports", "--phases given twice"),
    ([], "bogus", "unknown phase"),
    (["--no-such"], None, "unrecognized arguments"),
    (["--version"], None, "--help and --version"),
])
def test_bad_selftest_args_are_refused_before_running(args: list[str], phases: str | None,
                                                      needle: str) -> None:
    with pytest.raises(VerifyError, match=needle):
        plan_selftest("cpu", args, phases)
