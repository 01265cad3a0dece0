"""The audit travels: publish signs the image's last recorded audit as a fourth statement (kind
``audit``) beside the verdict, SBOM and provenance; ``status`` and ``trust verify`` of the
registry reference show its counts and database date. The statement logic runs here; the real
registry round trip is marked ``registry``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from builder.audit import result as audits
from builder.engine import ImageInfo
from builder.gate.verdicts import Verdict
from builder.publish import push as publish
from builder.publish.attestations import prepare_attestations
from builder.registry.api import Client
from builder.trust import keys
from builder.trust import statements as st
from tests.conftest import run_build_env
from tests.publish.conftest import RegistryServer, registry, registry_factory  # noqa: F401
from tests.trust.conftest import (RELEASE_VERDICT, base_sif, keypair, report,  # noqa: F401
                                  sbom_doc, sif)

IMAGE = RELEASE_VERDICT["image_id"]


def _doc(image_id: str = IMAGE) -> dict[str, Any]:
    return {"schema": audits.SCHEMA, "audited_at": "2026-06-01T00:00:00Z",
            "subject": {"reference": "verl-env:cpu-x86_64", "image_id": image_id},
            "database": {"path": "/m/all.zip", "form": "zip", "advisories": 7, "withdrawn": 0,
                         "newest_modified": "2026-05-31T12:00:00Z",
                         "file_mtime": "2026-05-31T13:00:00Z"},
            "distributions": 42, "counts": {"LOW": 0, "MODERATE": 1, "HIGH": 2, "CRITICAL": 0,
                                            "UNKNOWN": 0},
            "hits": [], "unevaluated": []}


def _prepare(keypair: keys.KeyFiles, report: Path, sbom_doc: dict) -> Any:
    """The attestations of the image, verdict and SBOM given (no engine is asked)."""
    return prepare_attestations(None, ImageInfo(id=IMAGE),  # type: ignore[arg-type]
                                keypair.private, report, None,
                                verdict=Verdict.from_dict(RELEASE_VERDICT), sbom_doc=sbom_doc)


def test_the_recorded_audit_of_the_image_is_signed_beside_the_three(
        keypair: keys.KeyFiles, report: Path, sbom_doc: dict, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    subjects = [st.subject("r/x", "sha256:" + "c" * 64)]
    assert _prepare(keypair, report, sbom_doc).audit is None  # never audited: three
    assert len(_prepare(keypair, report, sbom_doc).envelopes(subjects)) == 3
    audits.record(IMAGE, _doc())
    att = _prepare(keypair, report, sbom_doc)
    signed = att.envelopes(subjects)
    assert len(signed) == 4
    opened = st.open_statement(signed[3], [keys.load_public(keypair.public)], "test")
    assert opened.kind == "audit" and opened.predicate == _doc()
    assert opened.subjects == ["c" * 64]


def test_an_audit_recorded_about_another_image_does_not_travel(
        keypair: keys.KeyFiles, report: Path, sbom_doc: dict, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    audits.record(IMAGE, _doc(image_id="sha256:" + "9" * 64))
    assert _prepare(keypair, report, sbom_doc).audit is None


@pytest.mark.registry
def test_status_of_the_reference_shows_the_audit_counts_and_database_date(
        registry: RegistryServer, sif: Path, keypair: keys.KeyFiles, report: Path,  # noqa: F811
        sbom_doc: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    audits.record(IMAGE, _doc())
    att = _prepare(keypair, report, sbom_doc)
    reg = Client(registry.host, "verl-env/audited", "http")
    blob = publish.sha256_file(sif)
    digest, _ = publish.push_sif(sif, reg, "cpu-sif", 2, blob=blob)
    pushed = publish.attest(reg, att, digest,
                            [st.subject(f"oras://{registry.host}/verl-env/audited", digest),
                             st.subject(sif.name, blob)], 2)
    assert "audit" in {r["kind"] for r in pushed["referrers"]}
    ref = f"oras://{registry.host}/verl-env/audited@{digest}"
    proc = run_build_env("status", ref, "--key", str(keypair.public), timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if " audit " in x)
    assert "3 hits (1 MODERATE, 2 HIGH)" in line and "2026-05-31T12:00:00Z" in line
    doc = json.loads(run_build_env("status", ref, "--key", str(keypair.public), "--json",
                                   timeout=120).stdout)
    assert [e["kind"] for e in doc["sifs"][ref] if e["kind"] == "audit"] == ["audit"]
    verified = json.loads(run_build_env("trust", "verify", ref, "--key", str(keypair.public),
                                        "--json", timeout=120).stdout)
    assert verified["audit"]["database"]["newest_modified"] == "2026-05-31T12:00:00Z"


def test_status_entries_of_a_reference_carry_the_signed_audit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``status`` lists for a reference whose referrers verified with an audit among them
    (the referrer check itself is the registry test above)."""
    from builder.publish import status
    from builder.trust import remote
    from builder.commands.status import _entry_lines

    checked = remote.RefChecked("r/x@sha256:" + "c" * 64, "sha256:" + "c" * 64, "referrers API",
                                verdict=Verdict.from_dict(RELEASE_VERDICT), audit=_doc())
    monkeypatch.setattr(status.remote, "verify_reference", lambda *a, **k: checked)
    entries = status.reference_entries("r/x:tag", [], False)
    audit = next(e for e in entries if e.kind == "audit")
    assert audit.recorded_at == "2026-06-01T00:00:00Z"
    line = _entry_lines([audit], "  ")[0]
    assert "3 hits (1 MODERATE, 2 HIGH) in 42 distributions" in line
    assert "OSV database of 2026-05-31T12:00:00Z" in line
