"""Pure logic of the gate on a SIF (``build-env verify FILE.sif``): the runtime command line with
the family's flags, the GPU expectation from the node (Slurm's count, else its devices), and the
refusals that keep it failing closed. The real run is in test_cpu_sif.py (ch-run); apptainer
cannot be installed here, so its command line is checked as built."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from builder.errors import VerifyError
from builder.gate.plan import node_gpus, plan_sif_gate
from builder.sif.gate import verify_sif_image
from builder.sif.checks import apptainer_command, pick_runtime

APPTAINER = ("apptainer", "/usr/bin/apptainer")
CHRUN = ("ch-run", "/usr/bin/ch-run")
NVIDIA = ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"]


def test_apptainer_command_carries_the_family_flags_and_the_passed_env() -> None:
    cmd = apptainer_command("/usr/bin/apptainer", Path("/x/cuda.sif"), ["/bin/sh", "-c", "x"],
                            flags=("--nv",), env={"CUDA_VISIBLE_DEVICES": "0,1", "A": "b"})
    assert cmd == ["/usr/bin/apptainer", "exec", "--cleanenv", "--nv", "--env", "A=b", "--env",
                   "CUDA_VISIBLE_DEVICES=0,1", "/x/cuda.sif", "/bin/sh", "-c", "x"]


@pytest.mark.parametrize("environ, want, source", [
    ({"SLURM_GPUS_ON_NODE": "4"}, 4, "slurm"),
    ({"SLURM_GPUS_PER_NODE": "h100:8"}, 8, "slurm"),
    ({"SLURM_GPUS_ON_NODE": "", "SLURM_GPUS_PER_NODE": "2(x2)"}, 2, "slurm"),
    ({}, 2, "node devices"),
])
def test_node_gpus_slurm_first_then_devices(environ: dict, want: int, source: str) -> None:
    count, got, reason = node_gpus("nvidia", environ, NVIDIA)
    assert (count, got) == (want, source) and str(want) in reason


def test_cuda_on_a_gpu_node_with_apptainer() -> None:
    plan = plan_sif_gate("cuda", runtime=APPTAINER, expect_gpus=None,
                         environ={"SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
                                  "HOME": "/home/u"}, devices=NVIDIA)
    assert plan.flags == ("--nv",) and plan.refused is None
    assert plan.gpus.expected == 4 and plan.gpus.source == "slurm"
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}  # nothing else crosses --cleanenv


def test_rocm_takes_rocm_and_hip_visibility() -> None:
    plan = plan_sif_gate("rocm", runtime=APPTAINER, expect_gpus=None,
                         environ={"HIP_VISIBLE_DEVICES": "0", "ROCR_VISIBLE_DEVICES": "0"},
                         devices=["kfd", "dri/renderD128", "dri/renderD129"])
    assert plan.flags == ("--rocm",) and plan.gpus.expected == 2
    assert plan.env == {"HIP_VISIBLE_DEVICES": "0"}  # ROCR_VISIBLE_DEVICES is never passed


def test_fails_closed() -> None:
    # GPUs on the node and a runtime that cannot hand them in: refused, never skipped
    plan = plan_sif_gate("cuda", runtime=CHRUN, expect_gpus=None,
                         environ={"SLURM_GPUS_ON_NODE": "2"}, devices=[])
    assert plan.refused and "2 GPU(s) expected, but ch-run cannot hand them in" in plan.refused
    # no runtime at all
    assert plan_sif_gate("cpu", runtime=None, expect_gpus=None, environ={},
                         devices=None).refused
    # fewer than the node has: narrowed (a partial verdict)
    plan = plan_sif_gate("cuda", runtime=APPTAINER, expect_gpus=1,
                         environ={"SLURM_GPUS_ON_NODE": "4"}, devices=[])
    assert plan.gpus.expected == 1 and "--expect-gpus 1 while" in plan.gpus.narrowed


def test_gpu_less_node_runs_every_phase_with_gpus_pending() -> None:
    # a cuda SIF on a CPU node under ch-run: runs, 0 expected (the verdict is a build one)
    plan = plan_sif_gate("cuda", runtime=CHRUN, expect_gpus=None, environ={}, devices=[])
    assert plan.refused is None and plan.flags == () and plan.gpus.expected == 0
    cpu = plan_sif_gate("cpu", runtime=CHRUN, expect_gpus=None, environ={}, devices=None)
    assert cpu.flags == () and cpu.gpus.expected == 0 and cpu.refused is None
    unknown = plan_sif_gate(None, runtime=APPTAINER, expect_gpus=None, environ={}, devices=None)
    assert unknown.gpus.expected is None and unknown.family is None


def test_not_a_sif_and_a_missing_runtime_are_named(tmp_path: Path) -> None:
    bogus = tmp_path / "x.sif"
    bogus.write_bytes(b"not a sif")
    with pytest.raises(VerifyError, match="x.sif: not a readable SIF"):
        verify_sif_image(bogus)
    if shutil.which("apptainer") is None:
        assert pick_runtime("apptainer") is None
