"""What differs between the container runtimes a job runs its image with (Apptainer or
Singularity and a SIF, pyxis and an enroot squashfs or registry image, ch-run and a directory):
the template part of each, the environment handed in, the devices bound, the image reference
each takes and the SIF cache's file name."""

from __future__ import annotations

import re
from typing import Protocol

from builder.errors import SlurmError
from builder.matrix.families import FAMILIES


class RuntimeJob(Protocol):
    """What of a job its devices depend on (:class:`builder.cluster.job.SlurmJob` has it)."""

    family: str
    runtime: str

RUNTIMES = ("apptainer", "singularity", "pyxis", "ch-run")
#: The template part (``job/runtime/<part>.j2``) of each runtime.
RUNTIME_PARTS = {"apptainer": "apptainer", "singularity": "apptainer", "pyxis": "pyxis",
                 "ch-run": "chrun"}
#: The oldest Slurm the script supports: the one the tests run (Debian 12's 22.05). ``srun
#: --overlap`` came with 20.11, but steps sharing the Ray steps' GPUs and memory through it is
#: documented from 22.05 on, and a step no longer inheriting ``--cpus-per-task`` (which every
#: step here sets) is 22.05's behaviour; checked by the job at setup.
MIN_SLURM = "22.05"

#: Variables the job script hands to the container explicitly (besides every ``--env`` name),
#: so that they win over an image ENV of the same name; passed only when set.
PASSED_PREFIXES = ("NCCL_", "RCCL_", "GLOO_", "HSA_", "TORCH_NCCL_", "UCX_", "SLURM_", "RAY_")
PASSED_NAMES = ("HF_HOME", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
                "HIP_VISIBLE_DEVICES",
                "VERL_ENV_TARGET", "VERL_ENV_FAMILY", "VERL_ENV_CPUS_PER_NODE",
                "VERL_ENV_GPUS_PER_NODE", "VERL_ENV_JOB_DIR", "VERL_ENV_NODE_DEVICES",
                "PYTHONUNBUFFERED", "PYTHONNOUSERSITE", "LANG", "TZ")
#: What a runtime that starts from an empty environment needs as well (apptainer sets these
#: itself and refuses them as APPTAINERENV_*).
CLEAN_START_NAMES = ("HOME", "USER")
#: A registry reference pinned by digest; the schemes of a remote image.
DIGEST = re.compile(r"@sha256:([0-9a-f]{64})$")
REMOTE = ("oras://", "docker://")


def pyxis_image(source: str) -> str:
    """What ``srun --container-image`` takes: a path as it is; ``docker://REG/IMG@sha256:…``
    in enroot's form ``REG#IMG@sha256:…`` (a first component without ``.`` or ``:`` is a
    Docker Hub namespace, passed as it is)."""
    if not source.startswith("docker://"):
        return source
    ref = source[len("docker://"):]
    first, sep, rest = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return ref


def job_devices(job: RuntimeJob) -> tuple[str, ...]:
    """Device paths bound into the container when a node has them. ch-run shares the host's
    /dev; pyxis leaves NVIDIA GPUs and InfiniBand to enroot's hooks."""
    profile = FAMILIES[job.family]
    if job.runtime == "ch-run":
        return ()
    if job.runtime == "pyxis":
        return (*profile.pyxis_devices, *profile.node_devices)
    return ("/dev/infiniband", *profile.node_devices)


def sif_cache_name(source: str) -> str | None:
    """File name of a pulled SIF in the shared cache (by scheme and digest), None for a path."""
    if not source.startswith(REMOTE):
        return None
    match = DIGEST.search(source)
    if match is None:  # validate() refuses this earlier; keep the function total
        raise SlurmError(f"{source!r} is not pinned by digest")
    return f"{source.split('://', 1)[0]}-sha256-{match.group(1)}.sif"

