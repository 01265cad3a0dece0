"""The gate's record: the ``gate`` section a verdict's report carries (phases and self-test
arguments run, the architecture, the GPUs expected and seen, the release scope), typed.

One serialisation: :meth:`GateRecord.to_dict` writes exactly the keys the image gate and the SIF
gate have always written (in the same order), :meth:`GateRecord.from_dict` reads any of them back,
records of an older build-env included (missing or malformed fields read as None or empty).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GATE_SCHEMA = "verl-env/gate/v1"
# where a GPU expectation was counted: on the engine's host (image gate), on the node that runs a
# SIF (SIF gate), or not at all (the engine could not count them; an older record)
HOST, NODE, UNCOUNTED = "host", "node", "uncounted"


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, (list, tuple)) else ()


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class SeenGpus:
    """The GPUs the self-test saw inside the container (None: not measured), and why."""

    count: int | None
    reason: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Any) -> SeenGpus:
        d = _dict(data)
        return cls(_int(d.get("count")), _str(d.get("reason")))


@dataclass(frozen=True)
class GateGpus:
    """What the gate expected of GPUs and what it saw. ``counted``: :data:`HOST` (the image
    gate: the engine host's devices), :data:`NODE` (the SIF gate: Slurm's count or the node's
    devices) or :data:`UNCOUNTED`; it decides which keys are written."""

    expected: int | None
    reason: str | None
    counted: str = UNCOUNTED
    source: str | None = None
    vendor: str | None = None
    dev_root: str | None = None
    narrowed: str | None = None  # why an explicit count makes the run partial
    host_count: int | None = None
    host_devices: tuple[str, ...] = ()
    handed: str | None = None  # whose devices the container got (image gate)
    node_count: int | None = None
    node_source: str | None = None
    in_image: SeenGpus | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.counted == HOST:
            out: dict[str, Any] = {
                "expected": self.expected, "source": self.source, "reason": self.reason,
                "vendor": self.vendor, "host_count": self.host_count, "dev_root": self.dev_root,
                "narrowed": self.narrowed, "host_devices": list(self.host_devices),
                "handed": self.handed}
        elif self.counted == NODE:
            out = {"vendor": self.vendor, "dev_root": self.dev_root}
            if self.node_count is not None:
                out.update(node_count=self.node_count, node_source=self.node_source)
            out.update(expected=self.expected, source=self.source, reason=self.reason)
            if self.narrowed:
                out["narrowed"] = self.narrowed
        else:
            out = {"expected": self.expected, "reason": self.reason}
        if self.in_image is not None:
            out["in_image"] = self.in_image.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Any) -> GateGpus:
        d = _dict(data)
        counted = HOST if "host_devices" in d else NODE if "dev_root" in d else UNCOUNTED
        return cls(expected=_int(d.get("expected")), reason=_str(d.get("reason")),
                   counted=counted, source=_str(d.get("source")), vendor=_str(d.get("vendor")),
                   dev_root=_str(d.get("dev_root")), narrowed=_str(d.get("narrowed")),
                   host_count=_int(d.get("host_count")), host_devices=_strs(d.get("host_devices")),
                   handed=_str(d.get("handed")), node_count=_int(d.get("node_count")),
                   node_source=_str(d.get("node_source")),
                   in_image=SeenGpus.from_dict(d["in_image"]) if "in_image" in d else None)


@dataclass(frozen=True)
class ArchRecord:
    """The image's architecture against the target's and the engine host's."""

    image: str | None
    target: str | None
    engine_host: str | None
    emulated: bool
    emulation_factor: float
    refused: str | None  # why the gate refuses the image without running it

    def to_dict(self) -> dict[str, Any]:
        return {"image": self.image, "target": self.target, "engine_host": self.engine_host,
                "emulated": self.emulated, "emulation_factor": self.emulation_factor,
                "refused": self.refused}

    @classmethod
    def from_dict(cls, data: Any) -> ArchRecord:
        d = _dict(data)
        factor = d.get("emulation_factor")
        return cls(_str(d.get("image")), _str(d.get("target")), _str(d.get("engine_host")),
                   d.get("emulated") is True,
                   float(factor) if isinstance(factor, (int, float)) else 1.0,
                   _str(d.get("refused")))


@dataclass(frozen=True)
class SifSubject:
    """The SIF file a SIF gate ran: its path, its digest and the target it was built for."""

    sif: str
    digest: str
    target: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"sif": self.sif, "digest": self.digest, "target": self.target}

    @classmethod
    def from_dict(cls, data: Any) -> SifSubject:
        d = _dict(data)
        return cls(_str(d.get("sif")) or "", _str(d.get("digest")) or "", _str(d.get("target")))


@dataclass(frozen=True)
class ImageRun:
    """How the image gate ran the self-test: in a container of the engine."""

    entrypoint: tuple[str, ...]
    arch: ArchRecord | None = None
    selftest_argv: tuple[str, ...] | None = None  # None: the self-test did not start


@dataclass(frozen=True)
class SifRun:
    """How the SIF gate ran the self-test: on this node, with a container runtime."""

    subject: SifSubject
    runtime: str | None
    runtime_flags: tuple[str, ...]
    passed_env: tuple[str, ...]
    command: tuple[str, ...] | None = None  # None: the self-test did not start


@dataclass(frozen=True)
class FileTreeRecord:
    """The image's file tree as ``build-env reproduce`` proved it (a rebuild from the recorded
    inputs gave the same files): the root digest over every compared path's type, mode, owner,
    size and content digest (:func:`builder.reproduce.compare.root_digest`), how many paths it
    covers, and when and how it was proved. ``build-env reproduce IMAGE --against-record``
    checks an image against it without rebuilding."""

    root: str
    files: int
    schema: str = "verl-env/filetree/v1"
    proved: str | None = None  # "rebuilt identical at <time>"

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "root": self.root, "files": self.files,
                "proved": self.proved}

    @classmethod
    def from_dict(cls, data: Any) -> FileTreeRecord | None:
        d = _dict(data)
        root, files = _str(d.get("root")), _int(d.get("files"))
        if root is None or files is None:
            return None
        return cls(root, files, _str(d.get("schema")) or "verl-env/filetree/v1",
                   _str(d.get("proved")))


@dataclass(frozen=True)
class GateRecord:
    """The ``gate`` section of a report. ``scope`` is None for a record written before the gate
    kept it (such a verdict is partial); ``run`` is None for such a record too."""

    family: str | None
    phases: tuple[str, ...]
    required_phases: tuple[str, ...]
    selftest_args: tuple[str, ...]
    run: ImageRun | SifRun | None = None
    scope: str | None = None
    partial_reason: str | None = None
    gpus: GateGpus | None = None
    schema: str = GATE_SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)  # keys this build-env does not know
    files: FileTreeRecord | None = None  # the file tree a rebuild reproduced (reproduce)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": self.schema}
        if isinstance(self.run, SifRun):
            out["subject"] = self.run.subject.to_dict()
        out.update(family=self.family, phases=list(self.phases),
                   required_phases=list(self.required_phases),
                   selftest_args=list(self.selftest_args))
        if isinstance(self.run, ImageRun):
            out.update(self._image_keys(self.run))
        elif isinstance(self.run, SifRun):
            out.update(self._sif_keys(self.run))
        else:
            out.update(self._scope_keys())
            if self.gpus is not None:
                out["gpus"] = self.gpus.to_dict()
        if self.files is not None:
            out["files"] = self.files.to_dict()
        out.update(self.extra)
        return out

    def _scope_keys(self) -> dict[str, Any]:
        return {} if self.scope is None else {"scope": self.scope,
                                              "partial_reason": self.partial_reason}

    def _image_keys(self, run: ImageRun) -> dict[str, Any]:
        out: dict[str, Any] = {"entrypoint": list(run.entrypoint), "bind_mounts": []}
        if run.arch is not None:
            out["arch"] = run.arch.to_dict()
        out.update(self._scope_keys())
        if run.selftest_argv is not None:
            out["selftest_argv"] = list(run.selftest_argv)
        if self.gpus is not None:
            out["gpus"] = self.gpus.to_dict()
        return out

    def _sif_keys(self, run: SifRun) -> dict[str, Any]:
        out: dict[str, Any] = {"runtime": run.runtime, "runtime_flags": list(run.runtime_flags),
                               "passed_env": list(run.passed_env)}
        if self.gpus is not None:
            out["gpus"] = self.gpus.to_dict()
        out.update(self._scope_keys())
        if run.command is not None:
            out["command"] = list(run.command)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> GateRecord:
        d = _dict(data)
        run: ImageRun | SifRun | None = None
        if "subject" in d:
            command = d.get("command")
            run = SifRun(SifSubject.from_dict(d["subject"]), _str(d.get("runtime")),
                         _strs(d.get("runtime_flags")), _strs(d.get("passed_env")),
                         _strs(command) if command is not None else None)
        elif "entrypoint" in d:
            argv = d.get("selftest_argv")
            run = ImageRun(_strs(d.get("entrypoint")),
                           ArchRecord.from_dict(d["arch"]) if "arch" in d else None,
                           _strs(argv) if argv is not None else None)
        scope = str(d["scope"]) if "scope" in d else None
        return cls(family=_str(d.get("family")), phases=_strs(d.get("phases")),
                   required_phases=_strs(d.get("required_phases")),
                   selftest_args=_strs(d.get("selftest_args")), run=run, scope=scope,
                   partial_reason=_str(d.get("partial_reason")),
                   gpus=GateGpus.from_dict(d["gpus"]) if "gpus" in d else None,
                   schema=_str(d.get("schema")) or GATE_SCHEMA,
                   extra={k: v for k, v in d.items() if k not in _KNOWN},
                   files=FileTreeRecord.from_dict(d["files"]) if "files" in d else None)

    @property
    def arch(self) -> ArchRecord | None:
        return self.run.arch if isinstance(self.run, ImageRun) else None

    @property
    def subject(self) -> SifSubject | None:
        return self.run.subject if isinstance(self.run, SifRun) else None


_KNOWN = frozenset({"schema", "subject", "family", "phases", "required_phases", "selftest_args",
                    "entrypoint", "bind_mounts", "arch", "scope", "partial_reason",
                    "selftest_argv", "gpus", "runtime", "runtime_flags", "passed_env",
                    "command", "files"})
