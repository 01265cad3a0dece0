"""What the gate runs of a package is the package's catalogue entry (``checks``), not self-test
code: the build bakes it into the manifest, the cpu phase runs it, a check whose code is not
Python is refused with the catalogue's file, line and key. The tensordict modules here are real
files on a real sys.path (with their dist-info, so the check reads their version) behaving as
tensordict < 0.4, as a wrong build, and as a right one; torch is a stand-in module with the one
function the check calls. The real tensordict runs it in tests/selftest/test_real_cpu.py."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from builder import catalog, shipped
from builder.errors import CatalogError
from builder.matrix.spec import load_matrix
from builder.render.baked import manifest
from builder.selftest.manifest import PAYLOAD_CHECKS, ManifestError, parse_manifest
from builder.selftest.phase import Run
from builder.selftest.phases import cpu

REPO = Path(__file__).resolve().parents[2]
OLD = ('    def __contains__(self, key):\n        raise NotImplementedError("TensorDict does not '
       'support membership checks with the `in` keyword")\n')
WRONG = "    def __contains__(self, key):\n        return True\n"
RIGHT = "    def __contains__(self, key):\n        return key in self.d\n"


def test_every_shipped_target_bakes_the_catalogues_check() -> None:
    entry = catalog.shipped().get("tensordict").checks["membership"]
    for t in load_matrix(REPO / "matrix.yaml").targets.values():
        baked = manifest(t, "m", "l")  # "checks" always: its absence means an older image
        assert baked["checks"] == {"tensordict": {"membership": dict(entry)}}, t.name
        assert parse_manifest(baked)["checks"] == baked["checks"]


def _tensordict(root: Path, version: str, contains: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = root / "tensordict"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        f"__version__ = {version!r}\n\nclass TensorDict:\n"
        "    def __init__(self, d, batch_size):\n        self.d = dict(d)\n\n" + contains)
    meta = root / f"tensordict-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensordict\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "tensordict", raising=False)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(zeros=lambda n: [0.0] * n))


@pytest.mark.parametrize("version, contains, status, reason", [
    ("0.3.2", OLD, "fail", "NotImplementedError: TensorDict does not support membership checks "
                           "with the `in` keyword"),
    ("0.9.0", WRONG, "fail", 'wrong membership: "a" in td -> True, "b" in td -> True'),
    ("0.10.0", RIGHT, "pass", '"a" in td and "b" not in td'),
])
def test_the_cpu_phase_runs_the_catalogues_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                version: str, contains: str, status: str,
                                                reason: str) -> None:
    _tensordict(tmp_path, version, contains, monkeypatch)
    checks = catalog.shipped().checks(["tensordict", "torch"])
    run = Run(ctx={"manifest": {"checks": checks}, "options": {}})
    steps = [s for s in cpu.plan(run) if s.id == "cpu.tensordict_membership"]
    assert len(steps) == 1
    got = steps[0].fn(run)
    assert (got.status, got.reason, got.value) == (status, reason, version)


def test_a_package_the_image_lacks_fails_its_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensordict", None)  # its import raises ImportError
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(zeros=lambda n: [0.0] * n))
    run = Run(ctx={"manifest": {"checks": catalog.shipped().checks(["tensordict"])},
                   "options": {}})
    got = cpu.plan(run)[0].fn(run)
    # ModuleNotFoundError from Python 3.12 on, ImportError before
    assert got.status == "fail" and got.reason.endswith(
        "Error: import of tensordict halted; None in sys.modules"), got.reason


def test_the_manifests_checks_are_taken_as_they_are_even_empty(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A manifest with ``checks`` (even ``{}``) is all the phase runs; one without the key (an
    image built before the checks travelled with it, or not by verl-env) gets those of the
    catalogue's copy shipped in the self-test's payload, for the distributions it declares."""
    payload = tmp_path / PAYLOAD_CHECKS
    payload.write_bytes(dict(shipped.selftest_files())[PAYLOAD_CHECKS])
    monkeypatch.setattr(cpu, "PAYLOAD_CHECKS", str(payload))

    def ids(manifest: dict) -> list[str]:
        run = Run(ctx={"manifest": manifest, "options": {}})
        return [s.id for s in cpu.plan(run) if s.id.startswith("cpu.") and "gloo" not in s.id]

    assert ids({"pins": {"tensordict": "0.10.0"}, "checks": {}}) == []
    assert ids({"pins": {"tensordict": "0.10.0"}}) == ["cpu.tensordict_membership"]
    assert ids({"pins": {"verl": "0.9.1"}}) == []
    monkeypatch.setattr(cpu, "PAYLOAD_CHECKS", str(tmp_path / "none.json"))  # a source tree
    assert ids({"pins": {"tensordict": "0.10.0"}}) == []


def test_the_payload_carries_the_catalogues_checks() -> None:
    files = dict(shipped.selftest_files())
    cat = catalog.shipped()
    assert json.loads(files[PAYLOAD_CHECKS]) == cat.checks(cat.distributions)
    assert "tensordict" in json.loads(files[PAYLOAD_CHECKS])


def test_a_sites_check_that_is_not_python_names_file_line_key(tmp_path: Path) -> None:
    (tmp_path / "catalog.yaml").write_text(
        "schema: 1\ndistributions:\n  mykern:\n    import: mykern\n    checks:\n"
        "      adds:\n        code: 'assert mykern.add(1, 2) == 3 +'\n        pass: adds\n")
    with pytest.raises(CatalogError) as err:
        catalog.load(tmp_path)
    assert str(err.value).startswith(
        f"{tmp_path / 'catalog.yaml'}:7: distributions.mykern.checks.adds.code: not Python: "
        "invalid syntax (line 1 of the code)")


def test_a_manifest_with_malformed_checks_is_refused() -> None:
    with pytest.raises(ManifestError, match="'checks' must map distributions to named checks"):
        parse_manifest({"accelerator": "cpu", "checks": {"tensordict": {"membership": "x"}}})
