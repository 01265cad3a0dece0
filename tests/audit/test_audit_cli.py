"""``build-env audit`` through the installed CLI on a directory tree (a root file system the test
makes) and an OSV database the test makes: the hits listed, the database date printed, --json
valid against its schema, --fail-on's exit codes, bad --osv input."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from builder.audit.result import SCHEMA_FILE
from tests.audit.conftest import MODIFIED, advisory, dist_info, ecosystem, write_db
from tests.conftest import run_build_env


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    site = root / "opt/venv/lib/python3.12/site-packages"
    dist_info(site, "requests", "2.28.1")
    dist_info(site, "PyYAML", "5.3")
    dist_info(site, "urllib3", "2.2.0")
    dist_info(root / "usr/lib/python3/dist-packages", "jinja2", "3.1.2")
    return root


def _advisories() -> list[dict]:
    return [
        advisory("GHSA-j8r2-6x86-q33q", "requests", aliases=["CVE-2023-32681"],
                 ranges=ecosystem({"introduced": "2.3.0"}, {"fixed": "2.31.0"}),
                 database_specific={"severity": "MODERATE"}),
        advisory("PYSEC-2024-1", "Jinja2", versions=["3.1.2"],
                 severity=[{"type": "CVSS_V3",
                            "score": "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H"}]),
        advisory("GHSA-last", "pyyaml", ranges=ecosystem({"introduced": "0"},
                                                         {"last_affected": "5.3"}),
                 database_specific={"severity": "HIGH"}),
        advisory("GHSA-fixed-before", "urllib3",
                 ranges=ecosystem({"introduced": "0"}, {"fixed": "1.26.18"})),
        advisory("GHSA-withdrawn", "urllib3", ranges=ecosystem({"introduced": "0"}),
                 withdrawn="2025-01-01T00:00:00Z"),
        advisory("GHSA-absent", "django", ranges=ecosystem({"introduced": "0"}),
                 modified="2026-05-06T07:08:09Z"),
    ]


@pytest.mark.parametrize("form", ["zip", "directory"])
def test_audit_lists_exactly_the_matching_advisories(rootfs: Path, tmp_path: Path,
                                                     form: str) -> None:
    db = write_db(tmp_path, _advisories(), form)
    proc = run_build_env("audit", str(rootfs), "--osv", str(db), "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, json.loads(SCHEMA_FILE.read_text()))
    assert doc["schema"] == "verl-env/audit/v1"
    got = {(h["id"], h["package"], h["version"], h["severity"]) for h in doc["hits"]}
    assert got == {("GHSA-j8r2-6x86-q33q", "requests", "2.28.1", "MODERATE"),
                   ("PYSEC-2024-1", "jinja2", "3.1.2", "CRITICAL"),
                   ("GHSA-last", "PyYAML", "5.3", "HIGH")}
    req = next(h for h in doc["hits"] if h["package"] == "requests")
    assert req["aliases"] == ["CVE-2023-32681"] and req["fixed"] == ["2.31.0"]
    assert req["path"].startswith("/opt/venv/lib/python3.12/site-packages/")
    assert doc["database"]["newest_modified"] == "2026-05-06T07:08:09Z"
    assert doc["database"]["form"] == form and doc["database"]["withdrawn"] == 1
    assert doc["distributions"] == 4 and doc["counts"]["HIGH"] == 1


def test_the_text_names_each_hit_and_the_database_date(rootfs: Path, tmp_path: Path) -> None:
    db = write_db(tmp_path, _advisories())
    proc = run_build_env("audit", str(rootfs), "--osv", str(db), timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "newest modified 2026-05-06T07:08:09Z" in lines[1]
    hit = next(x for x in lines if "GHSA-j8r2-6x86-q33q" in x)
    assert "CVE-2023-32681" in hit and "requests 2.28.1" in hit and "2.31.0" in hit
    assert "GHSA-withdrawn" not in proc.stdout and "GHSA-fixed-before" not in proc.stdout


def test_no_known_vulnerabilities_is_dated(tmp_path: Path) -> None:
    root = tmp_path / "clean"
    dist_info(root / "usr/lib/python3/dist-packages", "requests", "2.32.3")
    db = write_db(tmp_path, _advisories()[:1])
    proc = run_build_env("audit", str(root), "--osv", str(db), "--fail-on", "LOW", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"no known vulnerabilities as of {MODIFIED}" in proc.stdout


@pytest.mark.parametrize("threshold,code", [("LOW", 1), ("MODERATE", 1), ("HIGH", 1),
                                             ("CRITICAL", 1)])
def test_fail_on_exits_1_at_or_above(rootfs: Path, tmp_path: Path, threshold: str,
                                     code: int) -> None:
    db = write_db(tmp_path, _advisories())
    proc = run_build_env("audit", str(rootfs), "--osv", str(db), "--fail-on", threshold,
                         "--json", timeout=300)
    assert proc.returncode == code, proc.stderr
    failing = {"LOW": 3, "MODERATE": 3, "HIGH": 2, "CRITICAL": 1}[threshold]
    assert json.loads(proc.stdout)["failing"] == failing


def test_fail_on_below_every_hit_passes(tmp_path: Path) -> None:
    root = tmp_path / "r"
    dist_info(root / "usr/lib/python3/dist-packages", "requests", "2.28.1")
    db = write_db(tmp_path, _advisories())
    assert run_build_env("audit", str(root), "--osv", str(db), "--fail-on", "HIGH",
                         timeout=300).returncode == 0
    assert run_build_env("audit", str(root), "--osv", str(db), "--fail-on", "MODERATE",
                         timeout=300).returncode == 1


def test_a_bad_osv_path_is_a_usage_error_naming_it(rootfs: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-all.zip"
    proc = run_build_env("audit", str(rootfs), "--osv", str(missing), timeout=300)
    assert proc.returncode == 2 and f"--osv {missing}" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    proc = run_build_env("audit", str(rootfs), "--osv", str(tmp_path), "--fail-on", "SEVERE",
                         timeout=300)
    assert proc.returncode == 2 and "--fail-on" in proc.stderr
