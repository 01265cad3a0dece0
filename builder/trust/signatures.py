"""The offline signature and attestation checks of a SIF with its sidecar: nothing from the
network, nothing from the build host but the public keys.

Hash the file; check every envelope of ``<name>.sif.intoto.jsonl`` (a trusted key signed it, its
subject is this file); require one verdict, one SBOM and one provenance statement; require a
release verdict; compare the verdict and SBOM embedded in the SIF with the attested ones; check
the SIF's native PGP signature when a PGP key is given. Every failure is a TrustError naming the
file, the sidecar line or the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.gate import verdicts
from builder.errors import TrustError
from builder.files import sha256_file
from builder.trust import sbom, sifsig
from builder.trust import statements as st
from builder.trust.keys import load_public
from builder.trust.sign import SBOM_NAME, VERDICT_NAME, sidecar_of
from builder.gate.verdicts import Verdict


@dataclass(kw_only=True)
class Attested:
    """What a checked set of attestations says, a SIF's (:class:`Checked`) or a registry
    reference's (:class:`builder.trust.remote.RefChecked`): who signed, the verdict, the pins
    and SBOM counts, the provenance."""

    keyids: list[str] = field(default_factory=list)
    verdict: Verdict | None = None
    selftest_version: str | None = None
    pins: dict[str, str] = field(default_factory=dict)
    components: dict[str, int] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    def attested_dict(self) -> dict[str, Any]:
        """These fields for ``--json``, in the order both checks print them."""
        return {"keyids": self.keyids, **verdict_fields(self.verdict),
                "selftest_version": self.selftest_version, "pins": self.pins,
                "components": self.components, "provenance": self.provenance}


@dataclass
class Checked(Attested):
    sif: Path
    digest: str
    pgp_fingerprint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"sif": str(self.sif), "digest": self.digest, **self.attested_dict(),
                "pgp_fingerprint": self.pgp_fingerprint}


def verdict_fields(v: Verdict | None) -> dict[str, Any]:
    """What a checked verdict says, for ``--json`` (SIF and registry checks alike)."""
    if v is None:
        return {"target": None, "overall": None, "level": None, "gpu": None}
    return {"target": v.target, "overall": v.overall, "level": v.level,
            "gpu": v.gpu.to_dict()}


def verify_sif(sif: Path, keys: list[Path], pgp: Path | None = None,
               sidecar: Path | None = None, require: str = verdicts.BUILD) -> Checked:
    """The offline check (see the module doc); ``require``: the verdict level demanded."""
    sif = Path(sif)
    if not sif.is_file():
        raise TrustError(f"{sif}: no such file")
    sidecar = Path(sidecar) if sidecar else sidecar_of(sif)
    if not sidecar.is_file():
        raise TrustError(f"{sidecar}: no attestation sidecar beside the SIF (expected "
                         f"{sidecar.name}); the SIF is unsigned or the sidecar was not copied")
    if not keys:
        raise TrustError("no public key given (--key verl-env.pub)")
    public = [load_public(k) for k in keys]
    digest = sha256_file(sif)
    result = Checked(sif, digest)
    found: dict[str, dict[str, Any]] = {}
    lines = sidecar.read_text().splitlines()
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{sidecar}:{n}"
        try:
            envelope = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TrustError(f"{where}: not JSON ({exc.msg})") from None
        opened = st.open_statement(envelope, public, where)
        kind = opened.kind
        _check_subject(opened.subjects, digest, sif, where)
        if kind in found:
            raise TrustError(f"{where}: a second {kind} statement (one of each is expected)")
        if not isinstance(opened.predicate, dict):
            raise TrustError(f"{where}: the {kind} statement has no predicate object")
        found[kind] = opened.predicate
        result.keyids.append(opened.keyid)
    missing = [k for k in ("verdict", "sbom", "provenance") if k not in found]
    if missing:
        raise TrustError(f"{sidecar}: no {', '.join(missing)} statement")
    verdict = st.read_verdict(found["verdict"], f"{sidecar}: the verdict statement")
    problem = verdicts.release_problem(verdict, require)
    if problem:
        raise TrustError(f"{sif}: not a release verdict: {problem}")
    result.verdict = verdict
    result.selftest_version = found["verdict"].get("selftestVersion")
    _check_embedded(sif, found["verdict"]["verdict"], found["sbom"])
    result.pins = sbom.pins_of(found["sbom"])
    result.components = sbom.counts(found["sbom"])
    result.provenance = provenance_summary(found["provenance"])
    if pgp is not None:
        result.pgp_fingerprint = sifsig.verify_group(sif, pgp, 1)
    return result


def _check_subject(got: list[str], digest: str, sif: Path, where: str) -> None:
    if digest.split(":", 1)[1] not in got:
        raise TrustError(f"{where}: subject sha256:{(got or ['none'])[0]} is not this file "
                         f"({digest}): {sif.name} changed after signing, or the sidecar belongs "
                         "to another file")


def _check_embedded(sif: Path, verdict: dict[str, Any], sbom_doc: dict[str, Any]) -> None:
    raw = sifsig.read_sif(sif)
    for name, attested in ((VERDICT_NAME, verdict), (SBOM_NAME, sbom_doc)):
        obj = next((d for d in raw.group(1) if d.name == name), None)
        if obj is None:
            raise TrustError(f"{sif}: no embedded {name} in object group 1")
        try:
            embedded = json.loads(sifsig.read_sif_object(sif, obj))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TrustError(f"{sif}: embedded {name} is not JSON ({exc})") from None
        if embedded != attested:
            raise TrustError(f"{sif}: embedded {name} differs from the attested one")


def provenance_summary(pred: dict[str, Any]) -> dict[str, Any]:
    definition = pred.get("buildDefinition", {}) or {}
    deps = {d.get("name"): d.get("digest") for d in definition.get("resolvedDependencies", [])
            if isinstance(d, dict) and d.get("name") != "base-image"}
    bases = [d.get("uri") or d.get("digest") for d in definition.get("resolvedDependencies", [])
             if isinstance(d, dict) and d.get("name") == "base-image"]
    run = pred.get("runDetails", {}) or {}
    return {"target": (definition.get("externalParameters") or {}).get("target"),
            "dependencies": deps, "base_images": bases,
            "builder": (run.get("builder") or {}).get("version"),
            "host_arch": (definition.get("internalParameters") or {}).get("buildHostArch"),
            "finished": (run.get("metadata") or {}).get("finishedOn")}


def attested_lines(c: Attested) -> list[str]:
    """What a checked set of attestations says (keys, verdict, pins, SBOM, provenance): the lines
    a SIF check and a registry check (:mod:`builder.trust.remote`) share."""
    pins = "  ".join(f"{k}={v}" for k, v in sorted(c.pins.items()))
    p = c.provenance
    v = c.verdict
    assert v is not None  # a check that passed holds its verdict
    return [f"  signed by key {', '.join(sorted({k[:16] for k in c.keyids}))}",
            f"  verdict: {v.overall} (target {v.target}, self-test {c.selftest_version}, "
            f"recorded {v.recorded_at or '?'})",
            f"  level: {v.level}" + ("" if v.gpu.status == "none" else
                                     f"; gpu: {v.gpu.describe()}"),
            f"  pins: {pins or '(none recorded)'}",
            f"  sbom: {c.components.get('pypi', 0)} Python, {c.components.get('deb', 0)} "
            "Debian packages",
            f"  built by build-env {(p.get('builder') or {}).get('build-env')} on "
            f"{p.get('host_arch')} at {p.get('finished')}; bases: "
            f"{', '.join(str(b) for b in p.get('base_images') or []) or '-'}"]


def summary_lines(c: Checked) -> list[str]:
    return [f"{c.sif}: OK  {c.digest}", *attested_lines(c),
            f"  SIF PGP signature: {c.pgp_fingerprint or 'not checked (no --pgp key given)'}"]
