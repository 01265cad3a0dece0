"""What an accelerator family means, in one place: ``cuda``, ``rocm`` and ``cpu``.

Read by :mod:`builder.verify` (the phases a release verdict needs, whose GPUs to count on the
engine's host), :mod:`builder.engine` (how a container gets those GPUs), :mod:`builder.slurm`
(Apptainer flags, the GPU visibility variables, the NCCL/RCCL profile of the job) and the
templates. Adding a family means adding an entry here and its template blocks; nothing else
names a family.
"""

from __future__ import annotations

from dataclasses import dataclass

ALL_PHASES = ("preflight", "env", "imports", "versions", "cpu", "gpu", "collective", "ray")


@dataclass(frozen=True)
class Vendor:
    """How a vendor's GPUs show on a host and reach a container (engine-neutral data)."""

    name: str  # nvidia | amd
    device_globs: tuple[str, ...]  # under the engine host's /dev: the nodes that count GPUs
    gpu_request: bool = False  # the engine's GPU request (NVIDIA container toolkit)
    devices: tuple[str, ...] = ()  # device nodes passed through as they are
    groups: tuple[str, ...] = ()
    security: tuple[str, ...] = ()


NVIDIA = Vendor("nvidia", ("nvidia[0-9]*",), gpu_request=True)
AMD = Vendor("amd", ("kfd", "dri/renderD*"), devices=("/dev/kfd", "/dev/dri"),
             groups=("video",), security=("seccomp=unconfined",))
VENDORS = {v.name: v for v in (NVIDIA, AMD)}


@dataclass(frozen=True)
class Family:
    name: str
    vendor: Vendor | None
    release_phases: tuple[str, ...]  # every phase that can apply: what a release verdict needs
    apptainer_flags: tuple[str, ...]  # --nv / --rocm: the host's GPU stack inside the container
    visible_devices: tuple[str, ...]  # the variables that select GPUs for a process
    comm_library: str | None  # the collective library torch's "nccl" backend is here
    # Defaults of the Slurm job's communication profile (site-tunable, passed at run time,
    # never baked into images).
    job_env: tuple[tuple[str, str], ...] = ()
    charliecloud: bool = False  # ch-run runs it (it does not inject a host GPU stack)


FAMILIES: dict[str, Family] = {
    "cuda": Family("cuda", NVIDIA, ALL_PHASES, ("--nv",), ("CUDA_VISIBLE_DEVICES",), "NCCL",
                   job_env=(("NCCL_IB_DISABLE", "0"), ("CUDA_DEVICE_MAX_CONNECTIONS", "1"))),
    "rocm": Family("rocm", AMD, ALL_PHASES, ("--rocm",),
                   ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"), "RCCL",
                   # verl and AMD's MI300 recipes: MSCCL off, no scratch reclaim, and Ray told
                   # not to rewrite HIP_VISIBLE_DEVICES (it refuses ROCR_VISIBLE_DEVICES).
                   job_env=(("RCCL_MSCCL_ENABLE", "0"), ("HSA_NO_SCRATCH_RECLAIM", "1"),
                            ("RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES", "1"),
                            ("NCCL_IB_DISABLE", "0"))),
    "cpu": Family("cpu", None, ("preflight", "env", "imports", "versions", "cpu", "ray"), (),
                  (), None, charliecloud=True),
}


def family(name: str | None) -> Family | None:
    """The family called ``name`` (None for an unknown or missing name)."""
    return FAMILIES.get(name or "")
