"""The verdict: one typed model of what the gate proved about an image, serialised in one place,
and the one release rule that tagging, ``sif``, ``publish``, ``trust sign`` and ``trust verify``
all call (:func:`release_problem`).

A :class:`Verdict` is what the gate returns (:mod:`builder.gate`: the self-test's report with
the ``gate`` section it adds, read as a typed :class:`builder.gate.record.GateRecord`: phases
and arguments run, GPUs expected and seen) and what is recorded, signed and read back:
:meth:`Verdict.to_dict` and :meth:`Verdict.from_dict` are the only serialisation. Everything a
verdict claims (scope, level, GPU evidence) is derived from its report on every read, never
trusted from a stored field.

**Scope.** Only the full required phase set of the target's family, with no argument that
relaxes a check, is a ``release`` verdict; a narrowed run (``--phases``, ``--selftest-args``) is
``partial`` and unlocks nothing. A record without the gate's scope (written by an older
build-env) reads as partial.

**Level: what was proven.** A passing release verdict is at the

- ``build`` level: every phase that runs without a GPU passed (the device-code coverage phase
  included, where the family has it); for a GPU family the GPU phases are ``pending``, with the
  reason (no GPU on the host that ran the gate, an emulated build). A build verdict unlocks
  tags, SIF and publish unless the site demands more (``--require gpu``).
- ``gpu`` level: the GPU and collective phases also passed on N GPUs; the verdict names the GPU
  models, driver, CUDA/ROCm runtime, NCCL/RCCL version, transport and bus bandwidth, taken from
  the report's check values.

A ``cpu`` family has no GPU phases: its release verdict is a build verdict with nothing pending,
and ``--require gpu`` asks nothing more of it.

The local record lives under ``$XDG_STATE_HOME/verl-env/verdicts/`` (default ``~/.local/state``),
one JSON file per image ID, written atomically: what the gate proved about that image, whoever
asked. A verdict recorded for a site's target is also kept under ``verdicts/sites/<site>/``, bound
to the content it was made for (:class:`Binding`: the site's matrix, the target's matrix entry
hash, its lock's hash, the content tag). ``build-env list`` shows a target's verdict only from
that site's records, and only when the binding matches the target's matrix entry and lock as they
are now (:func:`latest_for`): a verdict never reaches another site, or a target whose pins moved,
by its name.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.errors import BuildEnvError
from builder.matrix.families import family as family_of_name
from builder.gate.record import GateRecord
from builder.files import atomic_write_text, state_home

SCHEMA = "verl-env/verdict/v2"
RELEASE, PARTIAL = "release", "partial"
BUILD, GPU = "build", "gpu"  # verdict levels, and what --require asks for
LEVELS = (BUILD, GPU)
PROVEN, PENDING, NONE = "proven", "pending", "none"  # GPU evidence of a verdict
REQUIRE_ENV = "VERL_ENV_REQUIRE"  # a site's default for --require (build | gpu)
EXIT_VERDICTS = {0: "pass", 1: "fail", 2: "incomplete", 3: "error"}
LABEL_NS = "org.verl-env"  # the image labels builder.render.baked writes
LABEL_PREFIX = f"{LABEL_NS}.verdict"


def requirement(value: str | None = None) -> str:
    """What a release needs: ``value`` (``--require``), else ``$VERL_ENV_REQUIRE``, else
    ``build``. A bad value is a BuildEnvError (exit 2) naming where it came from."""
    chosen = value or os.environ.get(REQUIRE_ENV) or BUILD
    if chosen not in LEVELS:
        where = "--require" if value else f"${REQUIRE_ENV}"
        raise BuildEnvError(f"{where}: {chosen!r} is not a verdict level "
                            f"({' or '.join(LEVELS)})")
    return chosen


# --------------------------------------------------------------------------- GPU evidence


@dataclass(frozen=True)
class GpuEvidence:
    """What a verdict says about GPUs: ``proven`` (with the facts), ``pending`` (with the
    reason) or ``none`` (a family without GPUs)."""

    status: str
    reason: str = ""
    count: int | None = None
    models: tuple[str, ...] = ()
    driver: str | None = None
    runtime: str | None = None  # "CUDA 13.0", "HIP 6.3.42131"
    library: str | None = None  # "NCCL 2.28.9", "RCCL 2.21.5"
    transport: str | None = None
    busbw_gbps: float | None = None
    busbw_note: str | None = None
    hosts: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v)
                for k, v in dataclasses.asdict(self).items()}

    def describe(self) -> str:
        """One phrase: ``pending (why)``, or the GPUs, driver, runtime, library and fabric."""
        if self.status != PROVEN:
            return f"{self.status}" + (f" ({self.reason})" if self.reason else "")
        models = ", ".join(sorted(set(self.models))) or "GPU"
        parts = [f"{self.count}x {models}"]
        parts += [p for p in (f"driver {self.driver}" if self.driver else None, self.runtime,
                              self.library, self.transport) if p]
        if self.busbw_gbps is not None:
            parts.append(f"busbw {self.busbw_gbps:g} GB/s")
        elif self.busbw_note:
            parts.append(f"busbw not measured ({self.busbw_note})")
        return "proven on " + ", ".join(parts)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _checks(report: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    checks = report.get("checks")
    return {c["id"]: c for c in checks if isinstance(c, dict) and "id" in c} \
        if isinstance(checks, list) else {}


def gpu_evidence(report: Mapping[str, Any], family: str | None) -> GpuEvidence:
    """The GPU evidence of a report (see the module doc); the facts come from the check values
    the self-test recorded (``gpu.driver``, ``gpu.nccl_library``, ``collective.*``) and its
    platform section."""
    fam = family_of_name(family)
    if fam is not None and not fam.gpu_phases:
        return GpuEvidence(NONE, f"target family {fam.name} has no GPUs")
    gate = GateRecord.from_dict(report.get("gate"))
    checks = _checks(report)
    if fam is None:
        return GpuEvidence(PENDING, "the target family is unknown: no GPU phase set to prove")
    missing = [p for p in fam.gpu_phases if p not in gate.phases]
    if missing:
        return GpuEvidence(PENDING, f"phase(s) {', '.join(missing)} did not run")
    expected = gate.gpus.expected if gate.gpus else None
    if expected is None or expected < 1:
        why = (gate.gpus.reason if gate.gpus else None) or "no GPU was expected"
        return GpuEvidence(PENDING, f"no GPU where the gate ran: {why}")
    count, correct = checks.get("gpu.device_count", {}), checks.get(
        "collective.nccl_allreduce", {})
    for check in (count, correct):
        if check.get("status") != "pass":
            what = check.get("id") or "a GPU check"
            return GpuEvidence(PENDING, f"{what} did not pass: "
                                        f"{check.get('status', 'absent')} {check.get('reason') or ''}"
                               .rstrip())
    return gpu_facts(report, fam.name, int(count.get("value") or expected))


def gpu_facts(report: Mapping[str, Any], family: str, count: int | None) -> GpuEvidence:
    """The GPU facts a report's check values and platform section record (``proven``: the
    caller has decided that the GPU phases passed)."""
    fam = family_of_name(family)
    checks = _checks(report)
    platform = _dict(report.get("platform"))
    models = tuple(str(g.get("name")) for g in platform.get("gpus") or ()
                   if isinstance(g, dict) and g.get("name"))
    driver_value = checks.get("gpu.driver", {}).get("value")
    driver_value = driver_value if isinstance(driver_value, dict) else {}
    if fam is not None and fam.vendor is not None and fam.vendor.name == "amd":
        runtime = f"HIP {driver_value['hip']}" if driver_value.get("hip") else None
        driver = driver_value.get("amdgpu") or platform.get("driver")
    else:
        runtime = f"CUDA {driver_value['runtime_cuda']}" if driver_value.get("runtime_cuda") \
            else None
        driver = driver_value.get("driver") or platform.get("driver")
    lib_value = checks.get("gpu.nccl_library", {}).get("value")
    version = lib_value.get("version") if isinstance(lib_value, dict) else None
    versions = _dict(report.get("versions"))
    version = version or versions.get("nccl_loaded")
    library = f"{(fam.comm_library if fam else None) or 'NCCL'} {version}" if version else None
    busbw = checks.get("collective.busbw", {})
    bw = busbw.get("value")
    transport = checks.get("collective.transport", {}).get("value") or report.get("transport")
    hosts = tuple(str(h) for h in report.get("hosts") or () if h)
    return GpuEvidence(PROVEN, "", count=count, models=models,
                       driver=str(driver) if driver else None, runtime=runtime, library=library,
                       transport=str(transport) if transport else None,
                       busbw_gbps=float(bw) if isinstance(bw, (int, float)) else None,
                       busbw_note=None if isinstance(bw, (int, float)) else
                       (busbw.get("reason") or "no collective.busbw check"), hosts=hosts)


# --------------------------------------------------------------------------- the binding


@dataclass(frozen=True)
class Binding:
    """What a verdict was recorded for: a site (:func:`site_key` of its matrix) and a target's
    content there (its matrix entry hash and lock hash, as baked into the image's labels; the
    content tag when the build gave one)."""

    site: str
    target: str
    entry_hash: str
    lock_hash: str | None
    content_tag: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Binding | None:
        """The binding of a record (None: none, or not one: such a record binds nothing)."""
        if not isinstance(data, Mapping):
            return None
        site, target, entry = data.get("site"), data.get("target"), data.get("entry_hash")
        if not (isinstance(site, str) and isinstance(target, str) and isinstance(entry, str)):
            return None

        def text(key: str) -> str | None:
            value = data.get(key)
            return None if value is None else str(value)

        return cls(site, target, entry, text("lock_hash"), text("content_tag"))

    def same_content(self, other: Binding) -> bool:
        """The same site, target, matrix entry and lock (the content tag is not compared: it
        also hashes the base image's identity, which only a build resolves)."""
        return (self.site, self.target, self.entry_hash, self.lock_hash) == (
            other.site, other.target, other.entry_hash, other.lock_hash)


def binding_from_labels(site: Path | str, labels: Mapping[str, str],
                        content_tag: str | None = None) -> Binding | None:
    """The binding of an image built by build-env, from its labels (target, matrix entry hash,
    lock hash) at ``site`` (a matrix path); None for an image without them, or an override."""
    target, entry, lock = (labels.get(f"{LABEL_NS}.{k}") for k in
                           ("target", "matrix-hash", "lock-hash"))
    if not (target and entry and lock) or labels.get(f"{LABEL_NS}.override") == "true":
        return None
    return Binding(site_key(site), target, entry, lock, content_tag)


def site_key(matrix: Path | str) -> str:
    """A site's identity: its matrix file's absolute path."""
    return str(Path(matrix).resolve())


# --------------------------------------------------------------------------- the verdict


@dataclass(frozen=True)
class Verdict:
    """The gate's result for one image, as run or as read back from a record or a statement."""

    image: str  # the reference the gate was asked about (the image ID for a record read back)
    exit_code: int
    report: dict[str, Any]
    logs: str = ""  # the self-test's output (never serialised)
    seconds: float = 0.0
    image_id: str | None = None
    target: str | None = None
    tags: tuple[str, ...] = ()
    recorded_at: str | None = None
    # what a stored record said at its top level (checked against the report, never trusted)
    declared: Mapping[str, Any] = field(default_factory=dict)
    binding: Binding | None = None  # the site and content it was recorded for (None: no site)

    # ----- what the report says
    @property
    def gate(self) -> GateRecord | None:
        """The gate's record (None: the report has no ``gate`` section)."""
        gate = self.report.get("gate")
        return GateRecord.from_dict(gate) if isinstance(gate, dict) else None

    @property
    def overall(self) -> str:
        declared = self.declared.get("overall")
        if declared:
            return str(declared)
        return str(self.report.get("overall") or EXIT_VERDICTS.get(self.exit_code, "error"))

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and self.overall == "pass"

    @property
    def scope(self) -> str:
        """``release`` or ``partial`` (a record without the gate's scope is partial)."""
        gate = self.gate
        return RELEASE if gate is not None and gate.scope == RELEASE else PARTIAL

    @property
    def partial_reason(self) -> str | None:
        gate = self.gate
        if gate is not None and gate.scope == RELEASE:
            return None
        if gate is None or gate.scope is None:
            return ("recorded without the phases it ran (an older build-env): run "
                    "`build-env verify IMAGE` again")
        return gate.partial_reason or "a narrowed run"

    @property
    def family(self) -> str | None:
        gate = self.gate
        return gate.family if gate is not None else None

    @property
    def release(self) -> bool:
        """A passing release verdict at any level: what unlocks a tag, a SIF and a publish
        when the site requires no more than a build verdict."""
        return release_problem(self) is None

    @property
    def gpu(self) -> GpuEvidence:
        return gpu_evidence(self.report, self.family)

    @property
    def level(self) -> str | None:
        """``gpu``, ``build``, or None when this is not a passing release verdict."""
        if release_problem(self) is not None:
            return None
        return GPU if self.gpu.status == PROVEN else BUILD

    def describe(self) -> str:
        """One phrase for summary lines: ``pass, build verdict, gpu: pending (...)``."""
        if self.scope != RELEASE:
            return f"{self.overall}, partial verdict"
        level = self.level
        if level is None:
            return f"{self.overall}"
        gpu = self.gpu
        if gpu.status == NONE:
            return f"{self.overall}, {level} verdict"
        return f"{self.overall}, {level} verdict, gpu: {gpu.describe()}"

    def labels(self) -> dict[str, str]:
        """What the verdict says, as labels (the SIF's; ``org.verl-env.verdict.*``)."""
        level = self.level
        gpu = self.gpu
        out = {LABEL_PREFIX: self.overall if self.scope == RELEASE else f"{self.overall} (partial)",
               f"{LABEL_PREFIX}.level": level or "none",
               f"{LABEL_PREFIX}.gpu": gpu.status if gpu.status != NONE else "none"}
        if gpu.status == PENDING:
            out[f"{LABEL_PREFIX}.gpu.reason"] = gpu.reason
        elif gpu.status == PROVEN:
            out[f"{LABEL_PREFIX}.gpu.evidence"] = gpu.describe().removeprefix("proven on ")
        if self.recorded_at:
            out[f"{LABEL_PREFIX}.recorded"] = self.recorded_at
        return out

    # ----- the one serialisation
    def recorded(self, image_id: str, *, target: str | None, tags: Sequence[str] = (),
                 at: str | None = None, binding: Binding | None = None) -> Verdict:
        """This verdict as recorded for ``image_id`` (now, unless ``at``)."""
        stamp = at or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        return dataclasses.replace(self, image_id=image_id, target=target, tags=tuple(tags),
                                   recorded_at=stamp, declared={}, binding=binding)

    def to_dict(self) -> dict[str, Any]:
        """The record (local file, embedded in a SIF, inside a signed statement)."""
        return {"schema": SCHEMA, "image_id": self.image_id, "recorded_at": self.recorded_at,
                "target": self.target, "family": self.family, "tags": list(self.tags),
                "overall": self.overall, "exit_code": self.exit_code, "scope": self.scope,
                "partial_reason": self.partial_reason, "level": self.level,
                "gpu": self.gpu.to_dict(), "report": self.report,
                **({"binding": self.binding.to_dict()} if self.binding else {})}

    @classmethod
    def from_dict(cls, data: Any) -> Verdict:
        """A record as written by :meth:`to_dict`, or by an older build-env (then partial).
        Raises ValueError when ``data`` is not a verdict record at all."""
        if not isinstance(data, Mapping):
            raise ValueError("the verdict is not a JSON object")
        report = data.get("report")
        code = data.get("exit_code")
        declared = {k: data[k] for k in ("overall", "scope", "level") if data.get(k) is not None}
        tags = data.get("tags")
        return cls(image=str(data.get("image_id") or ""),
                   exit_code=code if isinstance(code, int) else 3,
                   report=dict(report) if isinstance(report, Mapping) else {},
                   image_id=data.get("image_id") if isinstance(data.get("image_id"), str) else None,
                   target=data.get("target") if isinstance(data.get("target"), str) else None,
                   tags=tuple(str(t) for t in tags) if isinstance(tags, list) else (),
                   recorded_at=str(data["recorded_at"]) if data.get("recorded_at") else None,
                   declared=declared, binding=Binding.from_dict(data.get("binding")))


# --------------------------------------------------------------------------- the one rule


def release_problem(verdict: Verdict | None, require: str = BUILD) -> str | None:
    """Why ``verdict`` unlocks no release tag, SIF, publish or signature (None: it does).

    A release needs ``overall: pass`` (the record's, its report's and its exit code), the full
    required phase set of the family (scope ``release``), and, when ``require`` is ``gpu``, GPU
    proof for a family with GPUs (level ``gpu``).
    """
    if verdict is None:
        return "no verdict recorded: run `build-env verify IMAGE` on it"
    overall = verdict.overall
    if overall != "pass":
        return f"overall is {overall!r}, not 'pass'"
    reported = verdict.report.get("overall")
    if reported != "pass":
        return f"the self-test report says overall {reported!r}"
    if verdict.exit_code != 0:
        return f"the self-test exited {verdict.exit_code}"
    if verdict.scope != RELEASE:
        return (f"the verdict is partial ({verdict.partial_reason}); only a full run "
                "(`build-env verify IMAGE` without --phases or narrowing --selftest-args) is a "
                "release verdict")
    declared = verdict.declared.get("scope")
    if declared is not None and declared != RELEASE:
        return f"the record says scope {declared!r} while its report's gate says release"
    gpu = verdict.gpu
    if requirement(require) == GPU and gpu.status != NONE and gpu.status != PROVEN:
        return (f"a build verdict (gpu: {gpu.describe()}) where a GPU verdict is required "
                "(--require gpu): run `build-env verify` on a GPU node (the image, or its SIF)")
    return None


# --------------------------------------------------------------------------- the local record


def state_dir() -> Path:
    return state_home() / "verdicts"


def _path(image_id: str) -> Path:
    return state_dir() / f"{image_id.split(':')[-1]}.json"


def _site_dir(site: str) -> Path:
    return state_dir() / "sites" / hashlib.sha256(site.encode()).hexdigest()[:16]


def record(image_id: str, verdict: Verdict, *, target: str | None,
           tags: Sequence[str] = (), binding: Binding | None = None) -> Verdict:
    """Record ``verdict`` for ``image_id`` (tags: those it carries now); returns the record.
    With ``binding``, the record is also kept among its site's, for that content."""
    stamped = verdict.recorded(image_id, target=target, tags=tags, binding=binding)
    atomic_write_text(_path(image_id), dump(stamped))
    if binding is not None:
        atomic_write_text(_site_dir(binding.site) / _path(image_id).name, dump(stamped))
    return stamped


def bind(image_id: str, verdict: Verdict, binding: Binding) -> None:
    """Keep ``verdict`` (already recorded for ``image_id``) among ``binding``'s site's too: a
    reuse of the same content at another site (the content tag is every input's hash). The
    per-image record, and when it was made, stay as they are."""
    bound = dataclasses.replace(verdict, binding=binding)
    atomic_write_text(_site_dir(binding.site) / _path(image_id).name, dump(bound))


def dump(verdict: Verdict) -> str:
    """The record as JSON text."""
    return json.dumps(verdict.to_dict(), indent=2, sort_keys=True) + "\n"


def lookup(image_id: str) -> Verdict | None:
    try:
        data = json.loads(_path(image_id).read_text())
        return Verdict.from_dict(data)
    except (OSError, ValueError):
        return None


def is_verified(image_id: str, require: str = BUILD) -> bool:
    """Whether ``image_id`` holds a passing release verdict at the required level (a partial
    pass never counts)."""
    return release_problem(lookup(image_id), require) is None


def records(site: str | None = None) -> list[Verdict]:
    """Every local record (``site``: that site's), newest first (unreadable files are left
    out)."""
    found = []
    for path in sorted((state_dir() if site is None else _site_dir(site)).glob("*.json")):
        try:
            found.append(Verdict.from_dict(json.loads(path.read_text())))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda v: v.recorded_at or "", reverse=True)


def latest_for_target(target: str) -> Verdict | None:
    """The newest local verdict recorded for a target of this name, at any site and for any
    content. ``build-env list`` does not use it (:func:`latest_for` does): kept for callers
    that only want the store's history."""
    return next((v for v in records() if v.target == target), None)


def latest_for(content: Binding) -> Verdict | None:
    """The newest local verdict recorded for this site's target with this content (what
    ``build-env list`` shows); never one recorded elsewhere, or for other pins, by its name."""
    return next((v for v in records(content.site)
                 if v.binding is not None and v.binding.same_content(content)), None)


def short(v: Verdict | None) -> str:
    """A table cell: ``gpu``, ``build (gpu pending)``, ``partial``, ``fail``, ``-``."""
    if v is None:
        return "-"
    if v.level is None:
        return "partial" if v.overall == "pass" else v.overall
    if v.gpu.status == PENDING:
        return f"{v.level} (gpu pending)"
    return v.level
