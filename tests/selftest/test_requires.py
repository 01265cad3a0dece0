"""The gate's requirement check (builder/selftest/phases/requires.py, issue 31 item 1) on real
dist-info directories read by importlib.metadata: every installed distribution's requirements
hold, and the manifest's reviewed override is the only accepted exception."""

from __future__ import annotations

from pathlib import Path

from builder.selftest.phases import requires

OVERRIDE = {"transformers": {"version": "5.9.0", "reason": "sglang pins 5.6.0; verl excludes it"}}


def _dist(site: Path, name: str, version: str, *reqs: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
             *(f"Requires-Dist: {r}" for r in reqs)]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


def _site(tmp_path: Path, transformers: str = "5.9.0", extra: tuple[str, ...] = ()) -> Path:
    site = tmp_path / "site"
    _dist(site, "transformers", transformers)
    _dist(site, "sglang", "0.5.12", "transformers==5.6.0", "torch==2.11.0",
          'flashinfer-python==0.6.11.post1; extra == "never"', *extra)
    _dist(site, "verl", "0.9.1", "transformers!=5.6.0,<5.11,>=5.5.3")
    _dist(site, "torch", "2.11.0")
    return site


def test_the_override_is_the_one_accepted_conflict(tmp_path: Path) -> None:
    c = requires.check({"overrides": OVERRIDE}, [str(_site(tmp_path))])
    assert c.status == "pass", c.reason
    assert c.id == "versions.requires" and c.value == 0
    assert ("accepted: sglang 0.5.12 requires transformers==5.6.0, 5.9.0 installed (replaced by "
            "the reviewed override transformers==5.9.0)") in c.reason


def test_without_the_override_the_same_image_fails(tmp_path: Path) -> None:
    c = requires.check({}, [str(_site(tmp_path))])
    assert c.status == "fail"
    assert c.reason == "sglang 0.5.12 requires transformers==5.6.0, 5.9.0 installed"


def test_any_other_unmet_requirement_still_fails(tmp_path: Path) -> None:
    site = _site(tmp_path, extra=("sglang-kernel==0.4.2.post2", "torch>=2.12"))
    c = requires.check({"overrides": OVERRIDE}, [str(site)])
    assert c.status == "fail" and c.value == 2
    assert "sglang 0.5.12 requires sglang-kernel==0.4.2.post2, not installed" in c.reason
    assert "sglang 0.5.12 requires torch>=2.12, 2.11.0 installed" in c.reason
    assert "transformers==5.6.0" not in c.reason


def test_the_override_must_be_what_is_installed(tmp_path: Path) -> None:
    """An image holding another transformers than the reviewed one fails, even where the
    requirement it breaks is the overridden one."""
    c = requires.check({"overrides": OVERRIDE}, [str(_site(tmp_path, transformers="5.8.0"))])
    assert c.status == "fail"
    assert "the reviewed override transformers==5.9.0 is not what is installed (5.8.0)" in c.reason
    assert "sglang 0.5.12 requires transformers==5.6.0, 5.8.0 installed" in c.reason


def _versions_checks(manifest: dict, site: Path, monkeypatch) -> dict:
    from builder.selftest.phases import versions
    from builder.selftest.phase import Run

    # the versions phase reads this interpreter's distributions: point it at the test site
    real = requires.installed_dists
    monkeypatch.setattr(requires, "installed_dists", lambda path=None: real([str(site)]))
    run = Run(ctx={"manifest": manifest})
    return {s.id: (lambda s=s: s.fn(run)) for s in versions.plan(run)}


def test_the_versions_phase_runs_the_check_when_the_manifest_has_overrides(
        tmp_path: Path, monkeypatch) -> None:
    steps = _versions_checks({"overrides": OVERRIDE, "pins": {}}, _site(tmp_path), monkeypatch)
    assert "versions.requires" in steps
    c = steps["versions.requires"]()
    assert c.status == "pass" and "replaced by the reviewed override" in c.reason


def test_the_versions_phase_fails_an_unmet_requirement_beside_the_override(
        tmp_path: Path, monkeypatch) -> None:
    site = _site(tmp_path, extra=("torch>=2.12",))
    steps = _versions_checks({"overrides": OVERRIDE, "pins": {}}, site, monkeypatch)
    c = steps["versions.requires"]()
    assert c.status == "fail" and "sglang 0.5.12 requires torch>=2.12" in c.reason


def test_without_overrides_the_versions_phase_has_no_requires_check(
        tmp_path: Path, monkeypatch) -> None:
    assert "versions.requires" not in _versions_checks({"pins": {}}, _site(tmp_path),
                                                       monkeypatch)
