"""in-toto Statement v1 for the three things that travel with an image or SIF: the gate's
verdict (a predicate of our own), the SBOM (CycloneDX 1.6) and build provenance (SLSA v1)."""

from __future__ import annotations

import datetime
import json
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder import __version__
from builder.errors import TrustError
from builder.files import sha256_file
from builder.trust import dsse
from builder.gate.verdicts import Verdict

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
VERDICT_TYPE = "https://verl-env.dev/verification/v1"
SBOM_TYPE = "https://cyclonedx.org/bom"
PROVENANCE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://verl-env.dev/build/v1"
BUILDER_ID = "https://verl-env.dev/build-env"
CLUSTER_TYPE = "https://verl-env.dev/cluster-verification/v1"
AUDIT_TYPE = "https://verl-env.dev/audit/v1"  # predicate: a `build-env audit` document
KINDS = {VERDICT_TYPE: "verdict", SBOM_TYPE: "sbom", PROVENANCE_TYPE: "provenance",
         CLUSTER_TYPE: "cluster", AUDIT_TYPE: "audit"}


def subject(name: str, digest: str) -> dict[str, Any]:
    """``digest`` as ``sha256:<hex>``."""
    alg, _, value = digest.partition(":")
    if not value:
        raise TrustError(f"subject {name}: digest {digest!r} is not ALG:HEX")
    return {"name": name, "digest": {alg: value}}


def statement(subjects: list[dict[str, Any]], predicate_type: str,
              predicate: dict[str, Any]) -> dict[str, Any]:
    return {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": predicate_type,
            "predicate": predicate}


def to_bytes(stmt: dict[str, Any]) -> bytes:
    return json.dumps(stmt, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Opened:
    """A signed in-toto statement, opened: who signed it, what it says and what it is about."""

    keyid: str  # the trusted key whose signature verified
    statement: dict[str, Any]
    predicate_type: str
    kind: str  # verdict | sbom | provenance | cluster | audit (KINDS)
    subjects: list[str]  # the sha256 hex digests its subjects name

    @property
    def predicate(self) -> Any:
        return self.statement.get("predicate")


def subject_digests(stmt: dict[str, Any]) -> list[str]:
    """The sha256 hex digests a statement's subjects name."""
    subjects = stmt.get("subject")
    if not isinstance(subjects, list):
        return []
    return [str(s.get("digest", {}).get("sha256")) for s in subjects
            if isinstance(s, dict) and isinstance(s.get("digest"), dict)]


def open_statement(envelope: Any, keys: list[Any], where: str) -> Opened:
    """The one opener of a DSSE envelope (a parsed JSON object): one signature verifies with one
    of ``keys``, the payload is an in-toto Statement v1 of a predicate type we know. TrustError
    naming ``where`` otherwise."""
    verified = dsse.verify(envelope, keys, where)
    stmt = dsse.statement_of(verified, where)
    if stmt.get("_type") != STATEMENT_TYPE:
        raise TrustError(f"{where}: _type {stmt.get('_type')!r} is not {STATEMENT_TYPE}")
    ptype = stmt.get("predicateType")
    kind = KINDS.get(ptype) if isinstance(ptype, str) else None
    if kind is None or not isinstance(ptype, str):
        raise TrustError(f"{where}: unknown predicateType {ptype!r}")
    return Opened(verified.keyid, stmt, ptype, kind, subject_digests(stmt))


def verdict_predicate(verdict: Verdict) -> dict[str, Any]:
    """The verdict record (:meth:`builder.gate.verdicts.Verdict.to_dict`, the one serialisation),
    with its level, the self-test and builder versions beside it."""
    return {"verdict": verdict.to_dict(), "level": verdict.level,
            "gpu": verdict.gpu.status, "selftestVersion": verdict.report.get("selftest_version"),
            "builderVersion": __version__}


def read_verdict(predicate: Any, where: str) -> Verdict:
    """The verdict of a verdict statement's predicate (TrustError naming ``where``)."""
    raw = predicate.get("verdict") if isinstance(predicate, dict) else None
    try:
        return Verdict.from_dict(raw)
    except ValueError as exc:
        raise TrustError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class ProvenanceInputs:
    """What the build knew; every digest as ``sha256:<hex>``."""

    target: str
    matrix_hash: str
    lock_hash: str
    dockerfile_digest: str
    base_images: tuple[str, ...]  # resolved identities (name@sha256:... or sha256:<image id>)
    content_hash: str = ""
    image_id: str = ""
    pins: dict[str, str] = field(default_factory=dict)
    override: bool = False
    started: str = ""
    finished: str = ""
    builder_version: str = __version__
    host_arch: str = field(default_factory=platform.machine)

    @classmethod
    def from_report(cls, report_path: Path) -> ProvenanceInputs:
        """From a pipeline ``report.json`` (``build/<target>/report.json``) and the rendered
        Dockerfile it points at."""
        try:
            report = json.loads(Path(report_path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise TrustError(f"{report_path}: cannot read the build report ({exc})") from None
        missing = [k for k in ("target", "matrix_hash", "lock_hash") if not report.get(k)]
        if missing:
            raise TrustError(f"{report_path}: the build report lacks {', '.join(missing)}")
        context = (report.get("stages", {}).get("render", {}) or {}).get("context")
        dockerfile = Path(context) / "Dockerfile" if context else None
        if dockerfile is None or not dockerfile.is_file():
            raise TrustError(f"{report_path}: stages.render.context has no Dockerfile "
                             f"({dockerfile}); provenance needs the rendered Dockerfile")
        stamp = datetime.datetime.fromtimestamp(Path(report_path).stat().st_mtime,
                                                datetime.timezone.utc)
        return cls(target=report["target"], matrix_hash=report["matrix_hash"],
                   lock_hash=report["lock_hash"],
                   dockerfile_digest=sha256_file(dockerfile),
                   base_images=tuple(report.get("bases") or ()),
                   content_hash=report.get("content_hash") or "",
                   image_id=report.get("image_id") or "", pins=dict(report.get("pins") or {}),
                   override=bool(report.get("override")),
                   finished=stamp.isoformat(timespec="seconds").replace("+00:00", "Z"))


def _digest(value: str) -> dict[str, str]:
    alg, _, hexpart = value.rpartition("@")[-1].partition(":")
    return {alg: hexpart} if hexpart else {}


def provenance_predicate(p: ProvenanceInputs) -> dict[str, Any]:
    """SLSA provenance v1 (https://slsa.dev/spec/v1.0/provenance)."""
    deps: list[dict[str, Any]] = [
        {"name": "Dockerfile", "digest": _digest(p.dockerfile_digest)},
        {"name": "lock", "digest": _digest(p.lock_hash)},
        {"name": "matrix-entry", "digest": _digest(p.matrix_hash)},
    ]
    for base in p.base_images:
        entry: dict[str, Any] = {"name": "base-image", "digest": _digest(base)}
        if "@" in base:
            entry["uri"] = "docker://" + base.split("@")[0]
        deps.append(entry)
    metadata: dict[str, Any] = {}
    if p.content_hash:
        metadata["invocationId"] = p.content_hash
    if p.started:
        metadata["startedOn"] = p.started
    if p.finished:
        metadata["finishedOn"] = p.finished
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"target": p.target, "override": p.override, "pins": p.pins},
            "internalParameters": {"buildHostArch": p.host_arch, "imageId": p.image_id},
            "resolvedDependencies": deps,
        },
        "runDetails": {"builder": {"id": BUILDER_ID, "version": {"build-env": p.builder_version}},
                       "metadata": metadata},
    }
