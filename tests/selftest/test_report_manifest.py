"""Pure logic: records, verdict, exit codes, table; manifest, pins, GPU expectation."""

from __future__ import annotations

import json

import pytest

from builder.selftest import manifest as mf
from builder.selftest import report as rp
from builder.selftest.report import FAIL, PASS, SKIP, WARN, Check


def chk(status: str, required: bool = True, applies: bool = True, cid: str = "x.y") -> Check:
    return Check(cid, "x", status, required=required, applies=applies)


class TestVerdict:
    def test_all_pass_and_warn_is_pass(self) -> None:
        assert rp.verdict([chk(PASS), chk(WARN)]) == "pass"

    def test_any_fail_is_fail_even_with_required_skip(self) -> None:
        assert rp.verdict([chk(PASS), chk(SKIP), chk(FAIL)]) == "fail"

    def test_required_skip_is_incomplete_never_pass(self) -> None:
        assert rp.verdict([chk(PASS), chk(SKIP, required=True)]) == "incomplete"

    def test_optional_skip_is_pass(self) -> None:
        assert rp.verdict([chk(PASS), chk(SKIP, required=False)]) == "pass"

    def test_nothing_ran_is_incomplete(self) -> None:
        assert rp.verdict([]) == "incomplete"

    def test_strict_promotes_applicable_skips(self) -> None:
        checks = [chk(PASS), chk(SKIP, required=False, applies=True)]
        assert rp.verdict(rp.apply_strict(checks, False)) == "pass"
        assert rp.verdict(rp.apply_strict(checks, True)) == "incomplete"

    def test_strict_ignores_checks_that_do_not_apply(self) -> None:
        checks = [chk(PASS), chk(SKIP, required=False, applies=False)]
        assert rp.verdict(rp.apply_strict(checks, True)) == "pass"

    def test_worst_and_exit_codes(self) -> None:
        assert rp.worst(["pass", "incomplete", "pass"]) == "incomplete"
        assert rp.worst(["incomplete", "fail"]) == "fail"
        assert [rp.exit_code(v) for v in ("pass", "fail", "incomplete")] == [0, 1, 2]
        assert rp.EXIT_ERROR == 3


class TestRecords:
    def test_bad_status_rejected(self) -> None:
        with pytest.raises(ValueError):
            Check("a", "b", "ok")

    def test_report_record_has_exactly_the_contract_fields(self) -> None:
        d = Check("a.b", "a", PASS, value=float("nan"), duration_s=0.12345).to_dict()
        assert tuple(d) == rp.REPORT_FIELDS
        assert d["value"] is None and d["duration_s"] == 0.123
        assert "applies" in Check("a", "a", PASS).to_dict(internal=True)

    def test_roundtrip(self) -> None:
        c = Check("a", "p", WARN, required=False, value=[1, 2], unit="x",
                  threshold=rp.threshold(">=", 1, "why"), reason="r", applies=False)
        assert Check.from_dict(c.to_dict(internal=True)) == c

    def test_build_report_schema(self) -> None:
        meta = rp.ReportMeta(started="t", duration_s=1.0, host="h")
        r = rp.build_report(meta, [chk(PASS), chk(SKIP, required=False)], "pass")
        assert r["schema"] == "verl-env/selftest/v1"
        for key in ("started", "duration_s", "host", "launcher", "world_size", "hosts",
                    "transport", "platform", "versions", "checks", "summary", "overall"):
            assert key in r
        assert r["summary"] == {"pass": 1, "fail": 0, "warn": 0, "skip": 1}
        json.dumps(r)

    def test_table_is_compact_and_marks_required(self) -> None:
        text = rp.render_table([chk(PASS, cid="imports.torch"),
                                Check("gpu.kernel", "gpu", SKIP, required=False,
                                      reason="no GPU visible (build host)" * 5)], "pass", 1.0,
                               width=100)
        lines = text.splitlines()
        assert lines[1].startswith("PASS   * imports.torch")
        assert lines[2].startswith("SKIP     gpu.kernel")
        assert all(len(line) <= 100 for line in lines[:-1])
        assert lines[-1].startswith("overall: PASS (1 pass, 0 warn, 0 fail, 1 skip")

    def test_format_value(self) -> None:
        assert rp.format_value(None, "GB/s") == "-"
        assert rp.format_value(370.123, "GB/s") == "370 GB/s"
        assert rp.format_value(["a", "b"], None) == "a,b"


class TestManifest:
    def test_normalise_names(self) -> None:
        m = mf.parse_manifest({"accelerator": "cpu", "pins": {"Hydra_Core": "1.3.2"},
                               "imports": {"flash_attn": "flash_attn"}})
        assert m["pins"] == {"hydra-core": "1.3.2"}
        assert mf.declared(m, "flash-attn") and not mf.declared(m, "verl")

    @pytest.mark.parametrize("data, word", [
        ([], "object"), ({"accelerator": "tpu"}, "accelerator"),
        ({"accelerator": "cpu", "schema": "other/v9"}, "schema"),
        ({"accelerator": "cpu", "pins": {"torch": 2}}, "pins"),
    ])
    def test_malformed(self, data: object, word: str) -> None:
        with pytest.raises(mf.ManifestError, match=word):
            mf.parse_manifest(data)

    def test_missing_file(self, tmp_path) -> None:
        with pytest.raises(mf.ManifestError, match="not found"):
            mf.load_manifest(str(tmp_path / "nope.json"))

    @pytest.mark.parametrize("pin, installed, ok", [
        ("2.13.0", "2.13.0", True),
        ("2.13.0", "2.13.0+cpu", True),       # pin without local segment: public part
        ("2.13.0+cu130", "2.13.0+cpu", False),
        ("2.13.0+cpu", "2.13.0+cpu", True),
        ("2.13.0", "2.13.1", False),
        ("2.6", "2.6.0", False),              # textual without packaging
    ])
    def test_pin_matches_text(self, pin: str, installed: str, ok: bool) -> None:
        assert mf.pin_matches(pin, installed) is ok

    def test_pin_matches_with_packaging(self) -> None:
        version = pytest.importorskip("packaging.version")
        assert mf.pin_matches("2.6", "2.6.0+cu124", version.Version)
        assert not mf.pin_matches("2.6", "2.6.1", version.Version)


class TestExpectation:
    def test_parse(self) -> None:
        assert mf.parse_expect("auto") is None and mf.parse_expect("8") == 8
        with pytest.raises(ValueError):
            mf.parse_expect("-1")
        with pytest.raises(ValueError):
            mf.parse_expect("many")

    def test_auto_gpu_target_no_gpu_is_build_host_skip(self) -> None:
        e = mf.resolve_expectation(None, "cuda", 0)
        assert not e.expected and e.applies and e.skip_reason == "no GPU visible (build host)"

    def test_auto_gpu_target_with_gpus_is_required(self) -> None:
        e = mf.resolve_expectation(None, "rocm", 8)
        assert e.expected and e.count == 8

    def test_auto_detection_failed_stays_required(self) -> None:
        assert mf.resolve_expectation(None, "cuda", None).expected

    def test_cpu_target(self) -> None:
        e = mf.resolve_expectation(None, "cpu", 4)
        assert not e.expected and not e.applies and e.skip_reason == rp.CPU_TARGET

    def test_explicit_count(self) -> None:
        e = mf.resolve_expectation(2, "cuda", 0)
        assert e.expected and e.count == 2

    def test_explicit_zero(self) -> None:
        e = mf.resolve_expectation(0, "cuda", 8)
        assert not e.expected and e.applies and e.skip_reason == "--expect-gpus 0"

    def test_needs_detection(self) -> None:
        assert mf.needs_detection(None, "cuda") and not mf.needs_detection(None, "cpu")
        assert not mf.needs_detection(8, "rocm")

    def test_roundtrip(self) -> None:
        e = mf.resolve_expectation(None, "cuda", 0)
        assert mf.expectation_from_dict(e.to_dict()) == e


@pytest.mark.parametrize("text, size", [("1G", 2**30), ("256MiB", 256 * 2**20), ("4096", 4096),
                                        ("1.5k", 1536), ("2gb", 2 * 2**30)])
def test_parse_size(text: str, size: int) -> None:
    assert mf.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "1X", "-1G", "0"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        mf.parse_size(text)


@pytest.mark.parametrize("value, on", [(None, False), ("", False), ("0", False), ("false", False),
                                       ("1", True), ("yes", True)])
def test_truthy(value: str | None, on: bool) -> None:
    assert mf.truthy(value) is on
