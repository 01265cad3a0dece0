"""Sign a real SIF, check it offline with ``build-env trust verify``, and refuse every tampering:
a flipped byte, an envelope by another key, a verdict edited to "pass", a missing sidecar."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from builder.errors import TrustError
from builder.files import sha256_file
from builder.sif import format as sif_format
from builder.trust import dsse, sifsig
from builder.trust import statements as st
from builder.trust.keys import KeyFiles, load_private
from builder.trust.sign import sign_sif
from tests.conftest import OUTSIDE, installed_build_env, run_build_env
from builder.gate.verdicts import Verdict
from tests.trust.conftest import CUDA_BUILD_VERDICT, PARTIAL_VERDICT, RELEASE_VERDICT


def _sign_cli(sif: Path, keypair: KeyFiles, report: Path, verdict: Path, sbom: Path,
              pgp: bool = True) -> subprocess.CompletedProcess[str]:
    args = ["trust", "sign", str(sif), "--key", str(keypair.private), "--report", str(report),
            "--verdict", str(verdict), "--sbom", str(sbom)]
    if pgp:
        args += ["--pgp-key", str(keypair.pgp_private)]
    return run_build_env(*args, timeout=300)


def _verify_cli(sif: Path, keypair: KeyFiles, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_build_env("trust", "verify", str(sif), "--key", str(keypair.public),
                         "--pgp", str(keypair.pgp_public), *extra, timeout=300)


@pytest.fixture
def signed(sif: Path, keypair: KeyFiles, report: Path, sbom_doc: dict) -> Path:
    """Signed through the API (what the SIF stage calls); the CLI path is tested below."""
    sign_sif(sif, Verdict.from_dict(RELEASE_VERDICT), sbom_doc,
             st.ProvenanceInputs.from_report(report), keypair.private, keypair.pgp_private)
    return sif


def test_sign_then_verify_offline(sif: Path, keypair: KeyFiles, report: Path,
                                  verdict_file: Path, sbom_file: Path) -> None:
    proc = _sign_cli(sif, keypair, report, verdict_file, sbom_file)
    assert proc.returncode == 0, proc.stderr
    assert f"PGP {keypair.pgp_fingerprint}" in proc.stdout
    signed = sif
    sidecar = signed.with_name(signed.name + ".intoto.jsonl")
    lines = sidecar.read_text().splitlines()
    assert len(lines) == 3
    types = [json.loads(base64.b64decode(json.loads(x)["payload"]))["predicateType"]
             for x in lines]
    assert types == [st.VERDICT_TYPE, st.SBOM_TYPE, st.PROVENANCE_TYPE]
    # SBOM and verdict are inside group 1, the signature is linked to group 1.
    listing = subprocess.run(["siftool", "list", str(signed)], capture_output=True, text=True,
                             check=True).stdout
    assert "SBOM (cyclonedx-json)" in listing and "JSON.Generic" in listing
    assert "Signature (SHA-256)" in listing
    raw = sif_format.read_raw(signed)
    assert [d.name for d in raw.group(1)][-2:] == ["verl-sbom.cdx.json", "verl-verdict.json"]
    # Offline for real: the installed build-env in a network namespace with no interfaces up.
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot enter a network namespace here (unshare -n): offline not proven")
    proc = subprocess.run(["unshare", "-n", str(installed_build_env()), "trust", "verify",
                           str(signed), "--key", str(keypair.public), "--pgp",
                           str(keypair.pgp_public), "--json"], cwd=OUTSIDE, text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["digest"] == sha256_file(signed)
    assert out["overall"] == "pass" and out["selftest_version"] == "0.3.0"
    assert out["pins"] == {"torch": "2.6.0+cpu", "verl": "0.5.0"}
    assert out["components"] == {"pypi": 2, "deb": 1}
    assert out["pgp_fingerprint"] == keypair.pgp_fingerprint
    assert out["provenance"]["dependencies"]["lock"] == {"sha256": "2" * 64}
    human = _verify_cli(signed, keypair)
    assert human.returncode == 0 and "pins: torch=2.6.0+cpu  verl=0.5.0" in human.stdout


def test_flipped_byte_is_refused(signed: Path, keypair: KeyFiles) -> None:
    part = next(d for d in sif_format.read_raw(signed).descriptors if d.datatype == sif_format.DATA_PARTITION)
    with open(signed, "r+b") as f:
        f.seek(part.offset + part.size // 2)
        b = f.read(1)
        f.seek(part.offset + part.size // 2)
        f.write(bytes([b[0] ^ 0x01]))
    proc = _verify_cli(signed, keypair)
    assert proc.returncode == 1
    assert "changed after signing" in proc.stderr and ".intoto.jsonl:1" in proc.stderr
    # The PGP signature alone also catches it, and names the object.
    with pytest.raises(TrustError, match=rf"data of object {part.ident} .* changed"):
        sifsig.verify_group(signed, keypair.pgp_public)


def test_envelope_signed_by_another_key_is_refused(signed: Path, keypair: KeyFiles,
                                                   other_keypair: KeyFiles) -> None:
    sidecar = signed.with_name(signed.name + ".intoto.jsonl")
    lines = sidecar.read_text().splitlines()
    payload = base64.b64decode(json.loads(lines[0])["payload"])  # same statement, other signer
    lines[0] = json.dumps(dsse.sign(payload, load_private(other_keypair.private)))
    sidecar.write_text("\n".join(lines) + "\n")
    proc = _verify_cli(signed, keypair)
    assert proc.returncode == 1
    assert ".intoto.jsonl:1: signed by unknown key(s) " + other_keypair.keyid[:16] in proc.stderr
    # The other key's id with a real key's signature bytes: does not verify either.
    env = json.loads(lines[0])
    env["signatures"][0]["keyid"] = keypair.keyid
    lines[0] = json.dumps(env)
    sidecar.write_text("\n".join(lines) + "\n")
    proc = _verify_cli(signed, keypair)
    assert proc.returncode == 1 and "does not verify" in proc.stderr


def _signed_statement(sif: Path, verdict: dict, key: Path) -> str:
    """A verdict statement as anything holding the key could sign it (no rule applied)."""
    stmt = st.statement([st.subject(sif.name, sha256_file(sif))], st.VERDICT_TYPE,
                        {"verdict": verdict, "selftestVersion": "0.3.0"})
    return json.dumps(dsse.sign(st.to_bytes(stmt), load_private(key)))


def test_verdict_edited_to_pass_is_refused(signed: Path, keypair: KeyFiles) -> None:
    sidecar = signed.with_name(signed.name + ".intoto.jsonl")
    lines = sidecar.read_text().splitlines()
    failed = {**RELEASE_VERDICT, "overall": "fail", "exit_code": 1,
              "report": {**RELEASE_VERDICT["report"], "overall": "fail"}}
    # 1. A genuinely signed failing verdict: refused as not a release verdict.
    lines[0] = _signed_statement(signed, failed, keypair.private)
    sidecar.write_text("\n".join(lines) + "\n")
    proc = _verify_cli(signed, keypair)
    assert proc.returncode == 1 and "not a release verdict: overall is 'fail'" in proc.stderr
    # 2. That verdict's payload edited to say "pass": the signature no longer verifies.
    env = json.loads(lines[0])
    stmt = json.loads(base64.b64decode(env["payload"]))
    stmt["predicate"]["verdict"]["overall"] = "pass"
    stmt["predicate"]["verdict"]["report"]["overall"] = "pass"
    env["payload"] = base64.b64encode(st.to_bytes(stmt)).decode()
    lines[0] = json.dumps(env)
    sidecar.write_text("\n".join(lines) + "\n")
    proc = _verify_cli(signed, keypair)
    assert proc.returncode == 1 and ".intoto.jsonl:1: signature by key" in proc.stderr
    assert "does not verify" in proc.stderr
    # 3. A narrowed (partial) run that passed is not a release verdict either, nor is one whose
    #    top level claims a release while its gate says partial, nor one of an older build-env.
    older = {k: v for k, v in RELEASE_VERDICT.items() if k not in ("scope", "level")}
    older["report"] = {k: v for k, v in RELEASE_VERDICT["report"].items() if k != "gate"}
    for verdict, needle in ((PARTIAL_VERDICT, "partial (phases gpu, collective not run)"),
                            ({**PARTIAL_VERDICT, "scope": "release", "level": "gpu"}, "partial"),
                            (older, "older build-env")):
        lines[0] = _signed_statement(signed, verdict, keypair.private)
        sidecar.write_text("\n".join(lines) + "\n")
        proc = _verify_cli(signed, keypair)
        assert proc.returncode == 1 and "not a release verdict" in proc.stderr, proc.stderr
        assert needle in proc.stderr


def test_embedded_verdict_edited_is_refused_by_the_pgp_signature(
        signed: Path, keypair: KeyFiles) -> None:
    obj = next(d for d in sif_format.read_raw(signed).group(1) if d.name == "verl-verdict.json")
    data = sif_format.read_object(signed, obj)
    edited = data.replace(b'"exit_code": 0', b'"exit_code": 9')
    assert edited != data and len(edited) == len(data)
    with open(signed, "r+b") as f:
        f.seek(obj.offset)
        f.write(edited)
    with pytest.raises(TrustError, match=rf"data of object {obj.ident} \(verl-verdict.json\)"):
        sifsig.verify_group(signed, keypair.pgp_public)
    # ... and the sidecar subject no longer matches the file.
    assert _verify_cli(signed, keypair).returncode == 1


def test_missing_pieces_and_wrong_keys_are_named(signed: Path, keypair: KeyFiles,
                                                 other_keypair: KeyFiles, tmp_path: Path) -> None:
    sidecar = signed.with_name(signed.name + ".intoto.jsonl")
    lines = sidecar.read_text().splitlines()
    sidecar.write_text("\n".join(lines[:2]) + "\n")
    proc = _verify_cli(signed, keypair)
    assert proc.returncode == 1 and "no provenance statement" in proc.stderr
    sidecar.write_text("\n".join(lines) + "\n")
    proc = run_build_env("trust", "verify", str(signed), "--key", str(keypair.public), "--pgp",
                         str(other_keypair.pgp_public), timeout=300)
    assert proc.returncode == 1 and f"not {other_keypair.pgp_fingerprint}" in proc.stderr
    moved = tmp_path / "elsewhere" / "image.sif"
    moved.parent.mkdir()
    shutil.copyfile(signed, moved)
    proc = _verify_cli(moved, keypair)
    assert proc.returncode == 1 and "no attestation sidecar" in proc.stderr


def test_unsigned_groups_fail_the_pgp_check(sif: Path, keypair: KeyFiles, report: Path,
                                            verdict_file: Path, sbom_file: Path) -> None:
    """Signed without a PGP key: DSSE checks pass, but a --pgp check finds no signature."""
    assert _sign_cli(sif, keypair, report, verdict_file, sbom_file, pgp=False).returncode == 0
    assert run_build_env("trust", "verify", str(sif), "--key", str(keypair.public),
                         timeout=300).returncode == 0
    proc = _verify_cli(sif, keypair)
    assert proc.returncode == 1 and "no PGP signature for object group 1" in proc.stderr


def test_sign_refuses_a_failed_verdict_and_leaves_the_sif_alone(
        sif: Path, keypair: KeyFiles, report: Path, sbom_file: Path, tmp_path: Path) -> None:
    before = sif.read_bytes()
    bad = tmp_path / "failed.json"
    bad.write_text(json.dumps({**RELEASE_VERDICT, "overall": "incomplete"}))
    proc = _sign_cli(sif, keypair, report, bad, sbom_file)
    assert proc.returncode == 1 and "refusing to sign: overall is 'incomplete'" in proc.stderr
    assert sif.read_bytes() == before
    assert not sif.with_name(sif.name + ".intoto.jsonl").exists()


def test_a_partial_pass_is_refused_by_sign_and_by_verify(
        sif: Path, keypair: KeyFiles, report: Path, sbom_file: Path, sbom_doc: dict,
        tmp_path: Path) -> None:
    """One release rule: `trust sign --verdict` refuses a partial pass, and a partial pass
    signed anyway (by the API beneath the rule) is refused by `trust verify`."""
    before = sif.read_bytes()
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(PARTIAL_VERDICT))
    proc = _sign_cli(sif, keypair, report, partial, sbom_file)
    assert proc.returncode == 1 and "refusing to sign: the verdict is partial (phases gpu, " \
        "collective not run)" in proc.stderr, proc.stderr
    assert sif.read_bytes() == before and not sif.with_name(sif.name + ".intoto.jsonl").exists()
    with pytest.raises(TrustError, match="refusing to sign: the verdict is partial"):
        sign_sif(sif, Verdict.from_dict(PARTIAL_VERDICT), sbom_doc,
                 st.ProvenanceInputs.from_report(report), keypair.private)
    # signed beneath the rule: a verdict statement written by hand with the trusted key
    sign_sif(sif, Verdict.from_dict(RELEASE_VERDICT), sbom_doc,
             st.ProvenanceInputs.from_report(report), keypair.private)
    sidecar = sif.with_name(sif.name + ".intoto.jsonl")
    lines = sidecar.read_text().splitlines()
    lines[0] = _signed_statement(sif, PARTIAL_VERDICT, keypair.private)
    sidecar.write_text("\n".join(lines) + "\n")
    proc = run_build_env("trust", "verify", str(sif), "--key", str(keypair.public), timeout=300)
    assert proc.returncode == 1
    assert "not a release verdict: the verdict is partial" in proc.stderr, proc.stderr


def test_a_build_verdict_says_gpu_pending_and_a_site_can_require_gpu(
        sif: Path, keypair: KeyFiles, report: Path, sbom_file: Path, tmp_path: Path) -> None:
    """A CUDA image gated on a GPU-less host: signed as a build verdict whose GPU phases are
    pending, printed so by `trust verify`, and refused where a GPU verdict is required."""
    data = json.loads(report.read_text())
    data["target"] = "cuda-x86_64"
    report.write_text(json.dumps(data))
    verdict = tmp_path / "cuda.json"
    verdict.write_text(json.dumps(CUDA_BUILD_VERDICT))
    before = sif.read_bytes()
    proc = run_build_env("trust", "sign", str(sif), "--key", str(keypair.private), "--report",
                         str(report), "--verdict", str(verdict), "--sbom", str(sbom_file),
                         "--require", "gpu", timeout=300)
    assert proc.returncode == 1 and "refusing to sign: a build verdict (gpu: pending" in \
        proc.stderr and "--require gpu" in proc.stderr, proc.stderr
    assert sif.read_bytes() == before
    proc = run_build_env("trust", "sign", str(sif), "--key", str(keypair.private), "--report",
                         str(report), "--verdict", str(verdict), "--sbom", str(sbom_file),
                         timeout=300)
    assert proc.returncode == 0, proc.stderr
    human = run_build_env("trust", "verify", str(sif), "--key", str(keypair.public),
                          timeout=300)
    assert human.returncode == 0, human.stderr
    assert "level: build; gpu: pending (no GPU where the gate ran: the engine's host shows 0 " \
        "nvidia GPU(s) under /dev)" in human.stdout, human.stdout
    out = json.loads(run_build_env("trust", "verify", str(sif), "--key", str(keypair.public),
                                   "--json", timeout=300).stdout)
    assert out["level"] == "build" and out["gpu"]["status"] == "pending"
    embedded = next(d for d in sif_format.read_raw(sif).group(1) if d.name == "verl-verdict.json")
    assert json.loads(sif_format.read_object(sif, embedded))["gpu"]["status"] == "pending"
    strict = run_build_env("trust", "verify", str(sif), "--key", str(keypair.public),
                           "--require", "gpu", timeout=300)
    assert strict.returncode == 1
    assert "not a release verdict: a build verdict (gpu: pending" in strict.stderr
    env_strict = run_build_env("trust", "verify", str(sif), "--key", str(keypair.public),
                               timeout=300, env={"VERL_ENV_REQUIRE": "gpu"})
    assert env_strict.returncode == 1 and "--require gpu" in env_strict.stderr


def test_sign_failure_after_siftool_restores_the_sif(
        sif: Path, keypair: KeyFiles, report: Path, sbom_doc: dict,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The SBOM and verdict objects are really added; the signing step then fails."""
    before = sif.read_bytes()

    def boom(*_a: object, **_k: object) -> str:
        assert len(sif_format.read_raw(sif).group(1)) == 4  # both objects were added for real
        raise TrustError("injected failure")

    monkeypatch.setattr(sifsig, "sign_group", boom)
    with pytest.raises(TrustError, match="injected failure"):
        sign_sif(sif, Verdict.from_dict(RELEASE_VERDICT), sbom_doc,
                 st.ProvenanceInputs.from_report(report), keypair.private, keypair.pgp_private)
    assert sif.read_bytes() == before
    assert not sif.with_name(sif.name + ".intoto.jsonl").exists()


def test_signing_twice_is_refused(signed: Path, keypair: KeyFiles, report: Path,
                                  verdict_file: Path, sbom_file: Path) -> None:
    proc = _sign_cli(signed, keypair, report, verdict_file, sbom_file)
    assert proc.returncode == 1 and "already carries" in proc.stderr
