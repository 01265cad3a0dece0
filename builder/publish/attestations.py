"""The signed statements (verdict, SBOM, provenance, and the image's last audit when one is
recorded) of a published image: gathered and checked before anything is pushed
(:func:`prepare_attestations`), then pushed as OCI 1.1 referrers of a manifest (:func:`attest`).

The audit (``build-env audit``, :mod:`builder.audit`) travels when the image has one recorded
locally: its document is the predicate of a fourth statement (``AUDIT_TYPE``), signed with the
same key, a referrer of kind ``audit`` beside the others (tag ``sha256-<hex>.verl-audit``), in
cosign's ``.att`` too. An image never audited is published as before: three statements."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.audit import result as audits
from builder.engine import ContainerEngine, ImageInfo
from builder.errors import PublishError
from builder.gate import verdicts
from builder.publish.transfer import retrying
from builder.registry.api import Client
from builder.trust import dsse, referrers
from builder.trust import statements as st
from builder.trust.keys import keyid, load_private
from builder.trust.sign import envelopes, statement_inputs


@dataclass(frozen=True)
class Attestations:
    """What the signed statements say, gathered (and checked) before anything is pushed."""

    private: Any  # the ECDSA private key
    keyid: str
    verdict: verdicts.Verdict
    sbom: dict[str, Any]
    provenance: Any  # builder.trust.statements.ProvenanceInputs
    audit: dict[str, Any] | None = None  # the image's last `build-env audit` document

    def envelopes(self, subjects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        signed = envelopes(subjects, self.verdict, self.sbom, self.provenance, self.private)
        if self.audit is not None:
            statement = st.statement(subjects, st.AUDIT_TYPE, self.audit)
            signed.append(dsse.sign(st.to_bytes(statement), self.private))
        return signed


def prepare_attestations(engine: ContainerEngine, image: ImageInfo, sign_key: Path,
                         report: Path | None, target: str | None, require: str = verdicts.BUILD, *,
                         verdict: verdicts.Verdict | None = None,
                         sbom_doc: dict[str, Any] | None = None) -> Attestations:
    """The key, a release verdict of this image, the report describing it, its SBOM: every
    refusal happens here, before the first byte is pushed. ``verdict``/``sbom_doc``: what the
    caller already holds (the pipeline), else read and inventoried here."""
    private = load_private(sign_key)
    if report is None:
        raise PublishError("--sign-key needs the build's report.json for the provenance "
                           "statement (--report PATH)", target=target)
    if not Path(report).is_file():
        raise PublishError(f"{report}: no build report (needed for the provenance statement; "
                           "--report PATH)", target=target)
    chosen, sbom_doc, provenance = statement_inputs(report, verdict=verdict, sbom_doc=sbom_doc,
                                                    engine=engine, image_id=image.id,
                                                    what=f"image {image.id[7:19]}",
                                                    require=require)
    audit = audits.lookup(image.id)
    if audit is not None and (audit.get("subject") or {}).get("image_id") != image.id:
        audit = None  # a record under this ID about another image is not this image's audit
    return Attestations(private, keyid(private.public_key()), chosen, sbom_doc, provenance,
                        audit)


def attest(reg: Client, attestations: Attestations, digest: str,
           subjects: list[dict[str, Any]], attempts: int) -> dict[str, Any]:
    """Sign the statements about ``subjects`` (the first names the manifest ``digest``) and push
    them as referrers of that manifest, as the registry serves it."""
    subject = retrying(lambda: referrers.read_subject(reg, digest),
                       f"read back {reg.repo}@{digest}", attempts)
    signed = attestations.envelopes(subjects)  # once: ECDSA signatures are randomised
    return retrying(lambda: referrers.attach(reg, subject, signed),
                    f"attestations of {reg.repo}@{digest}", attempts)
