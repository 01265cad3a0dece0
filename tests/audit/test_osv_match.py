"""The OSV matcher (builder.audit.osv, builder.audit.result.match) against databases the tests
make, and against the range examples of the OSV schema itself (data/osv-schema-examples.json)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from builder.audit import osv
from builder.audit import result as lib
from builder.errors import UsageError
from tests.audit.conftest import advisory, ecosystem, write_db

EXAMPLES = json.loads((Path(__file__).parent / "data" / "osv-schema-examples.json").read_text())


def _db(tmp_path: Path, *advisories: dict, form: str = "zip") -> osv.Database:
    return osv.load(write_db(tmp_path, list(advisories), form))


def _hits(db: osv.Database, **installed: str) -> list[str]:
    dists = [{"name": n, "version": v, "path": "/x"} for n, v in installed.items()]
    return [h.id for h in lib.match(dists, db)[0]]


@pytest.mark.parametrize("example", EXAMPLES["examples"], ids=lambda e: e["name"])
def test_the_osv_schema_examples(example: dict) -> None:
    entry = {"package": {"ecosystem": "PyPI", "name": "p"}, "ranges": example["ranges"]}
    for v in example["affected"]:
        assert osv.affects(entry, v), (example["says"], v)
    for v in example["unaffected"]:
        assert not osv.affects(entry, v), (example["says"], v)


def test_a_range_hit_and_a_fixed_before_installed_miss(tmp_path: Path) -> None:
    db = _db(tmp_path, advisory("GHSA-range", "requests",
                                ranges=ecosystem({"introduced": "2.0"}, {"fixed": "2.31.0"}),
                                aliases=["CVE-2023-32681"]))
    assert _hits(db, requests="2.28.1") == ["GHSA-range"]
    assert _hits(db, requests="2.31.0") == []  # fixed at the installed version
    assert _hits(db, requests="2.32.3") == []  # fixed before the installed version
    assert _hits(db, requests="1.9") == []  # before it was introduced
    hit = lib.match([{"name": "requests", "version": "2.28.1", "path": "/p"}], db)[0][0]
    assert hit.aliases == ("CVE-2023-32681",) and hit.fixed == ("2.31.0",)


def test_a_versions_list_hit_compares_pep440_versions(tmp_path: Path) -> None:
    db = _db(tmp_path, advisory("PYSEC-list", "jinja2", versions=["3.1.2", "3.1.3"]))
    assert _hits(db, jinja2="3.1.2") == ["PYSEC-list"]
    assert _hits(db, jinja2="3.1.2.0") == ["PYSEC-list"]  # the same PEP 440 version
    assert _hits(db, jinja2="3.1.4") == []


def test_last_affected_includes_that_version_only(tmp_path: Path) -> None:
    db = _db(tmp_path, advisory("GHSA-last", "pyyaml",
                                ranges=ecosystem({"introduced": "5.1"}, {"last_affected": "5.3"})))
    assert _hits(db, PyYAML="5.3") == ["GHSA-last"]
    assert _hits(db, PyYAML="5.1") == ["GHSA-last"]
    assert _hits(db, PyYAML="5.3.1") == [] and _hits(db, PyYAML="5.0") == []


def test_a_withdrawn_advisory_is_ignored(tmp_path: Path) -> None:
    db = _db(tmp_path, advisory("GHSA-gone", "urllib3", ranges=ecosystem({"introduced": "0"}),
                                withdrawn="2025-01-01T00:00:00Z"),
             advisory("GHSA-live", "urllib3", ranges=ecosystem({"introduced": "0"})))
    assert _hits(db, urllib3="1.26.0") == ["GHSA-live"]
    assert db.withdrawn == 1


def test_a_package_the_image_lacks_and_other_ecosystems_do_not_match(tmp_path: Path) -> None:
    db = _db(tmp_path, advisory("GHSA-absent", "django", ranges=ecosystem({"introduced": "0"})),
             advisory("GHSA-npm", "requests", ecosystem="npm",
                      ranges=ecosystem({"introduced": "0"})))
    assert _hits(db, requests="2.0", flask="1.0") == []


def test_names_are_normalized_pep503(tmp_path: Path) -> None:
    db = _db(tmp_path, advisory("GHSA-norm", "Typing_Extensions",
                                ranges=ecosystem({"introduced": "0"}, {"fixed": "5.0"})))
    assert _hits(db, **{"typing.extensions": "4.0"}) == ["GHSA-norm"]
    assert _hits(db, **{"typing-extensions": "4.0"}) == ["GHSA-norm"]


def test_limit_events_and_git_ranges(tmp_path: Path) -> None:
    limited = {"type": "ECOSYSTEM", "events": [{"introduced": "1.0"}, {"limit": "2.0"}]}
    entry = {"ranges": [limited, {"type": "GIT", "repo": "r", "events": [{"introduced": "0"}]}]}
    assert osv.affects(entry, "1.5") and not osv.affects(entry, "2.1")
    assert not osv.affects({"ranges": [{"type": "GIT", "events": [{"introduced": "0"}]}]}, "1")


def test_a_range_that_is_not_pep440_is_reported_unevaluated(tmp_path: Path) -> None:
    odd = ecosystem({"introduced": "0"}, {"fixed": "not.a-version!"})
    db = _db(tmp_path, advisory("GHSA-odd", "numpy", ranges=odd))
    hits, unevaluated = lib.match([{"name": "numpy", "version": "1.0", "path": "/p"}], db)
    assert hits == [] and [u["id"] for u in unevaluated] == ["GHSA-odd"]


def test_severity_from_database_specific_cvss_and_an_alias(tmp_path: Path) -> None:
    db = _db(tmp_path,
             advisory("GHSA-ds", "a", ranges=ecosystem({"introduced": "0"}),
                      database_specific={"severity": "MODERATE"}),
             advisory("GHSA-cvss", "b", ranges=ecosystem({"introduced": "0"}),
                      severity=[{"type": "CVSS_V3",
                                 "score": "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H"}]),
             advisory("PYSEC-twin", "c", ranges=ecosystem({"introduced": "0"}),
                      aliases=["GHSA-twin"]),
             advisory("GHSA-twin", "c", ranges=ecosystem({"introduced": "0"}),
                      database_specific={"severity": "HIGH"}),
             advisory("PYSEC-none", "d", ranges=ecosystem({"introduced": "0"})))
    dists = [{"name": n, "version": "1.0", "path": "/p"} for n in "abcd"]
    got = {h.id: h.severity for h in lib.match(dists, db)[0]}
    assert got == {"GHSA-ds": "MODERATE", "GHSA-cvss": "CRITICAL", "PYSEC-twin": "HIGH",
                   "GHSA-twin": "HIGH", "PYSEC-none": "UNKNOWN"}


@pytest.mark.parametrize("threshold,fails", [("LOW", 3), ("MODERATE", 3), ("HIGH", 2),
                                              ("CRITICAL", 1)])
def test_fail_on_thresholds(tmp_path: Path, threshold: str, fails: int) -> None:
    db = _db(tmp_path, *(advisory(f"GHSA-{level}", level.lower(),
                                  ranges=ecosystem({"introduced": "0"}),
                                  database_specific={"severity": level})
                         for level in ("MODERATE", "HIGH")),
             advisory("PYSEC-unknown", "unknown", ranges=ecosystem({"introduced": "0"})))
    dists = [{"name": n, "version": "1", "path": "/p"} for n in ("moderate", "high", "unknown")]
    hits, uneval = lib.match(dists, db)
    doc = lib.document({"path": "/t"}, db, dists, hits, uneval)
    assert len(lib.failing(doc, threshold)) == fails
    assert lib.failing(doc, None) == []


@pytest.mark.parametrize("form", ["zip", "directory"])
def test_both_forms_load_and_the_date_is_the_newest_modified(tmp_path: Path, form: str) -> None:
    db = _db(tmp_path, advisory("A-1", "x", modified="2025-12-31T23:59:59Z"),
             advisory("A-2", "x", modified="2026-02-01T10:00:00.123Z"),
             advisory("A-3", "y", modified="2026-01-15T00:00:00Z"), form=form)
    assert db.form == form and len(db.advisories) == 3
    assert db.newest_modified == "2026-02-01T10:00:00.123Z"
    os.utime(db.path, (1_700_000_000, 1_700_000_000))
    assert db.file_mtime == "2023-11-14T22:13:20Z"


def test_bad_databases_are_usage_errors_naming_the_path(tmp_path: Path) -> None:
    for path, says in ((tmp_path / "nope.zip", "no such file"),
                       (tmp_path / "empty", "holds no OSV advisory")):
        if path.name == "empty":
            path.mkdir()
        with pytest.raises(UsageError, match=f"--osv {path}: .*{says}"):
            osv.load(path)
    notzip = tmp_path / "all.zip"
    notzip.write_text("hello")
    with pytest.raises(UsageError, match="not an OSV zip archive"):
        osv.load(notzip)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "X.json").write_text("{")
    with pytest.raises(UsageError, match=r"X\.json: not JSON"):
        osv.load(broken)
