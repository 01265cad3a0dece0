"""Sign a SIF: SBOM and verdict into object group 1, the native PGP signature, then the sidecar
``<name>.sif.intoto.jsonl`` (one DSSE envelope a line: verdict, SBOM, provenance) whose subject
is the final file's sha256.

Nothing half-done: everything that can fail before the file changes is checked first, and if
adding an object fails the SIF's head (header and descriptor table) and length are restored.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.gate import verdicts
from builder.engine import ContainerEngine, Engine
from builder.errors import TrustError
from builder.files import atomic_write_text, sha256_file
from builder.sif import format as sif_format
from builder.trust import dsse, sbom, sifsig
from builder.trust import statements as st
from builder.trust.keys import keyid, load_pgp, load_private
from builder.gate.verdicts import Verdict

VERDICT_NAME, SBOM_NAME = "verl-verdict.json", "verl-sbom.cdx.json"
HEAD_BYTES = 4096 + 48 * sif_format.DESCRIPTOR.size  # header page + descriptor table


@dataclass(frozen=True)
class Signed:
    sif: Path
    sidecar: Path
    digest: str  # sha256:<hex> of the signed file
    keyid: str
    pgp_fingerprint: str | None


def sidecar_of(sif: Path) -> Path:
    return sif.with_name(sif.name + ".intoto.jsonl")


def sign_sif(sif: Path, verdict: Verdict, sbom: dict[str, Any],
             provenance: st.ProvenanceInputs, key: Path, pgp_key: Path | None = None,
             require: str = verdicts.BUILD) -> Signed:
    """Embed ``sbom`` and ``verdict`` in ``sif`` (group 1), PGP-sign group 1 with ``pgp_key``,
    and write the signed sidecar with ``key``. Refuses a verdict that is not a release one at
    the ``require`` level (the one release rule, :func:`builder.gate.verdicts.release_problem`)."""
    sif = Path(sif)
    problem = verdicts.release_problem(verdict, require)
    if problem:
        raise TrustError(f"{sif}: refusing to sign: {problem}")
    private = load_private(key)
    if pgp_key is not None:
        load_pgp(pgp_key, private=True)
    raw = sifsig.read_sif(sif)
    if not raw.group(1):
        raise TrustError(f"{sif}: has no object group 1 (not a SIF this tool can sign)")
    taken = {d.name for d in raw.group(1)} & {VERDICT_NAME, SBOM_NAME}
    if taken or raw.signatures_of(1):
        raise TrustError(f"{sif}: already carries {', '.join(sorted(taken)) or 'a signature'}; "
                         "sign a fresh SIF")
    with open(sif, "rb") as f:
        head = f.read(HEAD_BYTES)
    length = sif.stat().st_size
    fpr = None
    try:
        with tempfile.TemporaryDirectory(prefix="verl-env-sign-") as tmp:
            v, s = Path(tmp) / VERDICT_NAME, Path(tmp) / SBOM_NAME
            v.write_text(json.dumps(verdict.to_dict(), sort_keys=True, indent=1) + "\n")
            s.write_text(json.dumps(sbom, sort_keys=True) + "\n")
            sifsig.siftool_add(sif, s, "--datatype", "9", "--sbomformat", "cyclonedx-json",
                               "--groupid", "1", "--filename", SBOM_NAME)
            sifsig.siftool_add(sif, v, "--datatype", "6", "--groupid", "1",
                               "--filename", VERDICT_NAME)
        if pgp_key is not None:
            fpr = sifsig.sign_group(sif, pgp_key, 1)
    except BaseException:
        _restore(sif, head, length)
        raise
    digest = sha256_file(sif)
    subjects = [st.subject(sif.name, digest)]
    lines = [json.dumps(e, sort_keys=True, separators=(",", ":"))
             for e in envelopes(subjects, verdict, sbom, provenance, private)]
    sidecar = sidecar_of(sif)
    atomic_write_text(sidecar, "\n".join(lines) + "\n")
    return Signed(sif, sidecar, digest, keyid(private.public_key()), fpr)


def statement_inputs(report: Path, *, verdict: Verdict | dict[str, Any] | None = None,
                     sbom_doc: dict[str, Any] | None = None, engine: ContainerEngine | None = None,
                     image_id: str | None = None, what: str | None = None,
                     require: str = verdicts.BUILD
                     ) -> tuple[Verdict, dict[str, Any], st.ProvenanceInputs]:
    """What the three statements say, from a build's ``report.json``: provenance from the
    report, the verdict from the local record of its image (unless given, as a :class:`Verdict`
    or its record; it must be a release verdict), the SBOM from an inventory of the image
    through ``engine`` (unless given; connected on demand). A caller that signs twice (the
    pipeline: the SIF, then the published image) calls this once and hands the result on. ``image_id``: the image being attested, which the report must
    describe. ``what`` names the thing to be signed in a refusal; ``require``: the verdict level
    a signature needs."""
    provenance = st.ProvenanceInputs.from_report(report)
    if image_id and provenance.image_id and provenance.image_id != image_id:
        raise TrustError(f"{report}: describes image {provenance.image_id[:19]}, not "
                         f"{image_id[:19]}")
    image = image_id or provenance.image_id
    if verdict is None:
        if not image:
            raise TrustError(f"{report}: no image_id; give the verdict")
        chosen = verdicts.lookup(image)
        if chosen is None:
            raise TrustError(f"no local verdict for image {image[:19]}")
    elif isinstance(verdict, Verdict):
        chosen = verdict
    else:
        try:
            chosen = Verdict.from_dict(verdict)
        except ValueError as exc:
            raise TrustError(f"the verdict: {exc}") from None
    if image and chosen.image_id and chosen.image_id != image:
        raise TrustError(f"the verdict is about image {chosen.image_id[:19]}, not "
                         f"{str(image)[:19]}")
    problem = verdicts.release_problem(chosen, require)
    if problem:
        raise TrustError(f"{what or 'image ' + str(image)[:19]}: refusing to sign: {problem}")
    if sbom_doc is None:
        if not image:
            raise TrustError(f"{report}: no image_id; give the SBOM")
        if engine is None:
            engine = Engine.connect()
        inventory = sbom.collect(engine, image)
        sbom_doc = sbom.build(inventory, name=provenance.target, version=image,
                              pins=provenance.pins)
    return chosen, sbom_doc, provenance


def envelopes(subjects: list[dict[str, Any]], verdict: Verdict, sbom_doc: dict[str, Any],
              provenance: st.ProvenanceInputs, private: Any) -> list[dict[str, Any]]:
    """The three signed DSSE envelopes (verdict, SBOM, provenance) about ``subjects``."""
    return [dsse.sign(st.to_bytes(st.statement(subjects, ptype, predicate)), private)
            for ptype, predicate in ((st.VERDICT_TYPE, st.verdict_predicate(verdict)),
                                     (st.SBOM_TYPE, sbom_doc),
                                     (st.PROVENANCE_TYPE, st.provenance_predicate(provenance)))]


def sign_from_report(sif: Path, report: Path, key: Path, pgp_key: Path | None = None, *,
                     verdict: Verdict | dict[str, Any] | None = None,
                     sbom_doc: dict[str, Any] | None = None, engine: ContainerEngine | None = None,
                     require: str = verdicts.BUILD) -> Signed:
    """The whole signing step from a build's ``report.json`` (see :func:`statement_inputs`)."""
    load_private(key)  # fail before the (slower) inventory
    if pgp_key is not None:
        load_pgp(pgp_key, private=True)
    chosen, sbom_doc, provenance = statement_inputs(report, verdict=verdict, sbom_doc=sbom_doc,
                                                    engine=engine, what=str(sif),
                                                    require=require)
    return sign_sif(sif, chosen, sbom_doc, provenance, key, pgp_key, require)


def _restore(sif: Path, head: bytes, length: int) -> None:
    """Undo ``siftool add``: it appends data and rewrites only the head."""
    fd = os.open(sif, os.O_WRONLY)
    try:
        os.pwrite(fd, head, 0)
        os.ftruncate(fd, length)
    finally:
        os.close(fd)
