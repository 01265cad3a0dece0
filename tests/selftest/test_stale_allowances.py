"""Stale allowances (issue 37): at gate time each ``abi_allow`` / ``coverage_allow`` entry must
excuse a file that would fail without it; one that excuses nothing in this image is reported
(``abi.allowances``, ``coverage.allowances``: a warning, a failure under ``--strict``). Synthetic
file lists: the decisions are pure; one run of the whole ABI phase on objects compiled here."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.selftest.elf.devcompat import NATIVE, NONE, Decision
from builder.selftest.phases import abi, coverage
from builder.selftest.report import FAIL, PASS, WARN

from . import abifixture as fx
from .helpers import catalog_manifest

WHY = "needs the system libheif.so.1, which the image does not ship"


def _obj(path: str, broken: bool) -> abi.ObjectResult:
    r = abi.ObjectResult(path.split("/")[0], path)
    if broken:
        r.problems.append(abi.Problem(path, "missing", "libheif.so.1"))
    return r


# ----------------------------------------------------------------------------------- abi


def test_an_abi_allowance_that_excuses_nothing_is_stale() -> None:
    results = [_obj("tc/libheic.so", True), _obj("tc/libok.so", False)]
    allow = {"tc/libheic.so": WHY, "tc/libok.so": WHY, "tc/libgone*.so": WHY}
    c = abi.decide_allowances(results, allow, strict=False)
    assert c is not None and c.id == "abi.allowances" and c.status == WARN
    # a file that loads is not excused by naming it, nor is a file the image does not have
    assert c.value["stale"] == ["tc/libgone*.so", "tc/libok.so"]
    assert "stale abi_allow: tc/libgone*.so, tc/libok.so excuse no object" in c.reason


def test_under_strict_a_stale_abi_allowance_fails() -> None:
    c = abi.decide_allowances([_obj("tc/libok.so", False)], {"tc/libok.so": WHY}, strict=True)
    assert c is not None and c.status == FAIL and "(--strict)" in c.reason


def test_abi_allowances_that_each_excuse_a_failure_pass() -> None:
    results = [_obj("tc/libheic.so", True), _obj("tc/libheif2.so", True)]
    c = abi.decide_allowances(results, {"tc/libheic.so": WHY, "tc/libheif?.so": WHY},
                              strict=True)
    assert c is not None and c.status == PASS and c.value["stale"] == []
    assert abi.decide_allowances(results, {}, strict=True) is None


def test_a_wildcard_does_not_reach_into_a_subdirectory() -> None:
    """Before anchoring, fnmatch's '*' crossed '/': 'tc/*heic.so' excused tc/sub/libheic.so."""
    assert abi.allowance("tc/sub/libheic.so", {"tc/*heic.so": WHY}) is None
    c = abi.decide_allowances([_obj("tc/sub/libheic.so", True)], {"tc/*heic.so": WHY}, False)
    assert c is not None and c.value["stale"] == ["tc/*heic.so"]


@pytest.mark.skipif(fx.compilers() is not None, reason=str(fx.compilers()))
def test_the_abi_phase_reports_a_stale_allowance(tmp_path: Path) -> None:
    objs = fx.build_loading(tmp_path / "objs")
    root = fx.loading_site(objs, tmp_path, {"tc": {"tc/libheic.so": "needs_absent"}})
    allow = {"tc/libheic.so": WHY, "tc/libgone.so": WHY}
    for strict, status in ((False, WARN), (True, FAIL)):
        run = abi.Run({"manifest": {"accelerator": "cuda", "abi_allow": allow,
                                    "abi_loader": catalog_manifest()["abi_loader"]},
                       "options": {"strict": strict}})
        checks = {c.id: c for c in abi.check_abi(run, [str(root)])}
        assert checks["abi.tc"].status == PASS
        assert checks["abi.allowances"].status == status
        assert checks["abi.allowances"].value["stale"] == ["tc/libgone.so"]


# ------------------------------------------------------------------------------ coverage


def _lib(path: str, runs_on: dict[str, str]) -> coverage.Library:
    lib = coverage.Library(path.split("/")[0], path, ["sm_90a"])
    lib.decisions = {g: Decision(s, "sm_90a") for g, s in runs_on.items()}
    return lib


def test_a_coverage_allowance_that_excuses_nothing_is_stale() -> None:
    gpus = ["sm_80", "sm_90"]
    libs = [_lib("vllm/_flashmla_C.abi3.so", {"sm_80": NONE, "sm_90": NATIVE}),
            _lib("vllm/_C.abi3.so", {"sm_80": NATIVE, "sm_90": NATIVE})]
    allow = {"vllm/_flashmla_C*.so": WHY, "vllm/_C*.so": WHY}
    c = coverage.decide_allowances(libs, gpus, allow, strict=False)
    assert c is not None and c.id == "coverage.allowances" and c.status == WARN
    assert c.value["stale"] == ["vllm/_C*.so"]
    assert "stale coverage_allow: vllm/_C*.so excuses no library" in c.reason
    strict = coverage.decide_allowances(libs, gpus, allow, strict=True)
    assert strict is not None and strict.status == FAIL
    ok = coverage.decide_allowances(libs, gpus, {"vllm/_flashmla_C*.so": WHY}, strict=True)
    assert ok is not None and ok.status == PASS


def test_the_coverage_phase_reports_it_beside_the_distributions(monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    libs = [_lib("vllm/_flashmla_C.abi3.so", {"sm_80": NONE, "sm_90": NATIVE})]
    monkeypatch.setattr(coverage, "scan", lambda roots, acc, gpus: (libs, 1))
    run = coverage.Run({"manifest": {"accelerator": "cuda", "gpus": ["sm_80", "sm_90"],
                                     "coverage_allow": {"vllm/_flashmla_C*.so": WHY,
                                                        "vllm/_gone*.so": WHY}},
                        "options": {"strict": True}})
    checks = {c.id: c for c in coverage.check_coverage(run, ["/nonexistent"])}
    assert checks["coverage.vllm"].status == PASS
    assert checks["coverage.allowances"].status == FAIL
    assert checks["coverage.allowances"].value["stale"] == ["vllm/_gone*.so"]
