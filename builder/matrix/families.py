"""What an accelerator family means, in one place: ``cuda``, ``rocm`` and ``cpu``.

Read by :mod:`builder.gate` (the phases a release verdict needs, whose GPUs to count on the
engine's host), :mod:`builder.engine` (how a container gets those GPUs), :mod:`builder.cluster.job`
(Apptainer flags, the GPU visibility variables, the NCCL/RCCL profile of the job) and the
templates. Adding a family means adding an entry here and its template blocks; nothing else
names a family.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from builder import catalog

# ``abi`` (every extension's undefined symbols against the libraries the loader will give it)
# applies to every family, a CPU torch has extensions too, and needs no GPU.
ALL_PHASES = ("preflight", "env", "imports", "versions", "coverage", "abi", "cpu", "gpu",
              "collective", "ray")
# The phases that prove nothing without a GPU: a verdict of a GPU family whose host had none is
# a *build* verdict with these phases ``pending`` (builder.gate.verdicts).
GPU_PHASES = ("gpu", "collective")


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
    # The Slurm job's NCCL/RCCL profile: exported unless the site exported them first (site
    # values always win), passed at run time, never baked into an image.
    collective_defaults: Mapping[str, str] = field(default_factory=dict)
    uses_ib: bool = False  # InfiniBand tuning in the job (NCCL_IB_HCA from InfiniBand ports)
    unset: tuple[str, ...] = ()  # variables unset before the container starts
    charliecloud: bool = False  # ch-run can run it (ch-run injects no host GPU stack)
    # Baked into the image (ENV): what every process of the family needs whatever launches it.
    image_env: Mapping[str, str] = field(default_factory=dict)
    # verl trainer overrides the family needs, appended to the Slurm job's default command.
    trainer_overrides: tuple[str, ...] = ()
    # What a GPU architecture of the family is called in the matrix's ``gpus:`` list (a regular
    # expression; None: the family runs on no GPU, and a target of it lists none).
    gpu_pattern: str | None = None

    # --- the Slurm job (builder.cluster.job, templates/job/) -------------------------------------
    # The GPU selection a launcher may have set, in priority order: the first one set is
    # exported under every name of ``visible_devices`` (ROCm: Ray wants HIP == CUDA).
    visible_sources: tuple[str, ...] = ()
    # Device paths bound into the container in every runtime when the node has them (NVL72:
    # the IMEX channels that multi-node NVLink needs).
    node_devices: tuple[str, ...] = ()

    @property
    def needs_gpus(self) -> bool:
        """A job of this family must have GPUs in its allocation."""
        return self.vendor is not None

    @property
    def pyxis_devices(self) -> tuple[str, ...]:
        """Device nodes pyxis must mount itself: enroot's hooks inject NVIDIA GPUs (and
        InfiniBand) but have no AMD hook, so ROCm's /dev/kfd and /dev/dri are mounted."""
        return self.vendor.devices if self.vendor else ()

    @property
    def gpu_phases(self) -> tuple[str, ...]:
        """The release phases that need this family's GPUs (none for a family without GPUs)."""
        return tuple(p for p in self.release_phases if p in GPU_PHASES) if self.vendor else ()

    @property
    def gpu_probe(self) -> str | None:
        """Whose GPUs a node counts when Slurm does not say (nvidia, amd, None)."""
        return self.vendor.name if self.vendor else None

    @property
    def chrun_refusal(self) -> str | None:
        """Why ``ch-run`` cannot run this family (None: it can)."""
        if self.charliecloud:
            return None
        what = {"nvidia": "NVIDIA driver libraries", "amd": "ROCm devices and libraries"}.get(
            self.gpu_probe or "", "GPU stack")
        return (f"ch-run does not inject the host's {what} into the container, and this tool "
                f"does not either; use --runtime apptainer (or singularity) for {self.name} "
                "images")


FAMILIES: Mapping[str, Family] = MappingProxyType({
    "cuda": Family("cuda", NVIDIA, ALL_PHASES, ("--nv",), ("CUDA_VISIBLE_DEVICES",), "NCCL",
                   collective_defaults=MappingProxyType({"NCCL_IB_DISABLE": "0"}), uses_ib=True,
                   # sm_90, sm_100, sm_103; sm_90a / sm_100f: arch- and family-specific code
                   gpu_pattern=r"sm_[1-9][0-9]{1,2}[af]?",
                   # GB200/GB300 NVL72: the IMEX channels (never NCCL_CUMEM_ENABLE: NCCL decides)
                   node_devices=("/dev/nvidia-caps-imex-channels",)),
    # verl's and AMD's MI300 recipes: MSCCL off, no scratch reclaim; Ray refuses
    # ROCR_VISIBLE_DEVICES and must leave HIP_VISIBLE_DEVICES alone.
    "rocm": Family("rocm", AMD, ALL_PHASES, ("--rocm",),
                   ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"), "RCCL",
                   collective_defaults=MappingProxyType({
                       "NCCL_IB_DISABLE": "0", "RCCL_MSCCL_ENABLE": "0",
                       "HSA_NO_SCRATCH_RECLAIM": "1",
                       "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1"}),
                   uses_ib=True, unset=("ROCR_VISIBLE_DEVICES",),
                   visible_sources=("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                                    "HIP_VISIBLE_DEVICES"),
                   # Ray must not rewrite the visibility variables the launcher set (verl's and
                   # AMD's ROCm images; docs/families.md cites them).
                   image_env=MappingProxyType({
                       "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1",
                       "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES": "1"}),
                   # the engines' overrides for ROCm (the catalogue's engines: trainer_overrides)
                   trainer_overrides=catalog.shipped().trainer_overrides("rocm"),
                   # gfx942 (MI300X/MI325X), gfx950 (MI350X/MI355X), gfx90a (MI250X), gfx1100
                   gpu_pattern=r"gfx[0-9]{2,4}[0-9a-f]?"),
    "cpu": Family("cpu", None,
                  ("preflight", "env", "imports", "versions", "abi", "cpu", "ray"), (),
                  (), None, charliecloud=True),
})


@dataclass(frozen=True)
class SourceArchs:
    """What a source build's own build system compiles GPU code for, read from one release of
    it: each GPU generation (``sm_<major>x``) it supports -> the value its arch list takes."""

    package: str
    version: str  # the release the table was read from (a new pin is a review of it)
    family: str
    variable: str  # the build's own arch-list variable
    generations: Mapping[int, str]

    def unsupported(self, gpus: tuple[str, ...]) -> tuple[str, ...]:
        """The GPUs the build has no code for (no value for their generation)."""
        return tuple(g for g in gpus if sm_major(g) not in self.generations)

    def arch_list(self, gpus: tuple[str, ...]) -> str:
        """``sm_80, sm_89, sm_100, sm_103`` -> ``80;100``; a GPU without a value is refused."""
        missing = self.unsupported(gpus)
        if missing:
            raise ValueError(f"{self.package} {self.version} builds no code for "
                             f"{', '.join(missing)} (it builds for "
                             f"{', '.join(f'sm_{m}x' for m in self.generations)})")
        return ";".join(dict.fromkeys(self.generations[sm_major(g)] for g in gpus))


def gpu_digits(gpu: str) -> str:
    """``sm_89`` -> ``89``, ``sm_103a`` -> ``103``, ``sm_120f`` -> ``120``: a CUDA GPU's compute
    capability as digits (the one parser of the matrix's ``sm_`` names)."""
    return gpu[3:].rstrip("af")


def gpu_suffix(gpu: str) -> str:
    """``sm_90a`` -> ``a``, ``sm_100f`` -> ``f``, ``sm_80`` -> ``''`` (arch/family-specific)."""
    return gpu[3 + len(gpu_digits(gpu)):]


def sm_major(gpu: str) -> int:
    """``sm_89`` -> 8, ``sm_103a`` -> 10, ``sm_120f`` -> 12."""
    return int(gpu_digits(gpu)[:-1])


def sm_number(gpu: str) -> int:
    """``sm_89`` -> 89, ``sm_103a`` -> 103: compare GPUs by generation and minor."""
    return int(gpu_digits(gpu))


def torch_arch(gpu: str) -> str:
    """``sm_103`` -> ``10.3``, ``sm_90a`` -> ``9.0a`` (torch's TORCH_CUDA_ARCH_LIST spelling)."""
    digits = gpu_digits(gpu)
    return f"{digits[:-1]}.{digits[-1]}{gpu_suffix(gpu)}"


def _source_archs() -> Mapping[str, SourceArchs]:
    """Each source build's arch table, from the catalogue's ``archs:`` (packages.yaml says
    which release of the build it was read from)."""
    out = {}
    for name, d in catalog.shipped().distributions.items():
        if d.archs is not None:
            out[name] = SourceArchs(name, d.archs.version, d.archs.family, d.archs.variable,
                                    d.archs.generations)
    return MappingProxyType(out)


SOURCE_ARCHS: Mapping[str, SourceArchs] = _source_archs()


def family(name: str | None) -> Family | None:
    """The family called ``name`` (None for an unknown or missing name)."""
    return FAMILIES.get(name or "")
